"""Perplexity of a model under a pruning method, over the windows of a `kind = "perplexity"`
benchmark (`bwprune.benchmarks.wikitext2`).

Every batch of windows is one scoring forward (`bwprune.generation.scoring_forward`): the
method sees it exactly as it sees the runner's prefill (attached around the whole evaluation, a
new batch per batch of windows, a PREFILL step whose tokens are all valid: windows are unpadded).
A method therefore acts here as it acts on a prompt: static methods (dense, Wanda, TriSP) fully;
dynamic ones (TEAL, CATS, Griffin, ours) with whatever their prefill rule is — e.g. a method that
stays dense during prefill measures the dense perplexity. The caller prepares the method first,
as for generation (`MethodDriver.prepare`). The ledger measures each window's forward once (its
definition); TEAL and CATS report no prefill sparsity, so their perplexity runs show realized
sparsity 0 although their prefill rule thresholds part of each window.

Perplexity = exp(Σ NLL / n) over all scored tokens (not a mean of per-window perplexities).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedTokenizerBase

from bwprune.benchmarks.wikitext2 import WikiText2, Window
from bwprune.engine.ledger import SparsityLedger
from bwprune.engine.protocol import MethodDriver
from bwprune.engine.realized import combine
from bwprune.errors import UserError
from bwprune.generation.scoring_forward import score_forward
from bwprune.methods.base import PruningMethod
from bwprune.models.adapters import ModelAdapter


def _batches(windows: list[Window], batch_size: int) -> Iterator[list[Window]]:
    """Consecutive windows of equal length, at most `batch_size` at a time (no padding needed)."""
    batch: list[Window] = []
    for w in windows:
        if batch and (len(batch) == batch_size or w.end - w.begin != batch[0].end - batch[0].begin):
            yield batch
            batch = []
        batch.append(w)
    if batch:
        yield batch


def _scored_nll(
    logits: torch.Tensor, ids: torch.Tensor, batch: list[Window]
) -> tuple[torch.Tensor, int]:
    """Σ NLL and count of the scored targets of a batch: target at position p is predicted by the
    logits at p − 1, and scored when p >= the window's `first_target`."""
    nll = F.cross_entropy(
        logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="none"
    ).view(len(batch), -1)
    positions = torch.arange(1, ids.shape[1], device=ids.device)  # in-window positions of targets
    first = torch.tensor([w.first_target - w.begin for w in batch], device=ids.device)
    scored = positions[None, :] >= first[:, None]
    return nll.double()[scored].sum(), int(scored.sum())


@torch.inference_mode()
def evaluate_perplexity(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    method: PruningMethod,
    adapter: ModelAdapter,
    benchmark: WikiText2,
    batch_size: int = 1,
    ledger: SparsityLedger | None = None,
    limit: int | None = None,
) -> dict:
    """Metrics: `perplexity`, `nll` (mean per token), `n_tokens`, `n_windows`, `seq_len`,
    `stride`, `eval_s`, `tokens_per_s`, and, with a `ledger` (built before `prepare`, like the
    runner's), `realized_sparsity` — its summary with every window's forward counted as a step.
    `limit` keeps the first windows only: run.py's `limit` means the first N examples, and a
    window is this benchmark's example."""
    if batch_size < 1:
        raise UserError(f"batch_size={batch_size!r} must be >= 1")
    device = next(model.parameters()).device
    ids = benchmark.token_ids(tokenizer)
    windows = benchmark.windows(len(ids))[:limit]
    driver = MethodDriver(method, model, adapter, ledger)
    total = torch.zeros((), dtype=torch.float64, device=device)
    n_tokens = 0
    rows: list[dict] = []
    start = time.perf_counter()
    with driver.attached():
        for batch in _batches(windows, batch_size):
            x = torch.stack([ids[w.begin : w.end] for w in batch]).to(device)
            logits, ledger_rows = score_forward(driver, model, x, torch.ones_like(x))
            nll, n = _scored_nll(logits, x, batch)
            total += nll
            n_tokens += n
            rows += ledger_rows
    eval_s = time.perf_counter() - start
    mean_nll = float(total) / n_tokens
    metrics = {
        "perplexity": math.exp(mean_nll),
        "nll": mean_nll,
        "n_tokens": n_tokens,
        "n_windows": len(windows),
        "seq_len": benchmark.seq_len,
        "stride": benchmark.stride,
        "eval_s": round(eval_s, 3),
        "tokens_per_s": round(n_tokens / eval_s, 2),
    }
    if ledger is not None:
        metrics["realized_sparsity"] = combine(rows)
    return metrics
