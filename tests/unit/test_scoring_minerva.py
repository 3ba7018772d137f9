"""Minerva Math answer checking, table-driven: gold = the last box of the reference solution."""

import pytest

from bwprune.benchmarks.minerva import Minerva, minerva_gold
from bwprune.errors import UserError

BENCH = Minerva("minerva", None, "{question}")

CASES = [
    # completion, gold (as `minerva_gold` returns it), expected correct (None = unscorable)
    (r"\boxed{4.5 \times 10^{33}}", "4.5e33", True),  # e-notation golds (58 of 272)
    (r"\boxed{4.5e33}", "4.5e33", True),
    (r"\boxed{4.6 \times 10^{33}}", "4.5e33", False),
    (r"\boxed{0.001}", "1e-3", True),
    (r"\boxed{10^{-3}}", "1e-3", True),
    (r"\boxed{-\frac{1}{3}}", "-1./3", True),  # a bare decimal point in the gold
    (r"\boxed{-1.5}", "-3./2", True),
    (r"\boxed{0.0060}", "0.006", True),
    (r"\boxed{15,625}", "15625", True),  # thousands separator
    (r"\boxed{6.63 \times 10^3}", "6630", True),
    (r"\boxed{1.6} \mathrm{~cm}", "1.6", True),  # unit after the box
    (r"\boxed{1.6 \mathrm{~cm}}", "1.6", True),  # unit inside the box
    (r"\boxed{300 \mathrm{K}}", "300", True),
    (r"\boxed{300 K}", "300", True),  # a unit, as the gold is a bare number
    (r"\boxed{1538^{\circ}\mathrm{C}}", "1538", True),  # degrees Celsius
    (r"\boxed{41.8\%}", "41.8", True),  # a percentage asked for as a number
    (r"\boxed{\frac{e^t}{3}}", "e^{t} / 3", True),  # symbolic answers
    (r"\boxed{2.2\tau}", r"2.2 \tau", True),
    (r"\boxed{\ln 2 + \frac{i\pi}{3}}", r"\ln 2 + i\pi / 3", True),
    (r"\boxed{\sin^{-1}(10/13)}", minerva_gold(r"\boxed{np.arcsin(10/13)}"), True),
    (r"\boxed{2} and finally \boxed{1.6}", "1.6", True),  # the last box counts
    ("<think>it is 1.6? no, 2</think>The diameter is 1.6 cm.", "1.6", True),  # after a think
    ("<think>\\boxed{1.6}", "1.6", None),  # unfinished think
    ("No idea.", "1.6", None),
    # Units inside the box: Minerva's convention drops them after a number. Golds and
    # units are the shipped problems' (idx 24 microns, 9 Angstroms, 6 and 14 arcseconds, ...).
    (r"\boxed{50 \mu\text{m}}", "50", True),
    (r"\boxed{50\,\mu\mathrm{m}}", "50", True),
    (r"\boxed{50 μm}", "50", True),
    (r"\boxed{51 \mu\text{m}}", "50", False),  # the number is still compared
    (r"\boxed{9.6 \AA}", "9.6", True),
    (r"\boxed{9.6 \mathring{A}}", "9.6", True),
    (r"\boxed{9.6\ \text{Å}}", "9.6", True),
    (r"\boxed{0.49^{\prime\prime}}", "0.49", True),
    (r"\boxed{0.003''}", "0.003", True),
    (r"\boxed{0.49 \operatorname{arcsecs}}", "0.49", True),
    (r"\boxed{300 \mathrm{~km} / \mathrm{s}}", "300", True),
    (r"\boxed{4.5 \times 10^{33} \mathrm{ergs} \mathrm{s}^{-1}}", "4.5e33", True),
    (r"\boxed{8.64 \mathrm{~g} / \mathrm{cm}^{3}}", "8.64", True),
    (r"\boxed{928^{\circ} \mathrm{C}}", "928", True),
    (r"\boxed{7.6 Z}", "7.6 Z", True),  # a symbolic gold keeps its letters: Z is no unit
    (r"\boxed{7.6}", "7.6 Z", False),
    # E with a subscript (latex2sympy reserves E): the gold used to read as 2/3.
    (r"\boxed{\frac{1}{3}E_1 + \frac{2}{3}E_2}", r"\frac{1}{3} E_{1}+\frac{2}{3} E_{2}", True),
    (r"\boxed{\frac{E_{1} + 2E_{2}}{3}}", r"\frac{1}{3} E_{1}+\frac{2}{3} E_{2}", True),
    (r"\boxed{\frac{2}{3}}", r"\frac{1}{3} E_{1}+\frac{2}{3} E_{2}", False),
    (r"\boxed{E_1, E_2}", "E_{1},E_{2}", True),
    (r"\boxed{E_{2},E_{1}}", "E_{1},E_{2}", True),
    (r"\boxed{E_1}", "E_{1},E_{2}", False),
    (r"<think>The level is E_2? no.</think> So \boxed{E_1, E_2}", "E_{1},E_{2}", True),
]


@pytest.mark.parametrize(("completion", "gold", "expected"), CASES)
def test_minerva_scoring(completion, gold, expected):
    assert BENCH.score(completion, gold, "stop").correct is expected


def test_minerva_gold_is_the_last_box():
    assert minerva_gold(r"s = \boxed{2} ... so \boxed{1.6} \mathrm{~cm}") == "1.6"
    assert minerva_gold(r"\boxed{np.arcsin(10/13)}") == r"\arcsin(10/13)"
    with pytest.raises(UserError, match="without a"):
        minerva_gold("no box here")
