"""GSM8K answer checking, table-driven: (completion, gold) -> correct / wrong / unscorable."""

import pytest

from bwprune.benchmarks.gsm8k import gsm8k_gold
from bwprune.scoring.common import prompt_opens_think, strip_think
from bwprune.scoring.math_answers import score_math

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
    (r"\boxed{18\%}", "18", True),  # "what percent" questions: math-verify's 9% == 9
    (r"\boxed{4e1}", "40", True),  # e-notation is a number, not 4*e*1
    (r"\boxed{18.}", "18", True),  # a bare decimal point
    # An answer cue's expression, not its commentary.
    ("The answer is **18** (9 eggs at $2 each).", "18", True),
    ("Janet sells 9 eggs. The answer is 18 (9 eggs at $2 each).", "18", True),
    ("So the answer is $18. She sells 9 eggs at $2 each.", "18", True),
    ("She uses 3 + 4 = 7 eggs, so the answer is 16 - 7 = 9 eggs, times 2.", "18", False),
    ("It takes 2 + 1 bolts, so the answer is 2 + 1 = 3 (2 blue, 1 white).", "3", True),
    ("Final Answer: The final answer is $18$. I hope it is correct.", "18", True),
    ("<think>9 * 2 = 18</think>\n\n**Final Answer:** 18 dollars", "18", True),
    (r"\boxed{1\,234}", "1234", True),  # a thin space between digit groups
]


@pytest.mark.parametrize(("completion", "gold", "expected"), CASES)
def test_score_math(completion, gold, expected):
    assert score_math(completion, gold, "stop").correct is expected


def test_unscorable_reasons():
    assert score_math("<think>x", "1", "stop").reason == "unfinished_think"
    assert score_math("nothing", "1", "stop").reason == "no_answer"
    assert score_math(r"\boxed{2}", "2", "stop").prediction == "2"


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
    # The prompt opened the think block (R1 distills): no `</think>` means still thinking.
    assert strip_think("still thinking, maybe 3", think_open=True) is None
    assert strip_think("done</think>3", think_open=True) == "3"
    assert score_math(r"\boxed{3}", "3", "stop", think_open=True).reason == "unfinished_think"


@pytest.mark.parametrize(
    ("prompt", "opens"),
    [
        ("<|User|>q<|Assistant|><think>\n", True),  # DeepSeek-R1 distill template
        ("<|im_start|>assistant\n<think>\n\n</think>\n\n", False),  # Qwen3, thinking off
        ("<|im_start|>assistant\n", False),
    ],
)
def test_prompt_opens_think(prompt, opens):
    assert prompt_opens_think(prompt) is opens


def test_scoring_off_the_main_thread_runs_without_timeouts():
    # math-verify's time-outs use SIGALRM (main thread only); elsewhere they are switched off.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        assert (
            pool.submit(score_math, r"\boxed{\frac{36}{2}}", "18", "stop").result().correct is True
        )


def test_last_boxed_is_brace_matched():
    from bwprune.scoring.answer_span import last_boxed

    assert last_boxed(r"\boxed{1} and \boxed{\frac{a}{b}} end") == r"\frac{a}{b}"
    assert last_boxed(r"\boxed{unclosed") is None
    assert last_boxed("none") is None
