"""GSM8K answer checking, table-driven: (completion, gold) -> correct / wrong / unscorable."""

import pytest

from bwprune.benchmarks.gsm8k import gsm8k_gold
from bwprune.scoring.math_answers import score_math, strip_think

CASES = [
    # completion, gold, expected correct (None = unscorable)
    (r"So she has \boxed{18} eggs.", "18", True),
    (r"\boxed{18}", "17", False),
    (r"First \boxed{3}, then finally \boxed{18}", "18", True),  # the last box counts
    (r"The answer is $\boxed{\frac{36}{2}}$", "18", True),
    (r"\boxed{\dfrac{1}{2}}", "0.5", True),
    (r"\boxed{1,234}", "1234", True),  # thousands separator
    (r"\boxed{\$18.00}", "18", True),
    (r"\boxed{18 \text{ dollars}}", "18", True),
    ("She earns 5 per hour, 3 hours, so 15 in total.", "15", True),  # last number fallback
    ("The total is 1,234 dollars", "1234", True),
    ("-7 degrees", "-7", True),
    ("<think>maybe 3</think> The answer is \\boxed{4}", "4", True),  # after a think block
    ("<think>maybe 3 ... still thinking", "3", None),  # unfinished think block
    ("I do not know.", "5", None),  # nothing to extract
    ("", "5", None),
    (r"\boxed{18\%}", "18", False),
]


@pytest.mark.parametrize(("completion", "gold", "expected"), CASES)
def test_score_math(completion, gold, expected):
    assert score_math(completion, gold).correct is expected


def test_unscorable_reasons():
    assert score_math("<think>x", "1").reason == "unfinished_think"
    assert score_math("nothing", "1").reason == "no_answer"
    assert score_math(r"\boxed{2}", "2").prediction == "2"


@pytest.mark.parametrize(
    ("answer", "gold"),
    [("3 + 4 = <<3+4=7>>7\n#### 7", "7"), ("#### 1,000", "1000"), ("x\n#### -3", "-3")],
)
def test_gsm8k_gold(answer, gold):
    assert gsm8k_gold(answer) == gold


def test_strip_think():
    assert strip_think("a</think>b") == "b"
    assert strip_think("<think>a") is None
    assert strip_think("plain") == "plain"


def test_last_boxed_is_brace_matched():
    from bwprune.scoring.math_answers import last_boxed

    assert last_boxed(r"\boxed{1} and \boxed{\frac{a}{b}} end") == r"\frac{a}{b}"
    assert last_boxed(r"\boxed{unclosed") is None
    assert last_boxed("none") is None
