"""The arithmetic a completion writes down, checked: how many of its equations between numbers are
false.

Accuracy says that a pruned model answers worse, not how. On GSM8K a model that sets a problem up
as dense does but writes `13 × 2 = 22` fails on its arithmetic, which lives in the FFN neurons that
pruning drops; a model that sets it up wrongly fails on its reasoning. Counting the false equations
in the reasoning tells the two apart from the records alone (`samples.jsonl`), for any run.

An equation is two neighbouring sides of a chain `a = b = c ...` that are both plain arithmetic on
numbers (+, −, ×, ÷, ·, /, parentheses, `\\frac{p}{q}`; `\\text{...}` units and `$` dropped), at
least one of them a computation, not a bare number. A side next to a variable or another operator
(`x - 2 + 2 = 5 + 2`, `2x + 3 = 7`) is not plain and not checked, so algebra is never read as
arithmetic. An equation is false when its sides differ by more than the rounding of the number
written: `35 / 8.5 = 4` is rounding, `13 × 2 = 22` is not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from itertools import pairwise

_NUMBER = r"\d+(?:,\d{3})*(?:\.\d+)?"
_OPERATOR = r"[-+*/]"
_ATOM = rf"(?:{_NUMBER}|\(\s*{_NUMBER}(?:\s*{_OPERATOR}\s*{_NUMBER})*\s*\))"
_SIDE = rf"{_ATOM}(?:\s*{_OPERATOR}\s*{_ATOM})*"
_CHAIN = re.compile(rf"{_SIDE}(?:\s*=\s*{_SIDE})+")
# A chain must not continue a larger expression: nothing may bind to its first or last number, as a
# letter or digit does written against it (`2x`, `x2`) or an operator does on the same line (a
# markdown bullet's "- " opens a line, it does not subtract).
_BEFORE = re.compile(r"(?:[\w.^})]|\S[^\S\n]*-[^\S\n]*|[+*/^%][^\S\n]*)$")
_AFTER = re.compile(r"(?:[\w(^%{]|\.\d|[^\S\n]*[-+*/^%])")
_CONTEXT = 16  # characters either side that can bind to a chain
_SPELLED = {
    r"\\times": "*", "×": "*", r"\\cdot": "*", "·": "*", r"\\div": "/", "÷": "/", "−": "-",
    r"\\%": "%", r"\\\$": "", r"\$": "",
}  # fmt: skip
_TEXT = re.compile(r"\\(?:text|mathrm|textbf)\s*\{[^{}]*\}")
_FRAC = re.compile(rf"\\[dt]?frac\s*\{{\s*({_NUMBER})\s*\}}\s*\{{\s*({_NUMBER})\s*\}}")
_SPACING = re.compile(r"\\[,;:! ]|\\q?quad\b|\\left\b|\\right\b")
_TOKEN = re.compile(rf"{_NUMBER}|[-+*/()]")
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


@dataclass(frozen=True)
class ArithmeticCheck:
    equations: int  # equations between plain arithmetic sides that were checked
    false: int  # of those, the ones whose sides differ by more than the written rounding


def check_arithmetic(text: str) -> ArithmeticCheck:
    """Check every equation between numbers that `text` writes down (the module docstring says
    which count)."""
    text = _plain(text)
    equations = false = 0
    for chain in _CHAIN.finditer(text):
        if _continues(text, *chain.span()):
            continue
        sides = [side.strip() for side in chain.group().split("=")]
        for left, right in pairwise(sides):
            if _is_number(left) and _is_number(right):
                continue  # `= 13 = 13` restates, it computes nothing
            a, b = _evaluate(left), _evaluate(right)
            if a is None or b is None:
                continue  # a division by zero: not arithmetic a reader can check
            equations += 1
            false += abs(a - b) > _rounding(left, right)
    return ArithmeticCheck(equations, false)


def _continues(text: str, start: int, end: int) -> bool:
    """Whether `text[start:end]` is part of a larger expression that is not plain arithmetic."""
    before = text[max(0, start - _CONTEXT) : start]
    return bool(_BEFORE.search(before) or _AFTER.match(text[end : end + _CONTEXT]))


def _plain(text: str) -> str:
    """`text` with units, spacing and spelled operators removed, `\\frac{p}{q}` as `(p/q)`."""
    text = _TEXT.sub("", text)
    text = _FRAC.sub(r"(\1/\2)", text)
    text = _SPACING.sub(" ", text)
    for spelled, operator in _SPELLED.items():
        text = re.sub(spelled, operator, text)
    return text


def _is_number(side: str) -> bool:
    return re.fullmatch(_NUMBER, side) is not None


def _rounding(left: str, right: str) -> Fraction:
    """Half a unit of the last written digit of a side that is a bare number (`= 4.17`: 0.005),
    so an answer rounded as written is not false; exact when both sides compute."""
    written = [s for s in (right, left) if _is_number(s)]
    if not written:
        return Fraction(0)
    decimals = len(written[0].partition(".")[2])
    return Fraction(1, 2 * 10**decimals)


def _evaluate(side: str) -> Fraction | None:
    """The value of a plain arithmetic side, exactly, with the usual precedence; None where it
    divides by zero."""
    values: list[Fraction] = []
    operators: list[str] = []

    def apply() -> None:
        b, a, op = values.pop(), values.pop(), operators.pop()
        if op == "/" and b == 0:
            raise ZeroDivisionError
        values.append(a + b if op == "+" else a - b if op == "-" else a * b if op == "*" else a / b)

    try:
        for token in _TOKEN.findall(side):
            if token == "(":
                operators.append(token)
            elif token == ")":
                while operators[-1] != "(":
                    apply()
                operators.pop()
            elif token in _PRECEDENCE:
                while (
                    operators
                    and operators[-1] != "("
                    and (_PRECEDENCE[operators[-1]] >= _PRECEDENCE[token])
                ):
                    apply()
                operators.append(token)
            else:
                values.append(Fraction(token.replace(",", "")))
        while operators:
            apply()
    except ZeroDivisionError:
        return None
    return values[0]
