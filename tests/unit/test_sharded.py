"""Top-k under tensor parallelism (`bwprune/methods/sharded.py`): the global mode's parts, one per
rank, are exactly the unsharded `topk_index`, and the ranks' Eq. 2 normalization is the unsharded
one; per_rank keeps k in total and can differ.

The global mode runs in two real processes on a gloo group over a FileStore (no network); vLLM's
host at size 2 is tests/system/test_tensor_parallel.py.
"""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bwprune.errors import UserError
from bwprune.methods.neuron_scores import topk_index, unit_sq
from bwprune.methods.neuron_set import NeuronSetMethod
from bwprune.methods.sharded import (
    PerRank,
    per_rank_count,
    per_rank_gap,
    per_rank_kept,
    sharded_kept,
    sharded_unit_sq,
)

WORLD = 2


def _cases() -> list[tuple[torch.Tensor, int]]:
    """(D=12 scores, k): random, all tied, few distinct values (ties across the shard boundary),
    k that does not divide D, and the edges k=1 and k=D."""
    gen = torch.Generator().manual_seed(0)
    random = torch.rand(12, generator=gen)
    few = torch.randint(0, 3, (12,), generator=gen).float()
    tied = torch.ones(12)
    return [(random, 5), (tied, 5), (tied, 7), (few, 5), (few, 7), (random, 1), (few, 12)]


def _rank_parts(rank: int, folder: Path) -> None:
    """One rank: its shard of every case -> its kept local indices, saved for the parent."""
    dist.init_process_group("gloo", init_method=f"file://{folder / 'store'}", rank=rank,
                            world_size=WORLD)  # fmt: skip
    try:
        parts = []
        for scores, k in _cases():
            local = scores.chunk(WORLD)[rank].clone()
            parts.append(sharded_kept("global", local, k, rank, WORLD, group=None))
        z = torch.randn(3, 5, 12, generator=torch.Generator().manual_seed(1))
        parts.append(sharded_unit_sq(z.chunk(WORLD, dim=-1)[rank].clone(), group=None))
        torch.save(parts, folder / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_global_parts_are_exactly_the_unsharded_topk(tmp_path):
    mp.spawn(_rank_parts, args=(tmp_path,), nprocs=WORLD, join=True)
    parts = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    for i, (scores, k) in enumerate(_cases()):
        width = scores.numel() // WORLD
        union = torch.cat([parts[r][i] + r * width for r in range(WORLD)])
        assert torch.equal(union, topk_index(scores, k)), (i, union)
    z = torch.randn(3, 5, 12, generator=torch.Generator().manual_seed(1))
    gathered = torch.cat([parts[r][-1] for r in range(WORLD)], dim=-1)
    torch.testing.assert_close(gathered, unit_sq(z))  # Eq. 2's norm spans every rank's neurons


@pytest.mark.parametrize(
    ("k", "world", "counts"),
    [(7, 2, [4, 3]), (7, 4, [2, 2, 2, 1]), (8, 4, [2, 2, 2, 2]), (3, 4, [1, 1, 1, 0])],
)
def test_per_rank_keeps_exactly_k_the_first_ranks_taking_the_remainder(k, world, counts):
    scores = torch.rand(16)
    kept = [
        sharded_kept("per_rank", s, k, r, world, None) for r, s in enumerate(scores.chunk(world))
    ]
    assert [per_rank_count(k, r, world) for r in range(world)] == counts
    assert [len(kept[r]) for r in range(world)] == counts


def test_per_rank_misses_what_a_crowded_shard_needs():
    scores = torch.tensor([8.0, 7, 6, 5, 1, 2, 3, 4])  # the global top-4 all sit on rank 0
    assert topk_index(scores, 4).tolist() == [0, 1, 2, 3]
    assert per_rank_kept(scores[:4], 4, 0, 2).tolist() == [0, 1]
    assert per_rank_kept(scores[4:], 4, 1, 2).tolist() == [2, 3]  # neurons 6 and 7
    missed, lost = per_rank_gap(scores, 4, 2)
    assert missed == 0.5 and lost == pytest.approx((26 - 22) / 26)
    assert per_rank_gap(scores, 4, 1) == (0.0, 0.0)  # one rank: per_rank is global


def test_a_method_chooses_per_rank_through_its_selection():
    """`PerRank` as a method's `selection` (what vLLM's host sets at tp_select=per_rank): the
    sets each shard would keep alone, and the fraction of the global top-k each choice missed."""
    scores = torch.tensor([8.0, 7, 6, 5, 1, 2, 3, 4])
    missed: list[float] = []
    assert PerRank(2, missed.append)(scores, 4).tolist() == [0, 1, 6, 7]
    assert missed == [0.5]
    method = NeuronSetMethod()
    assert method.top(scores, 4).tolist() == [0, 1, 2, 3]  # no selection set: the global top-k
    method.selection = PerRank(2, missed.append)
    assert method.top(scores, 4).tolist() == [0, 1, 6, 7] and missed == [0.5, 0.5]


def test_bad_mode_names_the_choices():
    with pytest.raises(UserError, match=r"^tp_select='ring' is not valid; choose one of "
                                        r"\['global', 'per_rank'\]$"):  # fmt: skip
        sharded_kept("ring", torch.rand(4), 2, 0, 1, None)
