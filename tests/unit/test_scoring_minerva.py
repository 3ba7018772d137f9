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
    (r"\boxed{300 K}", "300", False),  # a bare-letter unit reads as a variable (math-verify)
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
]


@pytest.mark.parametrize(("completion", "gold", "expected"), CASES)
def test_minerva_scoring(completion, gold, expected):
    assert BENCH.score(completion, gold, "stop").correct is expected


def test_minerva_gold_is_the_last_box():
    assert minerva_gold(r"s = \boxed{2} ... so \boxed{1.6} \mathrm{~cm}") == "1.6"
    assert minerva_gold(r"\boxed{np.arcsin(10/13)}") == r"\arcsin(10/13)"
    with pytest.raises(UserError, match="without a"):
        minerva_gold("no box here")
