"""Realized sparsity: the one definition used for every method, run and table.

For every decode step of every unfinished row, a method reports s_l, the fraction of layer l's FFN
neurons it skipped (0 on a dense step), and optionally how many parameters it skipped in all (for
methods that also skip attention or input channels). Fractions are relative to the model as loaded,
before any method's `prepare` (a statically pruned model reports what it removed). Per row:

- `ffn`: neuron-weighted FFN sparsity Σ_l s_l·D_l / Σ_l D_l, averaged over all decode steps
  (dense steps count as 0). This is what a scheduled method achieves over a whole generation.
- `ffn_sparse_steps`: the same, averaged over the steps the method pruned only; for a top-k method
  it equals the target ρ exactly.
- `params`: fraction of ALL model parameters skipped per decode token. By default Σ_l s_l·P_l /
  P_total, where P_l are layer l's gate/up/down parameters, so attention, norms, embeddings and
  lm_head count as dense; a method that skips more reports its own count. This is the quantity
  closest to the paper's "actual sparsity" (paper-specs A.4.6).
- `per_layer`: mean s_l over all decode steps.

Prefill is not counted: decode dominates generation time and is what the speed numbers measure.
A run's values are decode-step-weighted means of its rows' values (`combine`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from bwprune.models.adapters import ModelAdapter


@dataclass(frozen=True)
class StepSparsity:
    """What one forward skipped: returned by `PruningMethod.end_step` (None = dense forward)."""

    ffn: (
        torch.Tensor
    )  # (L,) shared by the batch, or (B, L) per row: fraction of FFN neurons skipped
    params: torch.Tensor | None = None  # () or (B,): parameters skipped; None = FFN neurons only


class SparsityLedger:
    """Accumulates per-row sparsity on the model's device (no host sync per step).

    Build it from the model as loaded, before `prepare`, so fractions are relative to the original.
    """

    def __init__(self, adapter: ModelAdapter, device: torch.device) -> None:
        ffns = adapter.ffns()
        self.d_ff = torch.tensor([f.d_ff for f in ffns], dtype=torch.float64, device=device)
        self.ffn_params = torch.tensor(
            [f.num_params for f in ffns], dtype=torch.float64, device=device
        )
        self.total_params = float(adapter.num_params())
        self.device = device
        self.reset(0)

    def reset(self, batch_size: int) -> None:
        zeros = torch.zeros(batch_size, dtype=torch.float64, device=self.device)
        self.steps, self.sparse_steps = zeros.clone(), zeros.clone()
        self.ffn, self.params = zeros.clone(), zeros.clone()
        self.layer = torch.zeros(
            batch_size, len(self.d_ff), dtype=torch.float64, device=self.device
        )

    def record(self, sparsity: StepSparsity | None, active: torch.Tensor) -> None:
        """One decode step; `active` (B,) bool marks the rows that were still generating."""
        rows = active.to(torch.float64)
        self.steps += rows
        if sparsity is None:
            return
        s = sparsity.ffn.to(torch.float64).expand_as(self.layer) * rows[:, None]  # (B, L)
        self.sparse_steps += rows
        self.ffn += (s @ self.d_ff) / self.d_ff.sum()
        if sparsity.params is None:
            self.params += (s @ self.ffn_params) / self.total_params
        else:
            self.params += sparsity.params.to(torch.float64) * rows / self.total_params
        self.layer += s

    def rows(self) -> list[dict]:
        """Per-row summary of the current batch (one host transfer)."""
        steps = self.steps.cpu()
        sparse = self.sparse_steps.cpu()
        ffn, params, layer = self.ffn.cpu(), self.params.cpu(), self.layer.cpu()
        out = []
        for b in range(len(steps)):
            n, ns = float(steps[b]), float(sparse[b])
            out.append(
                {
                    "decode_steps": int(n),
                    "sparse_steps": int(ns),
                    "ffn": float(ffn[b]) / n if n else 0.0,
                    "ffn_sparse_steps": float(ffn[b]) / ns if ns else 0.0,
                    "params": float(params[b]) / n if n else 0.0,
                    "per_layer": [round(float(v) / n, 6) if n else 0.0 for v in layer[b]],
                }
            )
        return out


def combine(rows: Iterable[Mapping]) -> dict:
    """Run-level realized sparsity: decode-step-weighted means of per-row ledger summaries."""
    rows = [r for r in rows if r]
    steps = sum(r["decode_steps"] for r in rows)
    sparse = sum(r["sparse_steps"] for r in rows)

    def mean(key: str, weight: str, total: int) -> float:
        return sum(r[key] * r[weight] for r in rows) / total if total else 0.0

    num_layers = len(rows[0]["per_layer"]) if rows else 0
    per_layer = [
        sum(r["per_layer"][i] * r["decode_steps"] for r in rows) / steps if steps else 0.0
        for i in range(num_layers)
    ]
    return {
        "ffn": mean("ffn", "decode_steps", steps),
        "ffn_sparse_steps": mean("ffn_sparse_steps", "sparse_steps", sparse),
        "params": mean("params", "decode_steps", steps),
        "decode_steps": steps,
        "sparse_step_fraction": sparse / steps if steps else 0.0,
        "per_layer": [round(v, 6) for v in per_layer],
    }
