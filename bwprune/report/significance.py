"""Accuracy with its uncertainty: a Wilson interval for one run, an exact McNemar test for two.

Accuracy at 100 problems moves by several points between runs that differ only by chance, so
every accuracy a table reports carries an interval, and every comparison with dense is paired on
the same problems: only the problems on which the two disagree carry information (McNemar), which
makes the test far sharper than comparing two independent intervals. Pure functions of counts;
no torch, no files.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist


def wilson(correct: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of `correct` / `n`: unlike the normal approximation it stays
    inside [0, 1] and keeps its coverage at 0 or n correct and at the small n of a table cell."""
    if n <= 0:
        raise ValueError(f"n={n}: an interval needs at least one problem")
    if not 0 <= correct <= n:
        raise ValueError(f"correct={correct} is outside [0, n={n}]")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p, z2 = correct / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def mcnemar_exact(only_first: int, only_second: int) -> float:
    """Two-sided exact McNemar p-value: under "no difference" each discordant problem is a fair
    coin, so the count one side wins is Binomial(discordant, 1/2) (no discordant problem: 1)."""
    n, k = only_first + only_second, min(only_first, only_second)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


@dataclass(frozen=True)
class PairedComparison:
    """A method against dense on the same problems: accuracy difference (method − dense) and
    the exact McNemar p-value of the problems only one of them answered."""

    problems: int
    difference: float
    only_method: int  # problems the method answered and dense did not
    only_dense: int
    p_value: float


def paired(method: Sequence[bool], dense: Sequence[bool]) -> PairedComparison:
    """`method[i]` and `dense[i]`: whether each got problem i right (the same problems, in the
    same order)."""
    if len(method) != len(dense) or not method:
        raise ValueError(f"paired needs the same problems on both sides, got {len(method)} and "
                         f"{len(dense)}")  # fmt: skip
    only_method = sum(m and not d for m, d in zip(method, dense))
    only_dense = sum(d and not m for m, d in zip(method, dense))
    return PairedComparison(len(method), (only_method - only_dense) / len(method), only_method,
                            only_dense, mcnemar_exact(only_method, only_dense))  # fmt: skip
