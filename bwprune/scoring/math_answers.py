"""Scoring of math answers: a pure function of (completion, gold), so finished runs can be rescored.

Extraction and equivalence are math-verify's (huggingface/Math-Verify), as recommended in
shared/research/baselines.md §6.6: the prediction's last `\\boxed{}` is preferred, falling back to
the last LaTeX or plain-number expression. Only the LAST box is read (math-verify alone would merge
several boxes into a set); equivalence is `verify(gold, pred)`, gold first.
A completion with nothing to extract, or whose think block never closed, is unscorable
(`correct=None`), never silently wrong.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

PRED_CONFIG = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())
GOLD_NUMBER_CONFIG = (ExprExtractionConfig(),)
TIMEOUT_S = 5


@dataclass(frozen=True)
class Score:
    correct: bool | None  # None: unscorable
    prediction: str | None  # the extracted answer, as text
    reason: str  # "ok" | "no_answer" | "unfinished_think"


def _timeout() -> int | None:
    # math-verify's time-outs use SIGALRM, which only works in the main thread.
    return TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def strip_think(text: str) -> str | None:
    """The answer part of a reasoning model's output; None when `<think>` never closed."""
    if "</think>" in text:
        return text.rsplit("</think>", 1)[1]
    if "<think>" in text:
        return None
    return text


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


def score_math(completion: str, gold: str, gold_config=GOLD_NUMBER_CONFIG) -> Score:
    """Score a completion against a gold answer given as text (a number or LaTeX)."""
    answer = strip_think(completion)
    if answer is None:
        return Score(None, None, "unfinished_think")
    timeout = _timeout()
    boxed = last_boxed(answer)
    target = f"\\boxed{{{boxed}}}" if boxed is not None else answer
    pred = parse(target, extraction_config=PRED_CONFIG, parsing_timeout=timeout)
    if not pred:
        return Score(None, None, "no_answer")
    gold_parsed = parse(gold, extraction_config=gold_config, parsing_timeout=timeout)
    correct = bool(verify(gold_parsed, pred, timeout_seconds=timeout))
    return Score(correct, str(pred[-1]), "ok")
