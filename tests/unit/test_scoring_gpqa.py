"""GPQA letter extraction, table-driven: the last `Answer: X` or `\\boxed{X}` (strict), or also
an answer stated in words (lenient); a letter merely mentioned is never read."""

import pytest

from bwprune.errors import UserError
from bwprune.scoring.choices import extract_letter, score_choice

CASES = [
    # completion, expected correct (None = unscorable), against gold "C"
    ("Reasoning...\nAnswer: C", True),
    ("Answer: B", False),
    ("Answer: (C)", True),  # a letter in parentheses
    ("Answer: C) 9.0 J", True),
    ("answer: c", True),  # lower-case letters
    ("Answer: (c)", True),
    ("Answer: c.", True),
    ("Answer: a protein in the membrane", None),  # the article "a", not a choice
    ("ANSWER: C", True),
    ("Final Answer: C", True),
    ("**Answer:** C", True),  # markdown
    ("**Answer: C**", True),
    ("Answer: $C$", True),
    ("Answer: $\\boxed{C}$", True),
    ("\\boxed{C}", True),  # a boxed letter alone
    ("\\boxed{\\text{C}}", True),
    ("\\boxed{(c)}", True),
    ("Answer: A\nWait, that is wrong.\nAnswer: C", True),  # the last one counts
    ("Answer: C\nOn reflection \\boxed{A}", False),
    ("<think>Answer: A</think>Answer: C", True),  # after a think block
    ("<think>Answer: C", None),  # unfinished think
    ("The answer is C", None),  # not the asked-for format: unscorable under strict
    ("I think (C) is right", None),
    ("C", None),
    ("Answer: E", None),  # not a choice
    ("Answer: Cytochrome c", None),  # a word, not a letter
    ("", None),  # nothing to extract
]


@pytest.mark.parametrize(("completion", "expected"), CASES)
def test_strict_gpqa_scoring(completion, expected):
    assert score_choice(completion, "C", "stop", "strict").correct is expected


REASONING = (
    "<think>\nThe electron configuration rules out (A). Option B would need a triplet state; "
    "C fits the 9.0 J estimate.\n</think>\n\n"
)
# completion, expected correct (None = unscorable) under `lenient` and under `strict`, gold "C".
LENIENT_CASES = [
    (f"{REASONING}The answer is C.", True, None),
    (f"{REASONING}The correct option is (C).", True, None),
    (f"{REASONING}Answer: Option C", True, None),
    (f"{REASONING}The correct answer is **C**.", True, None),
    (f"{REASONING}The answer is: **(C)** 9.0 J", True, None),
    (f"{REASONING}So the best choice is C, the 9.0 J estimate.", True, None),
    (f"{REASONING}The answer is B.", False, None),
    (f"{REASONING}Therefore, the final answer is $\\boxed{{C}}$.", True, True),
    (
        "(A) is ruled out. If the answer were B, the state would be a triplet, so the answer is C.",
        True,
        None,
    ),  # the last statement wins
    ("The answer is B... wait, the spin is wrong. The correct answer is (C).", True, None),
    ("The answer is C.\nAnswer: B", False, False),  # the format line, last, wins
    # Mentions, not statements: never read.
    (f"{REASONING}(C) looks most plausible, and (D) is close.", None, None),
    (f"{REASONING}Consider option C and option D once more.", None, None),
    (f"{REASONING}The answer is A or C.", None, None),  # two letters: no single answer
    (f"{REASONING}The answer is not C.", None, None),
    (f"{REASONING}The answer is a protein in the membrane.", None, None),  # the article "a"
    ("<think>The answer is C.", None, None),  # a statement inside an unfinished think block
]


@pytest.mark.parametrize(("completion", "lenient", "strict"), LENIENT_CASES)
def test_lenient_gpqa_scoring(completion, lenient, strict):
    assert score_choice(completion, "C", "stop", "lenient").correct is lenient
    assert score_choice(completion, "C", "stop", "strict").correct is strict


def test_lenient_reads_the_strict_table_alike_but_for_a_statement_in_words():
    differ = [c for c, e in CASES if score_choice(c, "C", "stop", "lenient").correct is not e]
    assert differ == ["The answer is C"]


def test_an_unknown_extraction_is_refused():
    with pytest.raises(UserError, match=r"letter_extraction='loose'.*\['lenient', 'strict'\]"):
        score_choice("Answer: C", "C", "stop", "loose")


def test_prediction_is_the_upper_case_letter():
    assert extract_letter("answer: (b)", "strict") == "B"
    assert score_choice("Answer: c", "C", "stop", "strict").prediction == "C"
    assert score_choice("nothing", "C", "stop", "strict").reason == "no_answer"
    assert (
        score_choice("still thinking", "C", "stop", "strict", think_open=True).reason
        == "unfinished_think"
    )
