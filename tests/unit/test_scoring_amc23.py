"""AMC23 answer checking, table-driven: gold = the float `answer` field, written as a number."""

import pytest

from bwprune.benchmarks.amc23 import AMC23, number_text

BENCH = AMC23("amc23", None, "{question}")
GOLD = number_text(27.0)  # the data file stores 27.0

CASES = [
    # completion, expected correct (None = unscorable), against gold 27
    (r"\boxed{27}", True),
    (r"\boxed{27.0}", True),
    (r"\boxed{27.00}", True),
    (r"\boxed{\frac{54}{2}}", True),  # an unsimplified fraction
    (r"\boxed{\dfrac{81}{3}}", True),
    (r"\boxed{3^3}", True),
    (r"\boxed{27 \text{ miles}}", True),  # units
    (r"\boxed{27^\circ}", True),
    (r"\boxed{27\%}", True),  # a stray percent sign: the number counts
    (r"\boxed{270\%}", False),
    (r"\boxed{26.99}", False),
    (r"\boxed{B}", False),  # AMC23 is asked without choices: a letter is wrong, not unscorable
    (r"\boxed{\textbf{(B) }27}", False),  # a choice label in the box is not stripped
    (r"First \boxed{18}, finally \boxed{27}", True),  # the last box counts
    (r"\boxed{27} ... no wait, \boxed{18}", False),
    ("They meet 27 miles from City A.", True),  # no box: the last number
    ("<think>18? no.</think> So $\\boxed{27}$", True),  # after a think block
    ("<think>18? 27? Let me", None),  # unfinished think
    ("", None),  # nothing to extract
]


@pytest.mark.parametrize(("completion", "expected"), CASES)
def test_amc23_scoring(completion, expected):
    assert BENCH.score(completion, GOLD, "stop").correct is expected


@pytest.mark.parametrize(
    ("value", "text"), [(27.0, "27"), (3159.0, "3159"), (-1.0, "-1"), (2.5, "2.5"), ("36", "36")]
)
def test_number_text(value, text):
    assert number_text(value) == text


def test_thousands_separator_against_a_large_gold():
    assert BENCH.score(r"\boxed{3,159}", number_text(3159.0), "stop").correct is True
