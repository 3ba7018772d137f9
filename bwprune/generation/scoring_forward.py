"""The scoring forward: every token of a batch of rows evaluated in one teacher-forced forward
under a pruning method, as perplexity and lm-eval's loglikelihood need it.

The method sees it as a prompt prefill (a new batch, then one PREFILL step whose `valid` marks the
real tokens) through `bwprune.engine.protocol.MethodDriver.score`, which measures it once per
row. What the logits are scored against (targets, windows, continuations) is the caller's.
"""

from __future__ import annotations

import torch
from torch import nn

from bwprune.engine.protocol import MethodDriver


def score_forward(
    driver: MethodDriver,
    model: nn.Module,
    ids: torch.Tensor,
    attn: torch.Tensor,
    logits_to_keep: int = 0,
) -> tuple[torch.Tensor, list[dict]]:
    """Logits of (B, T) left-padded `ids` with attention mask `attn` (the last `logits_to_keep`
    positions only; 0 keeps all), and the ledger rows of the batch.

    Positions count from each row's first real token, as in the runner's prefill, so a padded
    row computes what it computes alone; no KV cache is kept.
    """
    driver.start(ids.shape[0])
    logits = driver.score(attn.bool(), lambda: model(
        input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0),
        use_cache=False, logits_to_keep=logits_to_keep,
    ).logits)  # fmt: skip
    return logits, driver.rows()
