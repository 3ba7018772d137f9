"""Eq. 2-4 on hand-made tensors."""

import math

import pytest
import torch

from bwprune.errors import UserError
from bwprune.methods.neuron_scores import (
    aggregate,
    kept_count,
    phase_score,
    topk_index,
    unit_sq,
)


def summed_sq(z, valid):
    """(B, T, D) activations of (B, T) `valid` tokens -> (B, D) per-row sums of `unit_sq`, from
    the flat valid tokens as a host hands them in."""
    rows, _ = valid.nonzero(as_tuple=True)
    return torch.zeros(z.shape[0], z.shape[-1]).index_add_(0, rows, unit_sq(z[valid]))


def eq2(z, valid):
    """Eq. 2 by hand for one row: unit-normalise tokens, L2 over tokens, divide by sqrt(T)."""
    z = z[valid]
    zbar = z / z.norm(dim=-1, keepdim=True)
    return zbar.norm(dim=0) / math.sqrt(len(z))


def test_eq2_on_a_hand_computed_tensor():
    z = torch.tensor([[[3.0, 4.0, 0.0], [0.0, 0.0, 2.0]]])  # one row, two tokens
    valid = torch.tensor([[True, True]])
    s = phase_score(summed_sq(z, valid), valid.sum(1))
    # tokens normalise to (0.6, 0.8, 0) and (0, 0, 1); RMS over 2 tokens
    expected = torch.tensor([[0.6 / math.sqrt(2), 0.8 / math.sqrt(2), 1 / math.sqrt(2)]])
    torch.testing.assert_close(s, expected)


def test_padding_and_length_do_not_change_scores():
    torch.manual_seed(0)
    z = torch.randn(2, 5, 8)
    valid = torch.tensor([[False, False, True, True, True], [True] * 5])
    s = phase_score(summed_sq(z, valid), valid.sum(1))
    torch.testing.assert_close(s[0], eq2(z[0], valid[0]))
    torch.testing.assert_close(s[1], eq2(z[1], valid[1]))
    z2 = z.clone()
    z2[0, :2] = 1e6  # garbage under padding
    torch.testing.assert_close(phase_score(summed_sq(z2, valid), valid.sum(1)), s)
    doubled = torch.cat([z[1:], z[1:]], dim=1)  # same tokens twice: same score (1/sqrt(T))
    ones = torch.ones(1, 10, dtype=torch.bool)
    torch.testing.assert_close(phase_score(summed_sq(doubled, ones), ones.sum(1))[0], s[1])


def test_aggregate_max_dominates_rows_and_ignores_empty_rows():
    scores = torch.rand(4, 16)
    rows = torch.tensor([True, True, False, True])
    agg = aggregate(scores, rows, "max")
    assert torch.all(agg >= scores[rows]).item()
    assert torch.equal(agg, scores[rows].amax(0))
    torch.testing.assert_close(aggregate(scores, rows, "mean"), scores[rows].mean(0))
    with pytest.raises(UserError, match=r"aggregate='median'.*'max', 'mean'"):
        aggregate(scores, rows, "median")


@pytest.mark.parametrize(
    ("d_ff", "rho", "rule", "k"),
    [(1536, 0.5, "floor", 768), (10, 0.35, "floor", 6), (10, 0.35, "round", 6),
     (10, 0.25, "floor", 7), (10, 0.25, "round", 8), (10, 0.0, "floor", 10), (3, 0.99, "floor", 1)],
)  # fmt: skip
def test_kept_count(d_ff, rho, rule, k):
    assert kept_count(d_ff, rho, rule) == k


def test_topk_index_is_exact_most_important_first():
    scores = torch.tensor([0.1, 0.9, 0.5, 0.7, 0.2])
    assert topk_index(scores, 3).tolist() == [1, 3, 2]
