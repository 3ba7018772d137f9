"""Answer text rewritten, before math-verify, into forms it parses as meant.

Each rewrite fixes a misreading seen on answers written the way models and the benchmarks' own
solutions write them; none changes what a correctly parsed answer means. Two apply
only where a benchmark's convention allows them: units are dropped from an answer whose gold is a
bare number (Minerva's normalization strips units: lm-eval `minerva_math/utils.py`
`normalize_final_answer`), and a choice label is read as its letter when the gold is a letter
(MATH-500's `\\text{(C)}`). This module rewrites text; it neither finds nor compares answers.
"""

from __future__ import annotations

import re

# 4.5e33 -> 4.5\times10^{33}: in LaTeX `e` is Euler's number; math-verify reads 4.5e33 as 4.5*e*33.
_E_NOTATION = re.compile(r"(\d)e([-+]?\d+)")
# "-1./3" -> "-1/3": a decimal point with no digits after it (Minerva golds carry a few).
_BARE_POINT = re.compile(r"(\d)\.(?=[/\s}]|$)")
# 1\,234 / 12{,}000 / 32,\!348: a thin space or braced comma between digit groups is a thousands
# separator; math-verify reads 1\,234 as a product.
_THIN_THOUSANDS = re.compile(r"(?<=\d),?(?:\\[,!;: ]|\{,\}|~)+(?=\d{3}(?!\d))")
# `\degree` and `°` are `^{\circ}`, which math-verify already reads (90^\circ == 90).
_DEGREE = re.compile(r"\\degree\b|°")
# latex2sympy reserves E (scientific notation), so E_1 and E_{1} do not parse, and math-verify
# keeps only the parsable tail ("\frac{1}{3} E_{1}+\frac{2}{3} E_{2}" read as 2/3).
# \mathcal{E} parses as an ordinary symbol; math-verify folds symbol case anyway (F_1 == f_1).
_E_SUBSCRIPT = re.compile(r"(?<![\\A-Za-z])[Ee](?=_)")

# A gold that is a plain number, as the benchmarks write them: 1.6, -7, 4.5e33, 1e-3, -1./3.
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?(?:/\d+)?")
# A gold that is a choice letter: C, (C), \text{(C)}.
_CHOICE_GOLD = re.compile(r"\s*(?:\\text\{\s*)?\(?[A-E]\)?\s*\}?\s*")
# A boxed choice with its label text: "(C) 4", "\text{(C) } 4", "\textbf{(C)} 4", "C) 4".
_CHOICE_LABEL = re.compile(r"\s*(?:\\text(?:bf)?\{\s*)?\(?([A-Ea-e])\)")

# Units, as they follow the number of a Minerva answer (MIT OCW physics, astronomy, chemistry).
_UNIT_WRAPPER = re.compile(r"\\(?:text|mathrm|mbox|textrm|operatorname)\s*\{([^{}]*)\}")
_SPACING = re.compile(r"\\[,;:! ]|~")
_UNIT_NAMES = (
    "Mpc", "kpc", "pc", "AU", "au", "ly", "km", "cm", "mm", "nm", "pm", "fm", "um", "m", "Å",
    "angstroms", "Angstroms", "microns", "meters",
    "years", "year", "yr", "days", "day", "hours", "hour", "hr", "min", "ms", "ns", "us", "sec",
    "seconds", "s",
    "kg", "mg", "g", "amu", "GeV", "MeV", "keV", "eV", "kJ", "J", "ergs", "erg", "kcal", "cal",
    "MW", "kW", "W", "GHz", "MHz", "kHz", "Hz", "mV", "V", "mA", "A", "Ohm", "T", "Pa", "kPa",
    "atm", "bar", "N", "moles", "mole", "mol", "mL", "L", "M", "K", "C", "F",
    "arcseconds", "arcsecs", "arcsec", "arcmin", "degrees", "deg", "rad", "sr", "magnitudes",
    "mag", "Jy", "atoms", "photons", "dollars",
)  # fmt: skip
_UNIT_TOKEN = (
    r"(?:\\mu\s*|μ|µ)?(?:" + "|".join(re.escape(u) for u in _UNIT_NAMES) + r")(?![A-Za-z])"
    r"|\\AA|\\r\{A\}|\\mathring\{A\}|[MLR]_\{?\\odot\}?"  # ångström, solar units
    r"|\^\{?\\circ\}?|\^\{?\\prime\s*\\prime\}?|\\prime\s*\\prime|\^\{?\\prime\}?|''|\"|'"
)
_EXPONENT = r"(?:\^\{?-?\d+\}?)?"
_SEPARATOR = r"(?:\s*(?:/|\\cdot|\*)\s*|\s*)"
_UNIT_TAIL = re.compile(rf"(?<=[\d}}).])(?:{_SEPARATOR}(?:{_UNIT_TOKEN}){_EXPONENT})+\s*$")


def normalize_answer(text: str) -> str:
    """Rewrites that hold for every benchmark, gold and prediction alike.

    `\\%` is dropped: with the antlr 4.9 parser hydra forces on us, latex2sympy crashes on
    percentages inside a box and math-verify falls back to string comparison, so `\\boxed{18\\%}`
    never matched gold 18; dropping it gives math-verify's own intent (9% == 9 for integers).
    """
    text = text.replace("\\%", "").replace("%", "")
    text = _E_NOTATION.sub(r"\1\\times10^{\2}", text)
    text = _BARE_POINT.sub(r"\1", text)
    text = _THIN_THOUSANDS.sub("", text)
    text = _DEGREE.sub("^{\\\\circ}", text)
    return _E_SUBSCRIPT.sub(r"\\mathcal{E}", text)


def is_number(gold: str) -> bool:
    """True when a gold answer is a bare number, so anything after a predicted number is a unit."""
    return _NUMBER.fullmatch(gold.strip()) is not None


def without_units(answer: str) -> str:
    """`answer` without the units after its number: 3.5 \\mu\\text{m}, 6563 \\AA, 0.49'', 300 K,
    4.5 \\times 10^{33} \\mathrm{erg} \\, \\mathrm{s}^{-1} -> the number. Only for a bare-number
    gold: a symbolic gold such as `7.6 Z` or `\\frac{37}{4} m` has letters that are no unit."""
    unwrapped = _SPACING.sub(" ", _UNIT_WRAPPER.sub(r" \1", answer))
    stripped = _UNIT_TAIL.sub("", unwrapped).strip()
    return stripped if stripped != unwrapped.strip() else answer


def is_choice(gold: str) -> bool:
    """True when a gold answer is a multiple-choice letter (MATH-500 writes `\\text{(C)}`)."""
    return _CHOICE_GOLD.fullmatch(gold) is not None


def choice_letter(answer: str) -> str:
    """The letter of a choice boxed with its label text ("(C) 4", "\\text{(C) } 4" -> "C"), read
    as a letter gold is; anything else unchanged (a bare "C" already equals gold `\\text{(C)}`)."""
    label = _CHOICE_LABEL.match(answer)
    return label.group(1).upper() if label else answer
