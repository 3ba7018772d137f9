"""Wilson intervals and exact McNemar p-values against published and independent values."""

import pytest

from bwprune.report.significance import mcnemar_exact, paired, wilson


@pytest.mark.parametrize(
    ("correct", "n", "low", "high"),
    [  # Newcombe (1998), Statistics in Medicine 17:857, Table I, method 3 (Wilson score)
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_matches_newcombes_table(correct, n, low, high):
    lo, hi = wilson(correct, n)
    assert lo == pytest.approx(low, abs=5e-5) and hi == pytest.approx(high, abs=5e-5)


def test_wilson_refuses_impossible_counts():
    with pytest.raises(ValueError, match="n=0"):
        wilson(0, 0)
    with pytest.raises(ValueError, match="correct=5"):
        wilson(5, 4)


@pytest.mark.parametrize(
    ("b", "c", "p"),
    [  # two-sided exact binomial tests at 1/2 (scipy.stats.binomtest gives the same values)
        (1, 7, 0.0703125),  # 2 * (1 + 8) / 256
        (9, 2, 0.0654296875),
        (5, 5, 1.0),
        (0, 0, 1.0),
        (0, 10, 2 / 1024),
    ],
)
def test_mcnemar_exact(b, c, p):
    assert mcnemar_exact(b, c) == pytest.approx(p, rel=1e-12)
    assert mcnemar_exact(c, b) == pytest.approx(p, rel=1e-12)  # symmetric


def test_paired_counts_only_the_discordant_problems():
    method = [True, True, False, False, True, False]
    dense = [True, False, True, True, True, False]
    comparison = paired(method, dense)
    assert (comparison.only_method, comparison.only_dense) == (1, 2)
    assert comparison.difference == pytest.approx(-1 / 6)
    assert comparison.p_value == pytest.approx(mcnemar_exact(1, 2))
    with pytest.raises(ValueError, match="same problems"):
        paired(method, dense[:-1])
