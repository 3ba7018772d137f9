"""When a row stops: stop tokens (EOS ids) and stop strings (lm-eval's `until`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase


def stop_token_ids(model: nn.Module, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """EOS ids from the generation config (may be a list) and the tokenizer."""
    ids = getattr(model.generation_config, "eos_token_id", None)
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return sorted(set(ids))


class StopStrings:
    """Ends a row once its generated text contains one of `strings` (lm-eval's `until`).

    Stop strings are text, not token ids: they can start inside a token and span several. Each
    step decodes only the last `window` generated tokens of each running row (a stop string's own
    token count + 2, the margin lm-eval's HF backend uses), so the check stays O(1) in length.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, strings: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.strings = [s for s in strings if s]
        lengths = [len(tokenizer.encode(s, add_special_tokens=False)) for s in self.strings]
        self.window = max(lengths, default=0) + 2

    def hits(self, tail: torch.Tensor, finished: torch.Tensor) -> torch.Tensor:
        """(B,) bool: the running rows whose latest tokens, (B, ≤ window) `tail`, complete a
        stop string."""
        hit = [
            not done and any(s in self.tokenizer.decode(row) for s in self.strings)
            for row, done in zip(tail.tolist(), finished.tolist())
        ]
        return torch.tensor(hit, dtype=torch.bool, device=finished.device)
