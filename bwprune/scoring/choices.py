"""Scoring of multiple-choice answers (GPQA): the letter of the last answer statement, no guess.

The prompt asks for a last line `Answer: X` (simple-evals, docs/paper-notes.md#answer-checking). Two
extractions (`benchmark.letter_extraction`):
- `strict`: only the last `Answer: X` or `\\boxed{X}` in the answer part;
- `lenient`: also an answer stated in words, "The answer is C.", "The correct option is (C).",
  "Answer: Option C", "The correct answer is **C**." The GPQA authors' baseline parser reads
  "answer is (C)" (idavidrein/gpqa `baselines/run_baseline.py`, `parse_sampled_answer`), and
  lighteval, which open-r1 uses to reproduce R1's GPQA numbers, reads letters without an anchor.
Either way the LAST statement wins, and a letter only mentioned ("(A) is ruled out", "consider
option C") is never read: unlike the authors' parser, there is no bare "(X)" fallback. A reply
with no statement is unscorable and counted, not guessed (`truncated` when the token limit cut
it). math-verify is not used: its README advises against letter extraction mixed with math parsing.
"""

from __future__ import annotations

import re

from bwprune.errors import choices_error
from bwprune.scoring.common import UNFINISHED_THINK, Score, strip_think, unanswered, was_cut

LETTERS = "ABCD"

# An upper-case letter standing alone, a letter in parentheses, or a lower-case letter ending the
# line. A lower-case letter followed by more words is the article "a" ("Answer: a protein ..."),
# not a choice.
_LETTER = r"(?:\(([A-Da-d])\)|([A-D])(?![\w'])|([a-d])(?=[ \t.)$*]*$))"
# After "Answer:" (any case, markdown bold or `$` allowed around the colon).
_ANSWER = re.compile(
    rf"(?i:answer)[ \t*]*:[\s*$]*(?:\\boxed\{{)?(?:\\text(?:bf)?\{{)?{_LETTER}", re.MULTILINE
)
_BOXED = re.compile(r"\\boxed\{\s*(?:\\text(?:bf)?\{\s*)?\(?([A-Da-d])\)?\s*\}")
# "the (correct) answer/option/choice is ...", "Answer: Option C"; not "the answer is A or C".
_STATED = re.compile(
    r"(?i:\b(?:answer|option|choice)\s+(?:is|would\s+be|should\s+be|must\s+be)\b|answer[ \t*]*:)"
    rf"[\s*$:]*(?:\\boxed\{{)?(?:\\text(?:bf)?\{{)?(?:(?i:option|choice)\s+)?{_LETTER}"
    r"(?!\s*(?i:or|and|/)\s*\(?[A-D]\b)",
    re.MULTILINE,
)
EXTRACTIONS = {"strict": (_ANSWER, _BOXED), "lenient": (_ANSWER, _BOXED, _STATED)}


def check_extraction(extraction: str) -> str:
    """`extraction` if it names one of EXTRACTIONS; else a `UserError` listing them."""
    if extraction not in EXTRACTIONS:
        raise choices_error("benchmark.letter_extraction", extraction, list(EXTRACTIONS))
    return extraction


def extract_letter(text: str, extraction: str) -> str | None:
    """The upper-cased letter of the last answer statement in `text`; None if none."""
    patterns = EXTRACTIONS[check_extraction(extraction)]
    matches = [m for pattern in patterns for m in pattern.finditer(text)]
    if not matches:
        return None
    last = max(matches, key=lambda m: m.start())
    return next(g for g in last.groups() if g).upper()


def score_choice(
    completion: str, gold: str, finish_reason: str, extraction: str, think_open: bool = False
) -> Score:
    """Score a completion against the gold letter (`A`-`D`)."""
    cut = was_cut(finish_reason)
    answer = strip_think(completion, think_open)
    if answer is None:
        return UNFINISHED_THINK
    letter = extract_letter(answer, extraction)
    if letter is None:
        return unanswered(cut)
    return Score(letter == gold, letter, "ok")
