"""TriSP scores (paper B §3.2, Eq. 4–6) and adaptive allocation (AL-AM, §3 step 2; FLAP).

Units are attention KV groups and MLP neurons. Channel scores of o_proj inputs (heads; squared
first with `attn_square`, as in FLAP's code) and down_proj inputs (neurons) are z-scored, a group
scores the mean of its o_proj channels (FLAP averages a head's channels), and one global threshold
over all units of all layers, weighted by each unit's parameter cost, keeps (1 − sparsity) of the
attention+MLP parameters. Per-layer budgets therefore differ: layers whose units score low lose
more.

GQA rule: a unit is a whole KV group — one K/V head and the query heads that share it. Pruning
query heads inside a group would make the number of query heads per KV head differ between groups,
which HF attention (one `num_key_value_groups` per module) cannot run; removing whole groups keeps
that ratio, so only the weight shapes change. Every layer keeps its best KV group and its best
neuron, so no projection becomes empty (a zero-head attention cannot be reshaped).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from bwprune.models.adapters import ModelAdapter

log = logging.getLogger(__name__)

SCORES = ("trisp", "wifn", "gs")
ZSCORES = ("layer", "model")
EPS = 1e-6  # Eq. 4's ε


def channel_scores(
    weight: torch.Tensor, sq: torch.Tensor, grad: torch.Tensor, score: str
) -> torch.Tensor:
    """Per-input-channel score of one projection W (d_out, d_in).

    WIFN_j = mean_i |W_ij| · √(a_j + ε) (Eq. 4); GS_j = mean_i(|W_ij|·Ḡ_ij) · √(a_j + ε) (Eq. 5),
    with `grad` already holding mean_i(|W_ij|·Ḡ_ij); S_j = √(WIFN_j · GS_j) (Eq. 6).
    """
    scale = (sq + EPS).sqrt()
    wifn = weight.detach().float().abs().mean(0) * scale
    gs = grad * scale
    return {"trisp": (wifn * gs).sqrt(), "wifn": wifn, "gs": gs}[score]


def standardize(x: torch.Tensor, over: str) -> torch.Tensor:
    """z-score (L, C) scores per layer (`layer`: FLAP's code) or over all layers (`model`)."""
    dims = (1,) if over == "layer" else (0, 1)
    mean, std = x.mean(dims, keepdim=True), x.std(dims, keepdim=True)
    return (x - mean) / std.clamp_min(torch.finfo(x.dtype).tiny)


@dataclass(frozen=True)
class Plan:
    """What to keep, per layer: KV-group and neuron indices (ascending), and the achieved ratio."""

    kv_groups: list[torch.Tensor]
    neurons: list[torch.Tensor]
    removed_fraction: float  # of attention+MLP parameters, by unit costs


def unit_costs(adapter: ModelAdapter) -> tuple[int, int, int]:
    """Parameters removed with one KV group, with one neuron, and the attention+MLP total.

    Costs are uniform across layers (read from layer 0); the o_proj/down_proj biases stay, so
    they count in the total only.
    """
    a, f = adapter.attn(0), adapter.ffn(0)
    rep, hd = a.num_heads // a.num_kv_heads, a.head_dim

    def row(m: torch.nn.Linear) -> int:
        return m.in_features + (m.bias is not None)

    group = rep * hd * (row(a.q) + a.o.out_features) + hd * (row(a.k) + row(a.v))
    neuron = row(f.gate) + row(f.up) + f.down.out_features
    mods = [m for i in range(len(adapter.layers)) for m in _projections(adapter, i)]
    total = sum(p.numel() for m in mods for p in m.parameters())
    return group, neuron, total


def _projections(adapter: ModelAdapter, i: int) -> list[torch.nn.Linear]:
    a, f = adapter.attn(i), adapter.ffn(i)
    return [a.q, a.k, a.v, a.o, f.gate, f.up, f.down]


def plan_pruning(
    adapter: ModelAdapter,
    stats: dict[str, torch.Tensor],
    sparsity: float,
    score: str = "trisp",
    zscore: str = "layer",
    attn_square: bool = False,
) -> Plan:
    """Score every unit and pick the kept set by one global, cost-weighted threshold (AL-AM).

    Units sorted by score (each layer's best group and neuron first, always kept) are kept until
    their cost reaches (1 − sparsity) of the total, so the removed fraction is at most `sparsity`
    and short of it by less than one unit. `attn_square` squares the o_proj channel scores before
    the z-score, as FLAP's `prune_flap` does (`metrics[...] ** 2` for o_proj only); paper B §3.2
    gives one score, Eq. 6, for both modules. Squaring keeps each channel's rank but stretches the
    upper tail, so it moves the standardized head scores, and with them which KV groups survive
    against each other and against the MLP neurons.
    """
    n_layers = len(adapter.layers)
    n_groups = adapter.attn(0).num_kv_heads
    attn = torch.stack([
        channel_scores(adapter.attn(i).o.weight, stats["attn_sq"][i], stats["attn_grad"][i], score)
        for i in range(n_layers)
    ])  # fmt: skip
    if attn_square:
        attn = attn.square()
    mlp = torch.stack([
        channel_scores(adapter.ffn(i).down.weight, stats["mlp_sq"][i], stats["mlp_grad"][i], score)
        for i in range(n_layers)
    ])  # fmt: skip
    groups = standardize(attn, zscore).reshape(n_layers, n_groups, -1).mean(-1).cpu()  # (L, G)
    neurons = standardize(mlp, zscore).cpu()  # (L, D_ff)

    group_cost, neuron_cost, total = unit_costs(adapter)
    scores = torch.cat([groups.flatten(), neurons.flatten()]).double()
    costs = torch.cat([
        torch.full((groups.numel(),), group_cost, dtype=torch.float64),
        torch.full((neurons.numel(),), neuron_cost, dtype=torch.float64),
    ])  # fmt: skip
    forced = torch.cat([_layer_best(groups), _layer_best(neurons)])
    order = torch.argsort(scores.masked_fill(forced, torch.inf), descending=True, stable=True)
    fixed = total - group_cost * groups.numel() - neuron_cost * neurons.numel()  # kept biases
    kept_cost = fixed + costs[order].cumsum(0)
    target = (1.0 - sparsity) * total
    n_keep = min(int((kept_cost < target - 0.5).sum()) + 1, len(order))
    if n_keep < int(forced.sum()):
        n_keep = int(forced.sum())
        log.warning(
            "trisp: sparsity %.3f is out of reach; every layer keeps one KV group and one neuron, "
            "so %.3f is removed",
            sparsity, 1.0 - float(kept_cost[n_keep - 1]) / total,
        )  # fmt: skip
    keep = torch.zeros(len(order), dtype=torch.bool)
    keep[order[:n_keep]] = True
    keep_groups, keep_neurons = keep[: groups.numel()], keep[groups.numel() :]
    return Plan(
        kv_groups=[r.nonzero().flatten() for r in keep_groups.view(n_layers, -1)],
        neurons=[r.nonzero().flatten() for r in keep_neurons.view(n_layers, -1)],
        removed_fraction=1.0 - float(kept_cost[n_keep - 1]) / total,
    )


def _layer_best(x: torch.Tensor) -> torch.Tensor:
    """(L, C) scores -> flat (L·C,) bool marking each layer's highest-scoring unit."""
    best = torch.zeros_like(x, dtype=torch.bool)
    best[torch.arange(x.shape[0]), x.argmax(1)] = True
    return best.flatten()
