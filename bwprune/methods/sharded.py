"""`ours`' top-k (Eq. 4) when tensor parallelism splits each MLP's neurons across ranks.

vLLM shards the intermediate dimension: gate/up are column-parallel and down is row-parallel, so
rank r of R holds neurons [r·D/R, (r+1)·D/R) and sees only their scores. Two ways to select:
`global` gathers every rank's scores and keeps each rank's slice of the one unsharded top-k (the
paper's set, exactly); `per_rank` keeps each shard's own top-(k/R) with no communication, and can
miss neurons that a crowded shard needed. Eq. 2 scales each token to unit norm over all D neurons,
so a rank's scores are its slice of the unsharded ones only if that norm is summed across ranks
(`sharded_unit_sq`). Pure functions of tensors and a process group: a host (bwprune/vllm) wires
them in; nothing here hooks a model or reads a config.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from bwprune.errors import choices_error
from bwprune.methods.neuron_scores import topk_index

TP_SELECT = ("global", "per_rank")


def sharded_unit_sq(local_z: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """`unit_sq` of a (..., D/R) shard of FF activations, normalized by the whole token's norm.

    One all_reduce of a float per token: with the shard's own norm, each rank would rescale its
    tokens differently and its scores would no longer be comparable with the other ranks'. Equal to
    the shard of `unit_sq` up to the rounding of the norm's sum order.
    """
    z = local_z.float()
    norm_sq = z.square().sum(dim=-1, keepdim=True)
    dist.all_reduce(norm_sq, group=group)
    return (z / norm_sq.sqrt().clamp_min(1e-12)).square()


def global_kept(
    local_scores: torch.Tensor, k: int, rank: int, world_size: int, group: dist.ProcessGroup | None
) -> torch.Tensor:
    """This rank's part of the one global top-k: sorted indices local to its shard.

    Every rank runs `topk_index` on the same gathered vector (all_gather copies bits), so ties are
    broken identically on every rank and exactly as the unsharded selection breaks them.
    """
    parts = [torch.empty_like(local_scores) for _ in range(world_size)]
    dist.all_gather(parts, local_scores.contiguous(), group=group)
    kept = topk_index(torch.cat(parts), k)
    start = rank * local_scores.numel()
    mine = (kept >= start) & (kept < start + local_scores.numel())
    return kept[mine] - start


def per_rank_count(k: int, rank: int, world_size: int) -> int:
    """k split over ranks so the total is exactly k: the first k mod R ranks keep one more."""
    return k // world_size + (1 if rank < k % world_size else 0)


def per_rank_kept(local_scores: torch.Tensor, k: int, rank: int, world_size: int) -> torch.Tensor:
    """This shard's own top-`per_rank_count` neurons, local indices; no communication."""
    return topk_index(local_scores, per_rank_count(k, rank, world_size))


def sharded_kept(
    mode: str,
    local_scores: torch.Tensor,
    k: int,
    rank: int,
    world_size: int,
    group: dist.ProcessGroup | None,
) -> torch.Tensor:
    """This rank's kept neurons (local indices) under `tp_select` = `mode` (global | per_rank)."""
    if mode == "global":
        return global_kept(local_scores, k, rank, world_size, group)
    if mode == "per_rank":
        return per_rank_kept(local_scores, k, rank, world_size)
    raise choices_error("tp_select", mode, TP_SELECT)


def per_rank_set(scores: torch.Tensor, k: int, world_size: int) -> torch.Tensor:
    """`per_rank`'s kept set of one layer, from its unsharded (D,) scores: each of `world_size`
    contiguous shards' own top `per_rank_count` (what each rank keeps, given the same scores),
    as sorted global indices."""
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
