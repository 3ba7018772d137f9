"""Fidelity to the dense model along one trajectory: teacher-forced NLL and token-level KL.

At small scale accuracy sits at the floor, so what a method costs is measured against the dense
model itself. Before the method is prepared, the dense model greedily continues each prompt for
up to `max_tokens` tokens, keeping its top-`top_k` next-token log-probabilities at every position.
Then, with the method attached, that continuation is fed through the same prefill/decode schedule
(the method prunes exactly as while generating), and per row we record the mean NLL of the
reference tokens (dense and method) and the mean KL(dense ‖ method).

The KL is computed over the dense top-k tokens plus one bin for the rest of the vocabulary, so it
never exceeds the exact KL (merging bins cannot increase a KL divergence) and equals it when the
dense distribution has no mass outside its top k; `top_k` is a config value.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from omegaconf import DictConfig
from tqdm import tqdm

from bwprune.benchmarks.base import Example
from bwprune.generation.prepared import PreparedModel
from bwprune.generation.prompts import batch_prompts
from bwprune.generation.runner import BatchedRunner, Forcing, SamplingConfig
from bwprune.generation.stream import StreamRunner
from bwprune.methods.base import PruningMethod


@dataclass
class DenseReference:
    """The dense model's greedy continuation of one batch and its top-k log-probabilities."""

    forcing: Forcing  # (B, N) tokens and (B,) lengths
    top_logp: torch.Tensor  # (B, N, K)
    top_index: torch.Tensor  # (B, N, K)
    nll: torch.Tensor  # (B,) summed NLL of the reference tokens under the dense model

    def row(self, b: int) -> DenseReference:
        """Row `b` alone, cut to its own length (continuous batching streams rows one by one)."""
        n = int(self.forcing.lengths[b])
        f = Forcing(self.forcing.tokens[b : b + 1, :n], self.forcing.lengths[b : b + 1])
        return DenseReference(f, self.top_logp[b : b + 1, :n], self.top_index[b : b + 1, :n],
                              self.nll[b : b + 1])  # fmt: skip

    def to(self, device: torch.device) -> DenseReference:
        f = Forcing(self.forcing.tokens.to(device), self.forcing.lengths.to(device))
        return DenseReference(
            f, self.top_logp.to(device), self.top_index.to(device), self.nll.to(device)
        )


def dense_reference(
    runner: BatchedRunner, ids: torch.Tensor, attn: torch.Tensor, top_k: int
) -> DenseReference:
    """Greedy continuation by `runner` (a dense runner), with top-k log-probs at each position."""
    tops: list[torch.return_types.topk] = []
    completions, _ = runner.generate_tokens(
        ids, attn, observe=lambda i, logits: tops.append(logits.float().log_softmax(-1).topk(top_k))
    )
    n = max(c.new_tokens for c in completions)
    tokens = torch.tensor([c.token_ids + [0] * (n - c.new_tokens) for c in completions])
    lengths = torch.tensor([c.new_tokens for c in completions])
    top_logp = torch.stack([t.values for t in tops], dim=1).cpu()  # (B, N, K)
    top_index = torch.stack([t.indices for t in tops], dim=1).cpu()
    valid = torch.arange(n)[None, :] < lengths[:, None]
    nll = -(top_logp[..., 0] * valid).sum(1)  # greedy: the reference token is the top-1
    return DenseReference(Forcing(tokens, lengths), top_logp, top_index, nll)


def dense_references(
    cfg: DictConfig, prepared: PreparedModel, batches: list[list[tuple[Example, int]]]
) -> list[DenseReference]:
    """`quality.enabled`: the dense model's greedy reference for every batch to generate. Call it
    before the method is prepared (static methods edit the weights in `prepare`)."""
    q = cfg.quality
    if not q.enabled:
        return []
    dense = BatchedRunner(
        prepared.model, prepared.tokenizer, PruningMethod(), prepared.adapter,
        SamplingConfig(q.max_tokens), batch_invariant=bool(cfg.generation.batch_invariant),
    )  # fmt: skip
    bar = tqdm(batches, desc="dense references", unit="batch", disable=not cfg.progress)
    return [
        dense_reference(
            dense, *dense.encode(batch_prompts(prepared.tokenizer, cfg.model, b)), q.top_k
        )
        for b in bar
    ]


def binned_kl(p_top_logp: torch.Tensor, top_index: torch.Tensor, q_logp: torch.Tensor):
    """KL(p ‖ q) over p's top-k tokens plus one bin for the rest: (B, K), (B, K), (B, V) -> (B,).

    A lower bound on the exact KL (bins merged), exact when p has no mass outside its top k.
    """
    q_top = q_logp.gather(-1, top_index)
    p = p_top_logp.exp()
    top = (p * (p_top_logp - q_top)).sum(-1)
    p_rest = (1 - p.sum(-1)).clamp_min(0)
    q_rest = (1 - q_top.exp().sum(-1)).clamp_min(1e-12)
    rest = p_rest * (p_rest.clamp_min(1e-12).log() - q_rest.log())
    return top + torch.where(p_rest > 1e-9, rest, torch.zeros_like(rest))


