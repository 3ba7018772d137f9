"""The batched generation loop: left-padded prefill, then decode steps on the HF KV cache.

It is explicit rather than `model.generate` because methods need the step index, which tokens are
valid and which rows have finished at every forward, and because prefill and decode are timed
separately. For the `dense` method its greedy tokens equal `model.generate(do_sample=False)`.
Every forward goes through `bwprune.engine.protocol.MethodDriver`, which alone calls the method's
hooks and records realized sparsity; the runner names no method and never scores answers.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedTokenizerBase

from bwprune.engine.ledger import SparsityLedger
from bwprune.engine.protocol import MethodDriver
from bwprune.generation.timing import StepTimer
from bwprune.methods.base import PruningMethod
from bwprune.models.adapters import ModelAdapter


@dataclass
class Completion:
    text: str
    token_ids: list[int]  # generated ids, the stop token included when there is one
    finish_reason: str  # "stop" (a stop token or stop string) | "length" (max_new_tokens)
    sparsity: dict  # this row's `SparsityLedger` summary

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class BatchTiming:
    prefill_s: float
    decode_s: float
    decode_tokens: int  # tokens produced by decode steps for rows still running
    step_s: list[float] = field(default_factory=list)

    @property
    def median_step_ms(self) -> float:
        return 1e3 * statistics.median(self.step_s) if self.step_s else 0.0


@dataclass(frozen=True)
class Forcing:
    """A reference continuation to feed instead of sampling (teacher forcing)."""

    tokens: torch.Tensor  # (B, N) reference ids, padded past each row's length
    lengths: torch.Tensor  # (B,) reference length per row (>= 1)


@dataclass(frozen=True)
class SamplingConfig:
    max_new_tokens: int
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    ignore_eos: bool = False  # always generate max_new_tokens (speed runs: equal work per method)


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

    def hits(self, generated: list[torch.Tensor], finished: torch.Tensor) -> torch.Tensor:
        """(B,) bool: the running rows whose latest tokens complete a stop string."""
        tail = torch.stack(generated[-self.window :], dim=1).tolist()
        hit = [
            not done and any(s in self.tokenizer.decode(row) for s in self.strings)
            for row, done in zip(tail, finished.tolist())
        ]
        return torch.tensor(hit, dtype=torch.bool, device=finished.device)


class BatchedRunner:
    """Generates completions for a batch of prompt strings under one pruning method."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        method: PruningMethod,
        adapter: ModelAdapter,
        sampling: SamplingConfig,
        seed: int = 0,
        ledger: SparsityLedger | None = None,
    ) -> None:
        """`ledger`: built before the method's `prepare` when that changes the model's shape."""
        self.model, self.tokenizer, self.method = model, tokenizer, method
        self.sampling = sampling
        self.device = next(model.parameters()).device
        self.ledger = ledger or SparsityLedger(adapter, self.device)
        self.driver = MethodDriver(method, self.ledger)
        stops = [] if sampling.ignore_eos else stop_token_ids(model, tokenizer)
        self.stop_ids = torch.tensor(stops, dtype=torch.long, device=self.device)
        self.pad_id = tokenizer.pad_token_id
        # One generator per run, seeded once: sampled runs are reproducible batch after batch.
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

    def _next_token(self, logits: torch.Tensor) -> torch.Tensor:
        """(B, V) logits of the last position -> (B,) token ids."""
        s = self.sampling
        if not s.do_sample:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits.float() / s.temperature, dim=-1)
        if s.top_p < 1.0:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            # keep the smallest prefix whose mass reaches top_p (the top token always survives)
            drop = sorted_p.cumsum(dim=-1) - sorted_p > s.top_p
            probs = probs.scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)

    def _pick(self, i: int, logits: torch.Tensor, forced: Forcing | None, observe) -> torch.Tensor:
        """The i-th new token of every row: the model's choice, or the reference's."""
        if observe is not None:
            observe(i, logits)
        return self._next_token(logits) if forced is None else forced.tokens[:, i]

    def _ends(self, i: int, token: torch.Tensor, forced: Forcing | None) -> torch.Tensor:
        """(B,) rows that end with their i-th new token."""
        if forced is None:
            return torch.isin(token, self.stop_ids)
        return forced.lengths <= i + 1

    def encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompt texts (already chat-templated) -> left-padded (B, T) ids and attention mask."""
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        return enc.input_ids, enc.attention_mask

    def generate(self, prompts: list[str]) -> tuple[list[Completion], BatchTiming]:
        """Completions for prompt texts (already chat-templated), left-padded into one batch."""
        return self.generate_tokens(*self.encode(prompts))

    @torch.inference_mode()
    def generate_tokens(
        self,
        ids: torch.Tensor,
        attn: torch.Tensor,
        stop_strings: Sequence[str] = (),
        forced: Forcing | None = None,
        observe: Callable[[int, torch.Tensor], None] | None = None,
    ) -> tuple[list[Completion], BatchTiming]:
        """Completions for (B, T) left-padded token ids and their attention mask.

        A row stops at a stop token, or once its text contains one of `stop_strings` (the text
        then still holds the stop string: callers that want it gone cut it, as lm-eval does).
        With `forced`, the next token is the reference's instead of the model's choice (teacher
        forcing through the very same prefill/decode schedule); a row ends with its reference.
        `observe(i, logits)` sees the (B, V) logits that predict every row's i-th new token.
        """
        stops = StopStrings(self.tokenizer, stop_strings) if stop_strings else None
        ids, attn = ids.to(self.device), attn.to(self.device)
        batch = ids.shape[0]
        positions = (attn.cumsum(-1) - 1).clamp(min=0)  # left padding: real tokens start at 0
        cache = DynamicCache(config=self.model.config)
        self.driver.start(batch)
        timer = StepTimer(self.device)

        timer.mark()
        logits = self.driver.prefill(attn.bool(), partial(
            self._forward, cache, input_ids=ids, attention_mask=attn, position_ids=positions,
            logits_to_keep=1,
        ))  # fmt: skip
        token = self._pick(0, logits, forced, observe)
        timer.mark()
        generated = [token]
        finished = self._ends(0, token, forced)
        if stops:
            finished |= stops.hits(generated, finished)
        lengths = torch.ones(batch, dtype=torch.long, device=self.device)  # tokens per row
        position = positions[:, -1:]

        steps = self.sampling.max_new_tokens if forced is None else forced.tokens.shape[1]
        for step in range(steps - 1):
            if bool(finished.all()):
                break
            attn = torch.cat([attn, attn.new_ones(batch, 1)], dim=-1)
            position = position + 1
            active = ~finished
            logits = self.driver.decode(step, finished, partial(
                self._forward, cache, input_ids=token[:, None], attention_mask=attn,
                position_ids=position,
            ))  # fmt: skip
            token = self._pick(step + 1, logits, forced, observe)
            token = token.masked_fill(finished, self.pad_id)
            generated.append(token)
            lengths += active
            finished = finished | self._ends(step + 1, token, forced)
            if stops:
                finished |= stops.hits(generated, finished)
            timer.mark()

        intervals = timer.intervals_s()
        completions = self._completions(torch.stack(generated, dim=1), lengths, finished)
        timing = BatchTiming(
            prefill_s=intervals[0],
            decode_s=sum(intervals[1:]),
            decode_tokens=sum(c["decode_steps"] for c in (x.sparsity for x in completions)),
            step_s=intervals[1:],
        )
        return completions, timing

    def _forward(self, cache: DynamicCache, **inputs: torch.Tensor | int) -> torch.Tensor:
        """One forward on the KV cache -> (B, V) logits of the last position."""
        return self.model(**inputs, cache=cache, use_cache=True).logits[:, -1]

    def _completions(
        self, tokens: torch.Tensor, lengths: torch.Tensor, finished: torch.Tensor
    ) -> list[Completion]:
        """(B, N) generated ids -> each row's first `lengths[b]` ids; text without a stop token."""
        stop_ids = set(self.stop_ids.tolist())
        rows = zip(tokens.tolist(), lengths.tolist(), finished.tolist(), self.driver.rows())
        out = []
        for row, n, done, sparsity in rows:
            ids = row[:n]
            text = self.tokenizer.decode(ids[:-1] if ids[-1] in stop_ids else ids)
            out.append(Completion(text, ids, "stop" if done else "length", sparsity))
        return out
