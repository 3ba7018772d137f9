"""Scoring of math answers: a pure function of (completion, gold), so finished runs can be rescored.

Extraction and equivalence are math-verify's (huggingface/Math-Verify), as recommended in
shared/research/baselines.md §6.6: the prediction's last `\\boxed{}` is preferred, falling back to
the last LaTeX or plain-number expression. Only the LAST box is read (math-verify alone would merge
several boxes into a set); equivalence is `verify(gold, pred)`, gold first.
Gold answers are either plain numbers (GSM8K, AMC23: read as expressions) or LaTeX without
delimiters (MATH-500's `answer`, Minerva's boxed solution: read as the content of a `\\boxed{}`).
A completion with nothing to extract, or whose think block never closed, is unscorable
(`correct=None`), never silently wrong.
"""

from __future__ import annotations

import re
import threading

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from bwprune.scoring.common import NO_ANSWER, UNFINISHED_THINK, Score, strip_think

PRED_CONFIG = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())
GOLD_NUMBER_CONFIG = (ExprExtractionConfig(),)
GOLD_LATEX_CONFIG = PRED_CONFIG
TIMEOUT_S = 5

# 4.5e33 -> 4.5\times10^{33}: in LaTeX `e` is Euler's number; math-verify reads 4.5e33 as 4.5*e*33.
_E_NOTATION = re.compile(r"(\d)e([-+]?\d+)")
# "-1./3" -> "-1/3": a decimal point with no digits after it (Minerva golds carry a few).
_BARE_POINT = re.compile(r"(\d)\.(?=[/\s}]|$)")


def _timeout() -> int | None:
    # math-verify's time-outs use SIGALRM, which only works in the main thread; elsewhere (a
    # tracker thread, a notebook executor) they are off rather than crashing.
    return TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def last_boxed(text: str) -> str | None:
    """The brace-matched content of the last `\\boxed{...}` (or `\\fbox{...}`); None if none."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start)
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None  # an unclosed box: fall back to the whole text


def normalize_answer(text: str) -> str:
    """Answer text rewritten into forms math-verify parses as meant (gold and prediction alike).

    `\\%` is dropped: with the antlr 4.9 parser hydra forces on us, latex2sympy crashes on
    percentages inside a box and math-verify falls back to string comparison, so `\\boxed{18\\%}`
    never matched gold 18; dropping it gives math-verify's own intent (9% == 9 for integers).
    """
    text = text.replace("\\%", "").replace("%", "")
    return _BARE_POINT.sub(r"\1", _E_NOTATION.sub(r"\1\\times10^{\2}", text))


def score_math(
    completion: str, gold: str, latex_gold: bool = False, think_open: bool = False
) -> Score:
    """Score a completion against a gold answer: a number, or LaTeX when `latex_gold`."""
    answer = strip_think(completion, think_open)
    if answer is None:
        return UNFINISHED_THINK
    timeout = _timeout()
    boxed = last_boxed(answer)
    target = normalize_answer(f"\\boxed{{{boxed}}}" if boxed is not None else answer)
    pred = parse(target, extraction_config=PRED_CONFIG, parsing_timeout=timeout)
    if not pred:
        return NO_ANSWER
    if latex_gold:
        boxed_gold = f"\\boxed{{{normalize_answer(gold)}}}"
        gold_parsed = parse(boxed_gold, GOLD_LATEX_CONFIG, parsing_timeout=timeout)
    else:
        gold_parsed = parse(gold, GOLD_NUMBER_CONFIG, parsing_timeout=timeout)
    correct = bool(verify(gold_parsed, pred, timeout_seconds=timeout))
    return Score(correct, str(pred[-1]), "ok")
