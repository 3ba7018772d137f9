"""Top-k under tensor parallelism (`bwprune/methods/sharded.py`): per_rank keeps k in total and
can differ from the global top-k, by a gap it reports. The global mode on vLLM's ranks (each
scoring the gathered layer) is tests/system/test_tensor_parallel.py."""

import pytest
import torch

from bwprune.methods.neuron_scores import topk_index
from bwprune.methods.neuron_set import NeuronSetMethod
from bwprune.methods.sharded import PerRank, per_rank_count, per_rank_gap, per_rank_kept


@pytest.mark.parametrize(
    ("k", "world", "counts"),
    [(7, 2, [4, 3]), (7, 4, [2, 2, 2, 1]), (8, 4, [2, 2, 2, 2]), (3, 4, [1, 1, 1, 0])],
)
def test_per_rank_keeps_exactly_k_the_first_ranks_taking_the_remainder(k, world, counts):
    scores = torch.rand(16)
    kept = [per_rank_kept(s, k, r, world) for r, s in enumerate(scores.chunk(world))]
    assert [per_rank_count(k, r, world) for r in range(world)] == counts
    assert [len(kept[r]) for r in range(world)] == counts


def test_per_rank_misses_what_a_crowded_shard_needs():
    scores = torch.tensor([8.0, 7, 6, 5, 1, 2, 3, 4])  # the global top-4 all sit on rank 0
    assert topk_index(scores, 4).tolist() == [0, 1, 2, 3]
    assert per_rank_kept(scores[:4], 4, 0, 2).tolist() == [0, 1]
    assert per_rank_kept(scores[4:], 4, 1, 2).tolist() == [3, 2]  # neurons 7 and 6
    missed, lost = per_rank_gap(scores, 4, 2)
    assert missed == 0.5 and lost == pytest.approx((26 - 22) / 26)
    assert per_rank_gap(scores, 4, 1) == (0.0, 0.0)  # one rank: per_rank is global


def test_a_method_chooses_per_rank_through_its_selection():
    """`PerRank` as a method's `selection` (what vLLM's host sets at tp_select=per_rank): the
    sets each shard would keep alone, and the fraction of the global top-k each choice missed."""
    scores = torch.tensor([8.0, 7, 6, 5, 1, 2, 3, 4])
    missed: list[float] = []
    assert PerRank(2, missed.append)(scores, 4).tolist() == [0, 1, 7, 6]
    assert missed == [0.5]
    method = NeuronSetMethod()
    assert method.top(scores, 4).tolist() == [0, 1, 2, 3]  # no selection set: the global top-k
    method.selection = PerRank(2, missed.append)
    assert method.top(scores, 4).tolist() == [0, 1, 7, 6] and missed == [0.5, 0.5]
