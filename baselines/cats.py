"""`cats`: CATS, contextually-aware thresholding for sparsity (Lee et al., arXiv 2404.08763,
COLM 2024).

Official code: github.com/ScalingIntelligence/CATS @ 679959c
(`experiments/models/sparse_silu/ugly_utils.py`). In every gated MLP, with a = SiLU(W_gate x):
y = W_down((a ⊙ 1[|a| > t_l]) ⊙ W_up x) (`LlamaSparseSiluMLP.forward`, `SparseSiLU`), so a
neuron whose gate activation is small skips its W_up row and W_down column; W_gate stays dense
and attention is untouched.

Calibration (`collect_stats`, `get_threshold`): the dense model runs over calibration text and
each layer accumulates a histogram of |a| with CATS's fixed edges (-inf, 998 even edges on
[-1, 1], +inf); t_l is the edge at which the normalised cumulative count first exceeds ρ
(`searchsorted(..., side="right")`), i.e. the ρ-quantile of |a| at bin resolution 0.002.

Batches. `shared_mask: false` is CATS's own per-token mask (its HF path; each row as at batch 1).
`shared_mask: true` is paper A's batched protocol: each decode step aggregates |a| over the
unfinished rows (`aggregate`, mean by default), applies t_l, and the batch shares one neuron mask
for W_up and W_down (see `bwprune.methods.thresholds`). CATS's Triton kernel ORs the rows' flags
for batches up to 4 (its `max` over rows). Prompts are masked per token in both modes, as CATS does.

Deviations: (1) calibration text is WikiText-2 `valid.txt` (CATS: RefinedWeb, 100 × 1024 tokens;
paper A's choice is not published), sized by `conf/calibration`, pushed through the dense model
layer by layer (the same activations as one full forward); (2) the masked neurons are zeroed at
the gate output (act(0) = 0, so their up/down terms vanish), not gathered: with a mask that changes
every step, gathering the kept rows/columns moves more bytes than the dense product, and CATS's
speed-up needs its custom kernel. The ledger counts what that kernel skips: per row, the fraction of
neurons dropped (`ffn`) and their W_up rows and W_down columns (`params`).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from bwprune.errors import UserError
from bwprune.methods.calibrated import LayerStream, calibration_artifact
from bwprune.methods.hooks import HookSet
from bwprune.methods.thresholds import SiteCost, ThresholdMethod
from bwprune.models.adapters import FFNView, ModelAdapter

# `LlamaSparseSiluMLP.__init__`: num_bins = 1000 -> 999 bins of width ≈ 0.002 on [-1, 1].
INF = torch.tensor([torch.inf])
EDGES = torch.cat([-INF, torch.linspace(-1, 1, 998), INF])


def quantile_edge(counts: torch.Tensor, sparsity: float) -> torch.Tensor:
    """CATS's `get_threshold` per row of (L, bins) counts: the bin edge where the normalised
    cumulative count first exceeds `sparsity`."""
    cum = (counts.double() / counts.double().sum(-1, keepdim=True)).cumsum(-1)
    target = torch.full((cum.shape[0], 1), sparsity, dtype=cum.dtype, device=cum.device)
    idx = torch.searchsorted(cum, target, right=True).squeeze(-1)
    return EDGES.to(cum.device, cum.dtype)[idx]


class CATS(ThresholdMethod):
    """Per-layer threshold on |SiLU(W_gate x)|; dropped neurons skip W_up and W_down."""

    sites = ("gate_act",)

    def prepare(
        self, model: nn.Module, adapter: ModelAdapter, tokenizer: PreTrainedTokenizerBase
    ) -> None:
        if self.sparsity == 0:
            return
        ffns = adapter.ffns()
        zero = ffns[0].gate.weight.new_zeros(1)
        if any(float(f.act(zero)) != 0.0 for f in ffns):
            raise UserError("cats needs act(0) = 0 in every MLP (SiLU): zeroing a gate drops it")
        hist = calibration_artifact(
            "cats", model, adapter, tokenizer, self.calibration, self.cache_dir,
            {"edges": len(EDGES)}, lambda stream: self._histograms(stream, ffns),
        )  # fmt: skip
        self.thresholds = [[t] for t in quantile_edge(hist["counts"], self.sparsity).tolist()]
        # A dropped neuron skips its W_up row and W_down column.
        self.costs = [[SiteCost(1.0 / f.d_ff, float(f.up.in_features + f.down.out_features))]
                      for f in ffns]  # fmt: skip

    @staticmethod
    def _histograms(stream: LayerStream, ffns: list[FFNView]) -> dict[str, torch.Tensor]:
        """(L, 999) histogram of |act(W_gate x)| per layer over the calibration windows."""
        counts = torch.zeros(len(ffns), len(EDGES) - 1)
        for f in ffns:

            def add(module: nn.Module, args: tuple, out: torch.Tensor, f: FFNView = f) -> None:
                magnitude = f.act(out).abs().float().cpu()
                counts[f.index] += torch.histogram(magnitude, bins=EDGES)[0]

            with HookSet() as hooks:
                hooks.forward(f.gate, add)
                stream.advance(f.index)
        return {"counts": counts}
