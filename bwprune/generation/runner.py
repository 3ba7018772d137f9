"""The batched generation loop: left-padded prefill, then decode steps on a KV cache.

It is explicit rather than `model.generate` because methods need the step index, which tokens are
valid and which rows have finished at every forward, and because prefill and decode are timed
separately. For the `dense` method its greedy tokens equal `model.generate(do_sample=False)`.
Every forward goes through `bwprune.engine.protocol.MethodDriver`, which alone attaches the
method, calls its hooks and records realized sparsity; the engine's parts (static KV cache,
compiled step, live-row compaction, stopping) live in `bwprune.engine`. The runner names no
method and scores nothing.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from bwprune.engine.cache import CachePool, SlotCache
from bwprune.engine.ledger import SparsityLedger
from bwprune.engine.protocol import MethodDriver
from bwprune.engine.rows import GenerationRows
from bwprune.engine.step import DecodeStep, resolve_compile
from bwprune.engine.stopping import StopStrings, stop_token_ids
from bwprune.generation.timing import StepTimer
from bwprune.methods.base import PruningMethod
from bwprune.methods.hf_host import HFHost
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
    phases: dict = field(default_factory=dict)  # the host's `PhaseLog.summary` of the steps

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

    @classmethod
    def from_config(cls, gen: Mapping, max_new_tokens: int | None = None) -> SamplingConfig:
        """From the run config's `generation` node; `max_new_tokens` replaces its length."""
        length = gen.max_new_tokens if max_new_tokens is None else max_new_tokens
        return cls(int(length), bool(gen.do_sample), float(gen.temperature), float(gen.top_p))


