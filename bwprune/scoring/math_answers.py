"""Scoring of math answers: a pure function of (completion, gold, finish reason), for rescoring.

Equivalence is math-verify's (huggingface/Math-Verify, docs/paper-notes.md#answer-checking),
`verify(gold, pred)`, gold first. Where the answer is read from is answer_span.py's rule: the last
`\\boxed{}` (read alone: math-verify would merge several boxes into a set), else an answer cue's
expression, else the last expression of a completion that ended on its own. Both sides are first
rewritten into forms math-verify reads as meant (latex_forms.py).
Gold answers are either plain numbers (GSM8K, AMC23: read as expressions) or LaTeX without
delimiters (MATH-500's `answer`, Minerva's boxed solution: read as the content of a `\\boxed{}`).
A completion with no answer, cut off before one, or whose think block never closed is unscorable
(`correct=None`), never silently wrong.
"""

from __future__ import annotations

import threading

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from bwprune.scoring.answer_span import Located, locate_answer
from bwprune.scoring.common import (
    NO_ANSWER,
    UNFINISHED_THINK,
    Score,
    strip_think,
    unanswered,
    was_cut,
)
from bwprune.scoring.latex_forms import (
    choice_letter,
    is_choice,
    is_number,
    normalize_answer,
    without_units,
)

PRED_CONFIG = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())
GOLD_NUMBER_CONFIG = (ExprExtractionConfig(),)
GOLD_LATEX_CONFIG = PRED_CONFIG
TIMEOUT_S = 5


def _timeout() -> int | None:
    # math-verify's time-outs use SIGALRM, which only works in the main thread; elsewhere (a
    # tracker thread, a notebook executor) they are off rather than crashing.
    return TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def score_math(
    completion: str,
    gold: str,
    finish_reason: str,
    *,
    latex_gold: bool = False,
    units_in_answer: bool = False,
    think_open: bool = False,
) -> Score:
    """Score a completion against a gold answer: a number, or LaTeX when `latex_gold`.

    `finish_reason`: "stop" or "length" (cut at the token limit); `units_in_answer`: the
    benchmark's convention drops units after a number (Minerva).
    """
    cut = was_cut(finish_reason)
    answer = strip_think(completion, think_open)
    if answer is None:
        return UNFINISHED_THINK
    located = locate_answer(answer, cut)
    if located is None:
        return unanswered(cut)
    timeout = _timeout()
    target = _prediction_text(located, gold, units_in_answer)
    pred = parse(target, extraction_config=PRED_CONFIG, parsing_timeout=timeout)
    if not pred:
        return NO_ANSWER  # an answer was given but reads as nothing (an empty box, words)
    if latex_gold:
        boxed_gold = f"\\boxed{{{normalize_answer(gold)}}}"
        gold_parsed = parse(boxed_gold, GOLD_LATEX_CONFIG, parsing_timeout=timeout)
    else:
        gold_parsed = parse(gold, GOLD_NUMBER_CONFIG, parsing_timeout=timeout)
    correct = bool(verify(gold_parsed, pred, timeout_seconds=timeout))
    return Score(correct, str(pred[-1]), "ok")


def _prediction_text(located: Located, gold: str, units_in_answer: bool) -> str:
    """What math-verify parses: the located answer boxed, after the benchmark's rewrites."""
    if not located.exact:
        return normalize_answer(located.text)
    text = choice_letter(located.text) if is_choice(gold) else located.text
    text = normalize_answer(text)
    if units_in_answer and is_number(gold):
        text = without_units(text)
    return f"\\boxed{{{text}}}"
