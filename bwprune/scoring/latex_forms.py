"""Answer text rewritten, before math-verify, into forms it parses as meant.

Each rewrite fixes a misreading of answers written the way models and the benchmarks' own
solutions write them; none changes what a correctly parsed answer means. This module rewrites
text; it neither finds nor compares answers.
"""

from __future__ import annotations

import re

# 4.5e33 -> 4.5\times10^{33}: in LaTeX `e` is Euler's number; math-verify reads 4.5e33 as 4.5*e*33.
_E_NOTATION = re.compile(r"(\d)e([-+]?\d+)")
# "-1./3" -> "-1/3": a decimal point with no digits after it (Minerva golds carry a few).
_BARE_POINT = re.compile(r"(\d)\.(?=[/\s}]|$)")


def normalize_answer(text: str) -> str:
    """Rewrites that hold for every benchmark, gold and prediction alike.

    `\\%` is dropped: with the antlr 4.9 parser hydra forces on us, latex2sympy crashes on
    percentages inside a box and math-verify falls back to string comparison, so `\\boxed{18\\%}`
    never matched gold 18; dropping it gives math-verify's own intent (9% == 9 for integers).
    """
    text = text.replace("\\%", "").replace("%", "")
    text = _E_NOTATION.sub(r"\1\\times10^{\2}", text)
    return _BARE_POINT.sub(r"\1", text)
