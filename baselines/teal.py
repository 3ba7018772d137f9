"""`teal`: TEAL, training-free activation sparsity (Liu et al., arXiv 2408.14690, ICLR 2025).

Official code: github.com/FasterDecoding/TEAL @ 5baaec8 (`utils/utils.py`, `teal/grab_acts.py`,
`teal/mlp.py`, `teal/self_attn.py`). Every decoder layer thresholds the four hidden states that
enter its seven projections by magnitude, s_t(x) = x ⊙ 1[|x| > t] (`SparsifyFn.apply`):
attention input -> q, k, v; attention output -> o; MLP input -> gate, up; MLP intermediate
act(W_gate x) ⊙ W_up x -> down. A zeroed input channel is a weight column a GEMV kernel never reads.

Calibration (as `grab_acts.py` + `find_histogram`): the dense model runs layer by layer over the
calibration windows; per (layer, hidden state) all values go into a 10,000-bin histogram, 9,999 even
edges between the 1st and 99th percentiles plus the extreme values as outer edges. The threshold for
sparsity s is t = F⁻¹(1/2 + s/2) of the *signed* distribution (`Distribution.icdf`, linear between
bin centres), which assumes a zero-mean symmetric distribution; q/k/v and gate/up share a histogram.
Uniform sparsity: every projection of every layer gets the same s, as paper A ran TEAL
(docs/paper-notes.md#baselines-in-batches); the block-wise greedy allocation (`greedyopt.py`) is not
used.

Batches. `shared_mask: false` is TEAL's own per-token behaviour (each row as at batch 1).
`shared_mask: true` is paper A's batched protocol: each decode step aggregates the per-row
magnitudes of the unfinished rows (`aggregate`, mean by default) and applies the offline threshold,
so the batch skips one set of input channels (see `bwprune.methods.thresholds`).

Prefill: the accuracy path thresholds only the last ⌊S/2⌋ prompt tokens (`apply_prefill=True`,
the setting of the paper's evals; its speed path keeps prefill dense): `prefill_fraction` 0.5,
applied to each row's own prompt length so rows stay independent under left padding.

Sites: q/k/v read one hidden state and gate/up another, so each is masked once for the
projections that read it (its cost counts all of them).

Deviations: (1) calibration text is WikiText-2 `valid.txt` (TEAL used Alpaca, 10 × 2048 tokens;
paper A's text names none, a third-party note says C4), sized by `conf/calibration`; (2) the
channels are masked, not skipped: PyTorch has no fused gather-GEMV, and gathering the kept
weight columns each step moves more bytes than the dense product (read + write + read of the kept
part), so slicing saves no work here. The
ledger counts what TEAL's kernel would skip: per row, Σ over projections of dropped input channels
× out_features (`params`), and for the FFN the same over gate/up/down as a fraction of its weights.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from bwprune.errors import UserError
from bwprune.methods.calibrated import LayerStream, calibration_artifact
from bwprune.methods.hooks import HookSet
from bwprune.methods.thresholds import SiteCost, ThresholdMethod
from bwprune.models.adapters import ModelAdapter

# The hidden states entering q/k/v, o, gate/up and down.
SITES = ("attn_in", "attn_out", "mlp_in", "mlp_mid")


def histogram(
    values: torch.Tensor, num_bins: int, outlier: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """TEAL's `find_histogram`: (counts, centres) of `num_bins` bins, even between the
    `outlier` and 1 − `outlier` quantiles, with one outer bin on each side up to the extremes."""
    v = values.flatten().float().sort().values.cpu()  # sorted where the values are (GPU: fast)
    cut = int(outlier * len(v))
    main = torch.linspace(float(v[cut]), float(v[len(v) - max(cut, 1)]), num_bins - 1)
    edges = torch.cat([v[:1], main, v[-1:]])
    counts, _ = torch.histogram(v, bins=edges)
    return counts, (edges[:-1] + edges[1:]) / 2


def icdf(counts: torch.Tensor, centres: torch.Tensor, q: float) -> torch.Tensor:
    """TEAL's `Distribution.icdf` over the last axis: the value below which a fraction q of the
    counts lies, interpolated linearly between bin centres; (..., bins) -> (...)."""
    cum = counts.double().cumsum(-1)
    target = q * cum[..., -1:]
    idx = torch.searchsorted(cum, target)  # (..., 1)
    hi = idx.clamp(1, cum.shape[-1] - 1)
    c_lo, c_hi = cum.gather(-1, hi - 1), cum.gather(-1, hi)
    x_lo, x_hi = centres.double().gather(-1, hi - 1), centres.double().gather(-1, hi)
    value = x_lo + (target - c_lo) / (c_hi - c_lo) * (x_hi - x_lo)
    value = torch.where(idx == 0, centres[..., :1].double(), value)
    value = torch.where(idx == cum.shape[-1], centres[..., -1:].double(), value)
    return value.squeeze(-1)


class TEAL(ThresholdMethod):
    """Magnitude thresholds on the inputs of q/k/v/o/gate/up/down, calibrated per tensor."""

    sites = SITES

    def __init__(
        self,
        sparsity: float,
        shared_mask: bool,
        aggregate: str,
        prefill_fraction: float,
        num_bins: int,
        outlier_fraction: float,
        calibration: Mapping | None,
        cache_dir: str | None,
    ) -> None:
        super().__init__(sparsity, shared_mask, aggregate, calibration, cache_dir)
        if not 0.0 <= prefill_fraction <= 1.0:
            raise UserError(f"prefill_fraction={prefill_fraction} is outside [0, 1]")
        if num_bins < 3:
            raise UserError(f"num_bins={num_bins} must be >= 3")
        if not 0.0 <= outlier_fraction < 0.5:
            raise UserError(f"outlier_fraction={outlier_fraction} is outside [0, 0.5)")
        self.prefill_fraction = prefill_fraction
        self.num_bins, self.outlier_fraction = num_bins, outlier_fraction

    def prepare(
        self, model: nn.Module, adapter: ModelAdapter, tokenizer: PreTrainedTokenizerBase
    ) -> None:
        if self.sparsity == 0:
            return
        key = {"num_bins": self.num_bins, "outlier_fraction": self.outlier_fraction}
        hist = calibration_artifact(
            "teal", model, adapter, tokenizer, self.calibration, self.cache_dir, key,
            lambda stream: self._histograms(stream, adapter),
        )  # fmt: skip
        # Uniform sparsity: t = F⁻¹(1/2 + s/2) for every tensor (`SparsifyFn.set_threshold`).
        self.thresholds = icdf(hist["counts"], hist["centres"], 0.5 + self.sparsity / 2).tolist()
        self.costs = [self._costs(adapter, i) for i in range(len(adapter.layers))]

    @staticmethod
    def _costs(adapter: ModelAdapter, layer: int) -> list[SiteCost]:
        """A dropped input channel skips one weight column of every projection reading it."""
        attn, ffn = adapter.attn(layer), adapter.ffn(layer)
        readers = ((attn.q, attn.k, attn.v), (attn.o,), (ffn.gate, ffn.up), (ffn.down,))
        costs = []
        for site, projections in zip(SITES, readers):
            params = sum(p.out_features for p in projections)
            costs.append(SiteCost(params / ffn.num_params if site.startswith("mlp") else 0.0,
                                  float(params)))  # fmt: skip
        return costs

    def _histograms(self, stream: LayerStream, adapter: ModelAdapter) -> dict[str, torch.Tensor]:
        """Dense layer-by-layer pass: one histogram per (layer, site), (L, 4, num_bins)."""
        counts, centres = [], []
        for i in range(len(adapter.layers)):
            attn, ffn = adapter.attn(i), adapter.ffn(i)
            values: dict[str, list[torch.Tensor]] = {site: [] for site in SITES}
            with HookSet() as hooks:
                for site, module in zip(SITES, (attn.q, attn.o, ffn.gate, ffn.down)):
                    hooks.forward_pre(module, lambda m, a, into=values[site]: into.append(a[0]))
                stream.advance(i)
            layer = [
                histogram(torch.cat(values[s]), self.num_bins, self.outlier_fraction) for s in SITES
            ]
            counts.append(torch.stack([c for c, _ in layer]))
            centres.append(torch.stack([x for _, x in layer]))
        return {"counts": torch.stack(counts), "centres": torch.stack(centres)}
