"""Scoring of multiple-choice answers (GPQA): a strict letter pattern, never a guess.

Following simple-evals (shared/research/baselines.md §6.6), the prompt asks for a last line
`Answer: X`; the letter is read from the LAST `Answer: X` or `\\boxed{X}` in the answer part.
A letter alone, "the answer is C" or a choice's text are not read: a reply the pattern does not
match is unscorable and counted, not guessed (`truncated` when the token limit cut it).
math-verify is not used: its README advises against letter extraction mixed with math parsing.
"""

from __future__ import annotations

import re

from bwprune.scoring.common import UNFINISHED_THINK, Score, strip_think, unanswered, was_cut

LETTERS = "ABCD"

# After "Answer:" (any case, markdown bold or `$` allowed around the colon): an upper-case letter
# standing alone, a letter in parentheses, or a lower-case letter ending the line. A lower-case
# letter followed by more words is the article "a" ("Answer: a protein ..."), not a choice.
_LETTER = r"(?:\(([A-Da-d])\)|([A-D])(?![\w'])|([a-d])(?=[ \t.)$*]*$))"
_ANSWER = re.compile(
    rf"(?i:answer)[ \t*]*:[\s*$]*(?:\\boxed\{{)?(?:\\text(?:bf)?\{{)?{_LETTER}", re.MULTILINE
)
_BOXED = re.compile(r"\\boxed\{\s*(?:\\text(?:bf)?\{\s*)?\(?([A-Da-d])\)?\s*\}")


def extract_letter(text: str) -> str | None:
    """The upper-cased letter of the last `Answer: X` or `\\boxed{X}` in `text`; None if none."""
    matches = [*_ANSWER.finditer(text), *_BOXED.finditer(text)]
    if not matches:
        return None
    last = max(matches, key=lambda m: m.start())
    return next(g for g in last.groups() if g).upper()


def score_choice(completion: str, gold: str, finish_reason: str, think_open: bool = False) -> Score:
    """Score a completion against the gold letter (`A`-`D`)."""
    cut = was_cut(finish_reason)
    answer = strip_think(completion, think_open)
    if answer is None:
        return UNFINISHED_THINK
    letter = extract_letter(answer)
    if letter is None:
        return unanswered(cut)
    return Score(letter == gold, letter, "ok")
