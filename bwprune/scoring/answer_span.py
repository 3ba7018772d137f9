"""Where a math completion states its answer, and whether it finished stating it.

A careful grader reads an answer only where the completion commits to one, in this order (Qwen2.5-
Math's `extract_answer` order, docs/paper-notes.md#answer-checking):
1. the last `\\boxed{}`; it must close: a box cut off by the token limit is not an answer;
2. else the expression after the last answer cue ("the answer is", "Answer:", "####": lm-eval's
   gsm8k-cot strict filter); when the token limit cut it, it must have reached a sentence end;
3. else, only if the completion ended on its own, the whole text, where math-verify takes the last
   expression (lm-eval's "flexible" last number).
A completion cut at the token limit with neither a closed box nor a finished cue gave no answer:
reading its last number credits whatever it was computing when it stopped.
This module finds text; parsing and comparing it is math_answers.py's job.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_BOX_OPENINGS = ("\\boxed{", "\\fbox{")

# "the answer is", "Answer:", "**Final Answer:**", "####", then what may precede the answer itself.
# The answer must start like an expression: a digit, sign, `$`, LaTeX, a bracket, or a single
# letter (a variable, a choice); "the answer is to divide ..." states none.
_CUE = re.compile(
    r"(?:\banswer(?:\s+is\b|\s*:)|####)(?P<gap>[\s*:]*)"
    r"(?=[-+−$\\(\[{.\d]|[A-Za-z](?![A-Za-z]))",
    re.IGNORECASE,
)
# "Answer:\n1. Find ..." opens a numbered list on the next line, not an answer.
_LIST_ITEM = re.compile(r"\d+[.)]\s")
# A sentence ends at a full stop before a space (not a decimal point), or at a line end.
_SENTENCE_END = re.compile(r"\.(?=\s|$)|\n")
# Inside a sentence, what follows the expression is commentary: "18 (9 eggs at $2 each)",
# "18 eggs", "18, since ...". LaTeX commands (`\text`) start with a backslash and are kept.
_COMMENT = re.compile(r",\s|;\s|\s\(|\s+(?=[A-Za-z]{2,}\b)")
_EQUALS = re.compile(r"(?<![<>!])=")
_MATH_DELIMITED = re.compile(r"\$+(.+?)\$+|\\\((.+?)\\\)|\\\[(.+?)\\\]")


@dataclass(frozen=True)
class Located:
    """The text to read an answer from: the answer itself (`exact`, the LaTeX of a box or of a
    cue's expression), or a passage math-verify searches for its last expression."""

    text: str
    exact: bool


def last_boxed(text: str) -> str | None:
    """The brace-matched content of the last `\\boxed{...}` (or `\\fbox{...}`); None if none, or
    if it never closed."""
    start = max(text.rfind(opening) for opening in _BOX_OPENINGS)
    if start < 0:
        return None
    i = text.index("{", start)
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


def locate_answer(answer: str, cut: bool) -> Located | None:
    """Where `answer` (a completion after its think block) states its answer; None if nowhere.

    `cut`: generation stopped at the token limit, so the text may end mid-thought.
    """
    if any(opening in answer for opening in _BOX_OPENINGS):
        boxed = last_boxed(answer)  # the last box decides, even when it never closed
        return Located(boxed, exact=True) if boxed is not None else None
    cues = list(_CUE.finditer(answer))
    if cues:
        return _cue_answer(answer, cues[-1], cut)
    return None if cut else Located(answer, exact=False)


def _cue_answer(text: str, cue: re.Match, cut: bool) -> Located | None:
    """The expression a cue introduces; None when it opens a list, or runs into the end of a text
    the token limit cut ("the answer is 1" may have been going on to "12")."""
    rest = text[cue.end() :]
    if "\n" in cue.group("gap") and _LIST_ITEM.match(rest):
        return None
    end = _SENTENCE_END.search(rest)
    sentence = rest[: end.start()] if end else rest
    delimited = _MATH_DELIMITED.match(sentence)
    comment = None if delimited else _COMMENT.search(sentence)
    if cut and not (end or delimited or comment):
        return None
    if delimited:
        expression = next(g for g in delimited.groups() if g is not None)
    else:  # a leading `$` without its closing one is a currency sign
        expression = (sentence[: comment.start()] if comment else sentence).lstrip("$")
    # "2 * 2 = 2*4 = 8": the value after the last "=" (Minerva's `normalize_final_answer`).
    expression = _EQUALS.split(expression)[-1]
    expression = expression.replace("**", "").strip(" \t*")  # markdown bold, not a product
    return Located(expression, exact=True) if expression else None