@dataclass(frozen=True)
class EngineConfig:
    """How the decode loop runs; never what it computes (completions are the same either way,
    tested token for token), so these settings are not part of a run's identity."""

    kv_cache: str = "static"  # static (preallocated, pooled) | dynamic (HF DynamicCache)
    compile: bool = False  # decode step under torch.compile (CUDA: CUDA graphs)
    compaction: bool = True  # drop finished rows at power-of-two live counts
    backend: str = "inductor"  # torch.compile backend (eager / aot_eager to debug capture)

    @classmethod
    def from_config(cls, gen: Mapping, device: torch.device) -> EngineConfig:
        """From the run config's `generation` node (conf/config.yaml documents the keys)."""
        return cls(str(gen.kv_cache), resolve_compile(gen.compile, device),
                   bool(gen.compaction), str(gen.compile_backend))  # fmt: skip


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
        engine: EngineConfig = EngineConfig(),
        batch_invariant: bool = False,
        kept_weights: str = "buffers",
    ) -> None:
        """`ledger`: built before the method's `prepare` when that changes the model's shape.
        `batch_invariant`: every row is computed alone (`generate_tokens`). `kept_weights`: where
        a kept set's weights live (`generation.kept_weights`: buffers | in_place)."""
        self.model, self.tokenizer, self.method = model, tokenizer, method
        self.sampling, self.engine = sampling, engine
        self.batch_invariant = batch_invariant
        self.device = next(model.parameters()).device
        self.ledger = ledger or SparsityLedger(adapter, self.device)
        self.driver = MethodDriver(method, model, adapter, self.ledger,
                                   HFHost(method, kept_weights))  # fmt: skip
        self.caches = CachePool(model, engine.kv_cache)
        self.step = DecodeStep(model, engine.compile, engine.backend)
        stops = [] if sampling.ignore_eos else stop_token_ids(model, tokenizer)
        self.stop_ids = torch.tensor(stops, dtype=torch.long, device=self.device)
        self.pad_id = tokenizer.pad_token_id
        # One generator per run, seeded once: sampled runs are reproducible batch after batch.
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

    def next_token(self, logits: torch.Tensor) -> torch.Tensor:
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

    def _pick(self, i: int, logits: torch.Tensor, forced: Forcing | None, observe, rows):
        """The i-th new token of every computed row: the model's choice, or the reference's.
        `observe` sees the logits of every row of the batch in its original order."""
        if observe is not None:
            observe(i, rows.full(logits))
        return self.next_token(logits) if forced is None else forced.tokens[:, i]

    def _ends(self, i: int, token: torch.Tensor, forced: Forcing | None) -> torch.Tensor:
        """(n,) computed rows that end with their i-th new token."""
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
        progress: Callable[[int, int], None] | None = None,
    ) -> tuple[list[Completion], BatchTiming]:
        """Completions for (B, T) left-padded token ids and their attention mask.

        A row stops at a stop token, or once its text contains one of `stop_strings` (the text
        then still holds the stop string: callers that want it gone cut it, as lm-eval does).
        With `forced`, the next token is the reference's instead of the model's choice (teacher
        forcing through the very same prefill/decode schedule); a row ends with its reference.
        `observe(i, logits)` sees the (B, V) logits that predict every row's i-th new token.
        `progress(step, live rows)` is called before every decode step (host values the loop has
        anyway: it adds no sync).

        With `batch_invariant`, each row is generated alone, unpadded, one after the other: its
        computation is then that of a batch of 1 whatever else is in the batch, bit for bit
        (batched float matmuls differ from batch-1 ones in the last bits, which flip
        near-threshold activations and compound). It costs the batching: the rows' decode
        steps run in sequence, and the timing says so.
        """
        if self.batch_invariant and ids.shape[0] > 1:
            return self._row_by_row(ids, attn, stop_strings, forced, observe, progress)
        with self.driver.attached():
            return self._generate(ids, attn, stop_strings, forced, observe, progress)

    def _generate(self, ids, attn, stop_strings, forced, observe, progress):
        """`generate_tokens` of one batch, the method attached."""
        stops = StopStrings(self.tokenizer, stop_strings) if stop_strings else None
        ids, attn = ids.to(self.device), attn.to(self.device)
        batch = ids.shape[0]
        steps = self.sampling.max_new_tokens if forced is None else forced.tokens.shape[1]
        positions = (attn.cumsum(-1) - 1).clamp(min=0)  # left padding: real tokens start at 0
        cache = self.caches.get(batch, ids.shape[1] + steps)
        rows = GenerationRows(batch, steps, self.pad_id, self.device)
        self.driver.start(batch)
        timer = StepTimer(self.device)

        timer.mark()
        logits = self.driver.prefill(attn.bool(), partial(
            self.prefill_logits, cache, input_ids=ids, attention_mask=cache.start(attn),
            position_ids=positions,
        ))  # fmt: skip
        token = self._pick(0, logits, forced, observe, rows)
        rows.record(0, token, torch.ones_like(token, dtype=torch.bool))
        finished = self._ends(0, token, forced)
        if stops:
            finished |= stops.hits(rows.tail(0, stops.window), finished)
        timer.mark()
        position = positions[:, -1:]

        for step in range(steps - 1):
            live = int((~finished).sum())  # the loop's one host sync per step
            if live == 0:
                break
            if progress is not None:
                progress(step, live)
            keep = rows.compaction(finished, live) if self.engine.compaction else None
            if keep is not None:
                cache, token, position, finished, forced = self._compact(
                    rows, keep, cache, token, position, finished, forced
                )
            mask = cache.advance()
            position = position + 1
            active = ~finished
            logits = self.driver.decode(
                step, finished, partial(self.step, cache, token, mask, position)
            )
            token = self._pick(step + 1, logits, forced, observe, rows)
            token = token.masked_fill(finished, self.pad_id)
            rows.record(step + 1, token, active)
            finished = finished | self._ends(step + 1, token, forced)
            if stops:
                finished |= stops.hits(rows.tail(step + 1, stops.window), finished)
            timer.mark()

        rows.stop(finished)
        intervals = timer.intervals_s()
        completions = self._completions(rows)
        timing = BatchTiming(
            prefill_s=intervals[0],
            decode_s=sum(intervals[1:]),
            decode_tokens=sum(c["decode_steps"] for c in (x.sparsity for x in completions)),
            step_s=intervals[1:],
            phases=self.driver.host.log.summary(intervals[1:]),
        )
        return completions, timing

    def _row_by_row(self, ids, attn, stop_strings, forced, observe, progress):
        """`generate_tokens` row by row (`batch_invariant`); `observe` still sees (B, V) logits
        of every row at once, in order (a row that has ended reads zeros)."""
        seen: list[list[torch.Tensor]] = []
        completions, timings = [], []
        for b in range(ids.shape[0]):
            own = attn[b].bool()
            one = None if forced is None else Forcing(forced.tokens[b : b + 1],
                                                      forced.lengths[b : b + 1])  # fmt: skip
            logits: list[torch.Tensor] = []
            record = None if observe is None else (lambda i, x, kept=logits: kept.append(x[0]))
            c, t = self.generate_tokens(
                ids[b : b + 1, own], attn[b : b + 1, own], stop_strings, one, record, progress
            )
            completions += c
            timings.append(t)
            seen.append(logits)
        if observe is not None:
            for i in range(max(map(len, seen))):
                observe(i, torch.stack([r[i] if i < len(r) else torch.zeros_like(r[0])
                                        for r in seen]))  # fmt: skip
        return completions, BatchTiming(
            prefill_s=sum(t.prefill_s for t in timings),
            decode_s=sum(t.decode_s for t in timings),
            decode_tokens=sum(t.decode_tokens for t in timings),
            step_s=[s for t in timings for s in t.step_s],
        )

    def _compact(self, rows, keep, cache, token, position, finished, forced):
        """Only the computed rows `keep` go on: the method's and the ledger's row state, the KV
        cache (copied into the pooled cache of the smaller shape) and the loop's tensors."""
        self.driver.keep_rows(keep)
        smaller = self.caches.get(len(keep), cache.length)
        smaller.copy_rows(cache, keep)
        rows.stop(finished)  # the rows that leave have stopped: say so while they are indexed
        rows.keep(keep)
        if forced is not None:
            forced = Forcing(forced.tokens[keep], forced.lengths[keep])
        return smaller, token[keep], position[keep], finished[keep], forced

    def prefill_logits(self, cache: SlotCache, **inputs: torch.Tensor) -> torch.Tensor:
        """The prompt forward, eager (prompt lengths vary) -> (B, V) logits of the last position."""
        out = self.model(**inputs, **cache.inputs(), logits_to_keep=1)
        return out.logits[:, -1]

    def _completions(self, rows: GenerationRows) -> list[Completion]:
        """Each row's first `lengths[b]` generated ids."""
        per_row = zip(rows.tokens.tolist(), rows.lengths.tolist(), rows.stopped.tolist(),
                      self.driver.rows())  # fmt: skip
        return [self.completion(row[:n], done, sparsity) for row, n, done, sparsity in per_row]

    def completion(self, ids: list[int], stopped: bool, sparsity: dict) -> Completion:
        """A row's generated `ids` as a completion; its text without a stop token."""
        ends = bool(ids) and ids[-1] in self.stop_ids.tolist()
        text = self.tokenizer.decode(ids[:-1] if ends else ids)
        return Completion(text, ids, "stop" if stopped else "length", sparsity)
