"""GPQA letter extraction, table-driven: the last strict `Answer: X` or `\\boxed{X}`."""

import pytest

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
    ("The answer is C", None),  # not the asked-for format: unscorable, never guessed
    ("I think (C) is right", None),
    ("C", None),
    ("Answer: E", None),  # not a choice
    ("Answer: Cytochrome c", None),  # a word, not a letter
    ("", None),  # nothing to extract
]


@pytest.mark.parametrize(("completion", "expected"), CASES)
def test_gpqa_scoring(completion, expected):
    assert score_choice(completion, "C", "stop").correct is expected


def test_prediction_is_the_upper_case_letter():
    assert extract_letter("answer: (b)") == "B"
    assert score_choice("Answer: c", "C", "stop").prediction == "C"
    assert score_choice("nothing", "C", "stop").reason == "no_answer"
    assert score_choice("still thinking", "C", "stop", think_open=True).reason == "unfinished_think"
