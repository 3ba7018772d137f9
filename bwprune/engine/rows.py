"""The rows of a generation: what each has produced, and which still take part in the batch.

Outputs are kept in the batch's original row order, whatever happens to the batch: when rows
finish, live-row compaction (`generation.compaction`) drops them from the computation once the
live count fits a smaller power-of-two bucket, so a compiled step sees only a few batch shapes.
A bucket larger than the live count keeps some finished rows as filler (they compute, masked as
finished, exactly as without compaction).
"""

from __future__ import annotations

import torch


def bucket(n: int) -> int:
    """The smallest power of two >= n."""
    return 1 << max(0, n - 1).bit_length()


class GenerationRows:
    """Generated tokens, lengths and stop state of a batch's rows in their original order, and
    `index`: the original row of each row the step still computes."""

    def __init__(self, batch: int, steps: int, pad_id: int, device: torch.device) -> None:
        self.tokens = torch.full((batch, steps), pad_id, dtype=torch.long, device=device)
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)
        self.stopped = torch.zeros(batch, dtype=torch.bool, device=device)
        self.index = torch.arange(batch, device=device)

    @property
    def batch(self) -> int:
        return self.tokens.shape[0]

    def record(self, i: int, token: torch.Tensor, active: torch.Tensor) -> None:
        """The i-th new token of every computed row; `active` rows count it in their length."""
        self.tokens[self.index, i] = token
        self.lengths[self.index] += active

    def stop(self, finished: torch.Tensor) -> None:
        """Computed rows in `finished` have stopped (a stop token or string, not the length cap)."""
        self.stopped[self.index] |= finished

    def tail(self, i: int, window: int) -> torch.Tensor:
        """(computed rows, ≤ window) the latest new tokens up to and including the i-th."""
        return self.tokens[self.index, max(0, i + 1 - window) : i + 1]

    def compaction(self, finished: torch.Tensor, live: int) -> torch.Tensor | None:
        """Computed rows to keep (ascending), or None when the live rows need the whole bucket."""
        target = bucket(live)
        if target >= len(self.index):
            return None
        alive = (~finished).nonzero().flatten()
        filler = finished.nonzero().flatten()[: target - live]
        return torch.cat([alive, filler]).sort().values

    def keep(self, rows: torch.Tensor) -> None:
        self.index = self.index[rows]

    def full(self, values: torch.Tensor) -> torch.Tensor:
        """Per-computed-row `values` (n, ...) spread to (batch, ...) in original order (rows no
        longer computed read zeros)."""
        if len(self.index) == self.batch:
            return values
        out = values.new_zeros((self.batch, *values.shape[1:]))
        out[self.index] = values
        return out
