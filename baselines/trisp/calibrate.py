"""TriSP calibration (paper B §3.1): per-sample loss and backward, input statistics of o_proj and
down_proj.

For every calibration window, one forward gives the next-token loss L (Eq. 1) and one backward
its gradient. Only the o_proj and down_proj weights require a gradient, because Eq. 5 uses no other
(paper B criticises LLM-Pruner for keeping gradients of all weights). Eq. 2's mean |gradient| per
weight enters the score only through mean_i |W_ij| · Ḡ_ij, which is linear in Ḡ while W is fixed, so
the per-channel reduction is accumulated per sample instead of a full Ḡ per weight: O(d_in) memory
per layer, the same value.

Forward pre-hooks on o_proj and down_proj accumulate, per input channel j, the squared norm of
the channel over each window's tokens averaged over windows (a_j, Eq. 3 — the paper's running
update is this mean computed incrementally, as in FLAP's `scaler_inp`) and the mean input over all
tokens (μ_j, for bias compensation, FLAP's `baseline_inp`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from bwprune.methods.hooks import HookSet
from bwprune.models.adapters import ModelAdapter


def _input_stats(sq: torch.Tensor, total: torch.Tensor) -> Callable[[nn.Module, tuple], None]:
    """A pre-hook adding Σ_tokens x_j² and Σ_tokens x_j of its module's input to `sq` / `total`."""

    def hook(module: nn.Module, args: tuple) -> None:
        x = args[0].detach().float().flatten(0, -2)  # (tokens, C)
        sq.add_(x.pow(2).sum(0))
        total.add_(x.sum(0))

    return hook


def next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Eq. 1: mean cross-entropy of predicting x_{t+1} from x_1..x_t over the T-1 positions."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())


def collect_statistics(
    model: nn.Module, adapter: ModelAdapter, windows: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Eq. 1–3 over `windows` (N, T), one window per forward/backward (Eq. 2 averages per-sample
    |gradients|, which a batched backward would sum before the absolute value).

    Returns (L, C) float32 tensors on the model's device, C = the o_proj (`attn_*`) or down_proj
    (`mlp_*`) input channels: `*_sq` = a_j (Eq. 3), `*_mean` = μ_j, `*_grad` =
    (1/N) Σ_t mean_i |W_ij|·|∂L_t/∂W_ij| (Eq. 2 inside Eq. 5).
    """
    device = next(model.parameters()).device
    layers = range(len(adapter.layers))
    outs = {
        "attn": [adapter.attn(i).o for i in layers],
        "mlp": [adapter.ffn(i).down for i in layers],
    }
    stats = {
        f"{kind}_{name}": torch.zeros(len(layers), mods[0].in_features, device=device)
        for kind, mods in outs.items()
        for name in ("sq", "mean", "grad")
    }
    modules = [m for mods in outs.values() for m in mods]
    was_trainable = [m.weight.requires_grad for m in modules]
    try:
        for m in modules:
            m.weight.requires_grad_(True)
        with HookSet() as hooks, torch.enable_grad():
            for kind, mods in outs.items():
                for i, m in enumerate(mods):
                    hooks.forward_pre(
                        m, _input_stats(stats[f"{kind}_sq"][i], stats[f"{kind}_mean"][i])
                    )
            for window in windows:
                ids = window[None].to(device)
                next_token_loss(model(input_ids=ids, use_cache=False).logits, ids).backward()
                for kind, mods in outs.items():
                    for i, m in enumerate(mods):
                        w = m.weight.detach().float()
                        stats[f"{kind}_grad"][i] += (w.abs() * m.weight.grad.float().abs()).mean(0)
                        m.weight.grad = None
    finally:
        for m, trainable in zip(modules, was_trainable):
            m.weight.requires_grad_(trainable)
            m.weight.grad = None
    n = len(windows)
    for kind in outs:
        stats[f"{kind}_sq"] /= n  # Σ over each window's tokens, mean over windows (Eq. 3)
        stats[f"{kind}_grad"] /= n  # Eq. 2's 1/N
        stats[f"{kind}_mean"] /= windows.numel()  # every token of every window
    return stats
