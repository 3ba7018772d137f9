"""The equations a completion writes, checked (bwprune/scoring/arithmetic.py): a false one is an
arithmetic slip; algebra, restatements and rounding as written are not."""

import pytest

from bwprune.scoring.arithmetic import check_arithmetic

CASES = {
    # (equations checked, false) for a text as the 1.5B writes it
    r"\[ 13 \text{ eggs} \times 2 \text{ dollars/egg} = 22 \text{ dollars} \]": (1, 1),
    r"\[ 16 - 3 = 13 \]": (1, 0),
    r"\text{Total} = 160 + 80 + 20 = 100": (1, 1),  # a worded side before is no side
    r"\[ 4 + 0.25 \times 4 = 4 + 1 = 5 \]": (2, 0),  # a chain: each neighbouring pair
    r"= 80,000 \times 1.50 = 150,000": (1, 1),  # thousands separators
    r"(3 + 4) * 2 = 14": (1, 0),  # precedence and parentheses
    r"\[ 9 \times \frac{2}{3} = 6 \]": (1, 0),
    r"\$18 + \$2 = \$20.": (1, 0),
    "   - 16 - 3 = 13 eggs left": (1, 0),  # a bullet's dash does not subtract
    r"\[ 35 / 8.50 = 4 \]": (1, 0),  # rounded to the digits written
    r"\[ 1 / 3 = 0.33 \]": (1, 0),
    r"\[ 1 / 3 = 0.3 \]": (1, 0),
    r"\[ 1 / 3 = 0.4 \]": (1, 1),
    r"\[ \frac{1}{3}x - 2 + 2 = 5 + 2 \]": (0, 0),  # algebra: a side bound to a variable
    "2x + 3 = 7": (0, 0),
    "3^2 + 1 = 10": (0, 0),
    r"= 20\% \times 20 = 0.20 \times 20 = 4": (0, 0),  # a chain bound to a percent is not read
    "The answer is 13 = 13.": (0, 0),  # restates, computes nothing
    "10 / 0 = 5": (0, 0),
}


@pytest.mark.parametrize("text", CASES)
def test_an_equation_between_numbers_is_checked_and_algebra_is_not(text):
    check = check_arithmetic(text)
    assert (check.equations, check.false) == CASES[text]


def test_a_completion_s_equations_add_up():
    text = "First, 12 \\times 2.74 = 32.88. Then 9 \\times 1.87 = 17.03, so 32.88 + 16.83 = 49.71."
    check = check_arithmetic(text)
    assert (check.equations, check.false) == (3, 1)
