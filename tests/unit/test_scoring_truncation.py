"""No credit for text that never gave an answer: completions cut at the token limit.

A cut completion is read only where it committed to an answer (a closed box, a finished answer
cue); the last number of its reasoning is never an answer. Golds are the shipped data's: GSM8K
problem 0 (Janet's ducks, 18), problem 1 (the robe, 3), MATH-500's 14/3, AMC23's 27, GPQA letter C.
"""

import pytest

from bwprune.benchmarks.amc23 import AMC23
from bwprune.benchmarks.gsm8k import GSM8K
from bwprune.benchmarks.math500 import MATH500
from bwprune.errors import UserError
from bwprune.scoring.choices import score_choice

GSM8K_BENCH = GSM8K("gsm8k", None, "{question}")
DUCKS = "Janet's ducks lay 16 eggs. She eats 3 and bakes with 4, so she sells 16 - 3 - 4 = 9 eggs."
THINK = "<think>\nOkay, Janet has 16 eggs. 16 - 3 - 4 = 9, and 9 * 2 = 18.\n</think>\n\n"

CASES = [
    # completion, gold, finish reason, expected correct, expected reason
    (
        "It takes 2 bolts of blue and half that, so we divide 2 by 2 to get 1, and 2 + 1 = 3",
        "3",
        "length",
        None,
        "truncated",
    ),  # the case that was credited: the last number is reasoning
    (
        "It takes 2 bolts of blue and half that, so we divide 2 by 2 to get 1, and 2 + 1 = 3",
        "3",
        "stop",
        True,
        "ok",
    ),  # the same text, ended on its own: the last number is its answer
    (
        f"{DUCKS} At $2 each that is 9 * 2 = 18. So she makes \\boxed{{1",
        "18",
        "length",
        None,
        "truncated",
    ),  # cut inside the box after computing 18: an unclosed box is no answer
    (
        f"{DUCKS} \\boxed{{18}}. Wait, let me double-check: \\boxed{{1",
        "18",
        "length",
        None,
        "truncated",
    ),  # the last box opened decides, and it never closed
    (
        f"{DUCKS} She makes \\boxed{{18}} dollars.\n\nLet me double-check the eggs: 16 - 3",
        "18",
        "length",
        True,
        "ok",
    ),  # a closed box is an answer, whatever came after it
    (
        f"{DUCKS} The answer is 18.\n\nTo check, 9 eggs times $2 per egg is",
        "18",
        "length",
        True,
        "ok",
    ),  # a finished answer cue
    (f"{DUCKS} The answer is 1", "18", "length", None, "truncated"),  # the cue runs into the cut
    (f"{DUCKS}\n#### 18\n\nExplanation: 9 eggs at", "18", "length", True, "ok"),
    (f"{DUCKS}\n**Answer:** 18\n\nStep 2: Check that 9 * 2", "18", "length", True, "ok"),
    (
        f"{DUCKS}\nAnswer:\n1. First, find the eggs she sells: 16 - 3 - 4 = 9\n2. 9 * 2 = 18",
        "18",
        "length",
        None,
        "truncated",
    ),  # a numbered list after "Answer:" states no answer
    (f"{DUCKS} The answer is to multiply 9 by 2 = 18", "18", "length", None, "truncated"),
    (
        f"{THINK}She sells 9 eggs at $2 each, so she makes 9 * 2 = 18 dollars. The final",
        "18",
        "length",
        None,
        "truncated",
    ),  # a box inside the think block is not the answer either
    (
        f"{THINK}She sells 9 eggs at $2 each, so she makes $\\boxed{{18}}$ dollars. Let me",
        "18",
        "length",
        True,
        "ok",
    ),  # a box after the think block, then cut
    (
        f"<think>\n{DUCKS} 9 * 2 = 18, so \\boxed{{18}}. Hmm, but wait",
        "18",
        "length",
        None,
        "unfinished_think",
    ),
    ("I am not sure how to solve this.", "18", "stop", None, "no_answer"),
]


@pytest.mark.parametrize(("completion", "gold", "finish", "correct", "reason"), CASES)
def test_cut_completions_are_read_only_where_they_answered(
    completion, gold, finish, correct, reason
):
    score = GSM8K_BENCH.score(completion, gold, finish)
    assert (score.correct, score.reason) == (correct, reason)


def test_other_benchmarks_refuse_cut_reasoning_too():
    math500 = MATH500("math500", None, "{question}")
    cut_box = r"f(-2) = 2, f(-1) = \frac{5}{3}, f(0) = 1, so the sum is \boxed{\frac{14}{3"
    assert math500.score(cut_box, r"\frac{14}{3}", "length").reason == "truncated"
    amc = AMC23("amc23", None, "{question}")
    assert amc.score("Alicia bikes 18 mph and Beth 12, so in 1.5 hours 18 * 1.5 = 27", "27",
                     "length").reason == "truncated"  # fmt: skip
    cut_mention = score_choice("(C) looks right, but let me check (D", "C", "length", "lenient")
    assert cut_mention.reason == "truncated"
    assert score_choice("(C) looks right.", "C", "stop", "lenient").reason == "no_answer"


def test_an_unknown_finish_reason_is_refused():
    with pytest.raises(UserError, match=r"finish_reason='eos'.*\['length', 'stop'\]"):
        GSM8K_BENCH.score(r"\boxed{18}", "18", "eos")
