"""`ours`' top-k (Eq. 4) when tensor parallelism splits each MLP's neurons across ranks.

vLLM shards the intermediate dimension: gate/up are column-parallel and down is row-parallel, so
rank r of R holds neurons [r·D/R, (r+1)·D/R). Two ways to select (`TP_SELECT`): `global` keeps
each rank's slice of the one unsharded top-k (the paper's set, exactly; vLLM's host gathers the
activations so that every rank's method scores the whole layer, `bwprune.vllm.binding.host`);
`per_rank` keeps each shard's own top-(k/R), the choice ranks make alone, and can miss neurons that
a crowded shard needed. Pure functions of tensors: a host wires them in; nothing here hooks a model
or reads a config.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from bwprune.methods.neuron_scores import topk_index

TP_SELECT = ("global", "per_rank")


def per_rank_count(k: int, rank: int, world_size: int) -> int:
    """k split over ranks so the total is exactly k: the first k mod R ranks keep one more."""
    return k // world_size + (1 if rank < k % world_size else 0)


def per_rank_kept(local_scores: torch.Tensor, k: int, rank: int, world_size: int) -> torch.Tensor:
    """This shard's own top-`per_rank_count` neurons, local indices; no communication."""
    return topk_index(local_scores, per_rank_count(k, rank, world_size))


def per_rank_set(scores: torch.Tensor, k: int, world_size: int) -> torch.Tensor:
    """`per_rank`'s kept set of one layer, from its unsharded (D,) scores: each of `world_size`
    contiguous shards' own top `per_rank_count` (what each rank keeps, given the same scores),
    as global indices, shard by shard, each shard's most important first (`topk_index`)."""
    if scores.numel() % world_size:
        raise ValueError(f"D={scores.numel()} neurons do not split evenly over {world_size} ranks")
    width = scores.numel() // world_size
    return torch.cat([per_rank_kept(s, k, r, world_size) + r * width
                      for r, s in enumerate(scores.split(width))])  # fmt: skip


class PerRank:
    """`tp_select: per_rank` as a method's `selection` (`NeuronSetMethod.top`): the kept set
    `per_rank_set` chooses, and per choice the fraction of the global top-k it leaves out, handed
    to `missed` (its gap against `global`, measured in the run that makes it)."""

    def __init__(self, world_size: int, missed: Callable[[float], None]) -> None:
        self.world_size, self.missed = world_size, missed

    def __call__(self, scores: torch.Tensor, k: int) -> torch.Tensor:
        kept = per_rank_set(scores, k, self.world_size)
        best = topk_index(scores, k)
        self.missed((~torch.isin(best, kept)).sum().item() / k)
        return kept


def per_rank_gap(scores: torch.Tensor, k: int, world_size: int) -> tuple[float, float]:
    """What per_rank costs on one layer's unsharded (D,) scores, simulated without processes:
    (fraction of the global top-k it misses, fraction of the global top-k's score mass it loses).

    Both sets have k neurons, so the missed fraction is also the fraction of per_rank's set that
    the global one would not keep.
    """
    per_rank = per_rank_set(scores, k, world_size)
    best = topk_index(scores, k)
    missed = (~torch.isin(best, per_rank)).sum().item() / k
    mass = scores[best].sum()
    lost = ((mass - scores[per_rank].sum()) / mass.clamp_min(1e-30)).item()
    return missed, lost