def _step_scores(logits: torch.Tensor, target: torch.Tensor, top_logp, top_index, valid):
    """(n, V) logits against the reference's token and dense top-k at one position each ->
    (n,) KL(dense ‖ method) and NLL of the reference token, zero where not `valid`."""
    logp = logits.float().log_softmax(-1)
    valid = valid.to(torch.float64)
    nll = -logp.gather(-1, target[:, None]).squeeze(-1).double() * valid
    return binned_kl(top_logp, top_index, logp).double() * valid, nll


def _quality_rows(n: torch.Tensor, nll_dense: torch.Tensor, nll, kl) -> list[dict]:
    """Per row: reference length and mean NLL (dense, method), its increase and mean KL."""
    n = n.double()
    rows = zip(n.tolist(), (nll_dense.double() / n).tolist(), (nll / n).tolist(),
               (kl / n).tolist())  # fmt: skip
    return [
        {"tokens": int(t), "nll_dense": a, "nll": b, "nll_increase": b - a, "kl": k}
        for t, a, b, k in rows
    ]


def forced_quality(
    runner: BatchedRunner,
    ids: torch.Tensor,
    attn: torch.Tensor,
    ref: DenseReference,
    traces: bool = False,
) -> list[dict]:
    """Per row: reference length, mean NLL under dense and under the runner's method, mean KL;
    with `traces` (`quality.traces`) also the KL and NLL of every reference token, which show
    where along the reference the method leaves dense (`make view` draws them)."""
    ref = ref.to(runner.device)
    batch = ids.shape[0]
    nll = torch.zeros(batch, dtype=torch.float64, device=runner.device)
    kl = torch.zeros_like(nll)
    steps: list[tuple[torch.Tensor, torch.Tensor]] = []  # (B,) KL and NLL per position

    def observe(i: int, logits: torch.Tensor) -> None:
        valid = i < ref.forcing.lengths
        target = ref.forcing.tokens[:, i]
        step_kl, step_nll = _step_scores(
            logits, target, ref.top_logp[:, i], ref.top_index[:, i], valid
        )
        nll.add_(step_nll)
        kl.add_(step_kl)
        if traces:
            steps.append((step_kl, step_nll))

    runner.generate_tokens(ids, attn, forced=ref.forcing, observe=observe)
    out = _quality_rows(ref.forcing.lengths, ref.nll, nll, kl)
    if traces:
        _add_traces(out, steps)
    return out


def stream_quality(
    stream: StreamRunner, prompts: list[torch.Tensor], refs: list[DenseReference], traces: bool
) -> list[dict]:
    """`forced_quality` of work streamed through continuously refilled slots
    (`generation.batching=continuous`): each prompt's reference (a one-row `DenseReference`)
    is fed through the stream, so the method prunes as it does while generating that stream."""
    device = stream.runner.device
    lengths = torch.tensor([int(r.forcing.lengths[0]) for r in refs], device=device)
    n, k = int(lengths.max()), refs[0].top_logp.shape[-1]
    tokens = torch.zeros(len(refs), n, dtype=torch.long, device=device)
    top_logp = torch.zeros(len(refs), n, k, device=device)
    top_index = torch.zeros(len(refs), n, k, dtype=torch.long, device=device)
    for i, r in enumerate(refs):
        m = int(lengths[i])
        tokens[i, :m] = r.forcing.tokens[0, :m]
        top_logp[i, :m], top_index[i, :m] = r.top_logp[0, :m], r.top_index[0, :m]
    kl = torch.zeros(len(refs), n, dtype=torch.float64, device=device)  # per item and position
    nll = torch.zeros_like(kl)

    def observe(items: torch.Tensor, index: torch.Tensor, logits: torch.Tensor) -> None:
        at = index.clamp(max=n - 1)
        step_kl, step_nll = _step_scores(logits, tokens[items, at], top_logp[items, at],
                                         top_index[items, at], index < lengths[items])  # fmt: skip
        kl[items, at] += step_kl
        nll[items, at] += step_nll

    forced = [tokens[i, : int(lengths[i])] for i in range(len(refs))]
    stream.run(prompts, lambda *_: None, forced=forced, observe=observe)
    nll_dense = torch.cat([r.nll for r in refs]).to(device)
    out = _quality_rows(lengths, nll_dense, nll.sum(1), kl.sum(1))
    if traces:
        _add_traces(out, list(zip(kl.unbind(1), nll.unbind(1))))
    return out


def _add_traces(rows: list[dict], steps: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Per row, the KL and NLL of each reference token, at 4 decimals: traces are large."""
    kl = torch.stack([k for k, _ in steps], 1).tolist()  # (B, N)
    nll = torch.stack([n for _, n in steps], 1).tolist()
    for row, row_kl, row_nll in zip(rows, kl, nll):
        n = row["tokens"]
        row["trace"] = {
            "kl": [round(v, 4) for v in row_kl[:n]],
            "nll": [round(v, 4) for v in row_nll[:n]],
        }
