"""Realized sparsity: the one definition used for every method, run and table.

The ledger counts *measured forwards*: every decode step of a generation (one token per unfinished
row), and every scoring forward over given text (a perplexity window, an lm-eval loglikelihood
request), whose every token is evaluated. A generation's prompt prefill is not measured: decode
dominates generation time and is what the speed numbers measure. Only
`bwprune.engine.protocol.MethodDriver` records into a ledger, so this is the only definition.

For every measured forward of every active row, a method reports s_l, the fraction of layer l's FFN
it skipped (0 on a dense forward), and optionally how many parameters it skipped in all (for
methods that also skip attention or input channels). Fractions are relative to the model as loaded,
before any method's `prepare` (a statically pruned model reports what it removed). Per row:

- `ffn` (a): neuron-weighted FFN sparsity Σ_l s_l·D_l / Σ_l D_l, averaged over all measured
  forwards (dense ones count as 0). This is what a scheduled method achieves over a generation.
- `ffn_sparse_steps` (b): the same, averaged over the forwards the method pruned only; for a top-k
  method it equals the target ρ exactly.
- `params` (c): fraction of ALL model parameters skipped per token. By default Σ_l s_l·P_l /
  P_total, where P_l are layer l's gate/up/down parameters, so attention, norms, embeddings and
  lm_head count as dense; a method that skips more reports its own count. This is the quantity
  closest to the paper's "actual sparsity" (docs/paper-notes.md#realized-sparsity).
- `per_layer`: mean s_l over all measured forwards.

(The summary keys say `decode_steps` / `sparse_steps` for the measured forwards.) A run's values
are measured-forward-weighted means of its rows' values (`bwprune.engine.realized.combine`).
"""

from __future__ import annotations

import torch

from bwprune.methods.base import StepSparsity
from bwprune.models.adapters import ModelAdapter


class SparsityLedger:
    """Accumulates per-row sparsity on the model's device (no host sync per step).

    Build it from the model as loaded, before `prepare`, so fractions are relative to the original.
    Rows that leave the batch early (`keep_rows`, live-row compaction) keep their totals; `rows()`
    reports every row the batch started with, in its original order.
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
        # (B, 4 + L): measured forwards, sparse forwards, Σ ffn, Σ params, Σ s_l per layer
        self.totals = torch.zeros(
            batch_size, 4 + len(self.d_ff), dtype=torch.float64, device=self.device
        )
        self.row_ids = list(range(batch_size))  # original row of each current row
        self._left: dict[int, torch.Tensor] = {}  # totals of rows that left the batch

    def record(self, sparsity: StepSparsity | None, active: torch.Tensor) -> None:
        """One measured forward; `active` (B,) bool marks the rows it counts for."""
        rows = active.to(torch.float64)
        self.totals[:, 0] += rows
        if sparsity is None:
            return
        s = sparsity.ffn.to(torch.float64).expand(len(rows), len(self.d_ff)) * rows[:, None]
        self.totals[:, 1] += rows
        self.totals[:, 2] += (s @ self.d_ff) / self.d_ff.sum()
        if sparsity.params is None:
            self.totals[:, 3] += (s @ self.ffn_params) / self.total_params
        else:
            self.totals[:, 3] += sparsity.params.to(torch.float64) * rows / self.total_params
        self.totals[:, 4:] += s

    def keep_rows(self, index: torch.Tensor) -> None:
        """Rows leave the batch: only the current rows `index` go on being recorded."""
        kept = set(index.tolist())
        for b, row in enumerate(self.row_ids):
            if b not in kept:
                self._left[row] = self.totals[b].clone()
        self.totals = self.totals[index]
        self.row_ids = [self.row_ids[b] for b in index.tolist()]

    def take(self, slots: torch.Tensor) -> list[dict]:
        """Summaries of the current rows `slots` (continuous batching: they have finished), whose
        totals then restart from zero for the rows that will take those slots."""
        taken = self.totals[slots].cpu().tolist()
        self.totals[slots] = 0
        return [_summary(t) for t in taken]

    def rows(self) -> list[dict]:
        """Per-row summary of every row the batch started with (one host transfer)."""
        by_row = dict(zip(self.row_ids, self.totals))
        by_row.update(self._left)
        if not by_row:
            return []
        totals = torch.stack([by_row[r] for r in sorted(by_row)]).cpu().tolist()
        return [_summary(t) for t in totals]


def _summary(t: list[float]) -> dict:
    n, ns, ffn, params, layer = t[0], t[1], t[2], t[3], t[4:]
    return {
        "decode_steps": int(n),
        "sparse_steps": int(ns),
        "ffn": ffn / n if n else 0.0,
        "ffn_sparse_steps": ffn / ns if ns else 0.0,
        "params": params / n if n else 0.0,
        "per_layer": [round(v / n, 6) if n else 0.0 for v in layer],
    }
