"""Answer rewrites before math-verify (bwprune/scoring/latex_forms.py): each turns a form
math-verify misreads into one it reads as meant, and leaves everything else as it was."""

import pytest

from bwprune.scoring.latex_forms import (
    choice_letter,
    is_choice,
    is_number,
    normalize_answer,
    without_units,
)


@pytest.mark.parametrize(
    ("text", "rewritten"),
    [
        ("4.5e33", r"4.5\times10^{33}"),  # not 4.5 * e * 33
        ("-1./3", "-1/3"),
        (r"1\,234", "1234"),
        ("12{,}000", "12000"),
        (r"32,\!348", "32348"),
        (r"90\degree", r"90^{\circ}"),
        ("90°", r"90^{\circ}"),
        (r"\boxed{18\%}", r"\boxed{18}"),
        (r"\frac{1}{3} E_{1}+E_{2}", r"\frac{1}{3} \mathcal{E}_{1}+\mathcal{E}_{2}"),
        # already read as meant: unchanged
        ("3.14", "3.14"),
        ("1,234,567", "1,234,567"),
        (r"\mathcal{E}_1", r"\mathcal{E}_1"),
        (r"\frac{x}{2}", r"\frac{x}{2}"),
    ],
)  # fmt: skip
def test_normalize_answer(text, rewritten):
    assert normalize_answer(text) == rewritten


@pytest.mark.parametrize(
    ("answer", "number"),
    [
        (r"3.5 \mu\text{m}", "3.5"),
        (r"6563 \AA", "6563"),
        ("0.49''", "0.49"),
        ("300 K", "300"),
        (r"4.5 \times 10^{33} \mathrm{erg} \, \mathrm{s}^{-1}", r"4.5 \times 10^{33}"),
        ("12", "12"),
        (r"5 \text{apples}", r"5 \text{apples}"),  # no unit: the answer stays as written
    ],
)
def test_units_after_a_number_are_dropped(answer, number):
    assert without_units(answer) == number


def test_only_a_bare_number_gold_lets_units_drop():
    """`m` would be read as metres: a symbolic gold keeps its letters (callers check is_number)."""
    assert [is_number(g) for g in ("1.6", "-7", "4.5e33", "1e-3", "-1./3")] == [True] * 5
    assert not any(is_number(g) for g in ("7.6 Z", r"\frac{37}{4} m", r"\frac{1}{2}", "x"))


def test_a_labelled_choice_is_read_as_its_letter_for_a_letter_gold():
    assert all(is_choice(g) for g in ("C", "(C)", r"\text{(C)}"))
    assert not any(is_choice(g) for g in ("CC", "F", "12"))
    labelled = ["(C) 4", r"\text{(C) } 4", r"\textbf{(C)} 4", "C) 4", "c) 4"]
    assert [choice_letter(a) for a in labelled] == ["C"] * 5
    assert choice_letter("4") == "4" and choice_letter("C") == "C"
