"""Per forward: which requests vLLM runs, which of their tokens are prompt or decode, and the
method's lifecycle driven from that.

The plugin's model hands every forward to the bound `Session` (`bwprune.vllm.binding.plugin`). The
session reads the model runner's input batch — request ids, each request's scheduled tokens,
tokens computed before, prompt length — and decides per token: a token is a decode token when its
position is at or past its request's prompt (a one-token prompt chunk is still prompt). Then it
calls the driver as the HF loop does (`bwprune.engine.protocol.MethodDriver`):

- the generation's first forward, every request's prompt (whole, or past a cached prefix):
  `start(B)` and `prefill`, slots 0..B-1 in vLLM's order;
- a decode forward, one token per request: `decode`; requests that finished since the previous
  forward have left the batch (`keep_rows`, the same compaction the HF loop does at power-of-two
  live counts: a finished row neither counts nor steers either way).

So a static batch (every request queued before the first forward) runs the method's exact
protocol (`Session`). A stream — requests that join a running batch, as a server's do — runs the
continuous-batching protocol of the HF stream (`StreamSession`, `bwprune.generation.stream`):
`max_num_seqs` slots, a finished request leaves its slot (`leave`), arriving requests take free
slots with their prompts' forward (`enter`), decode forwards run the occupied slots. Its forwards
must each be all prompts or all decode steps, which vLLM's own scheduler does not promise (it
mixes them, and chunks long prompts): `bwprune.vllm.binding.scheduler.UnmixedScheduler` does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import torch

from bwprune.engine.protocol import MethodDriver
from bwprune.errors import UserError
from bwprune.generation.runner import BatchTiming
from bwprune.generation.stream import Laps
from bwprune.generation.timing import StepTimer
from bwprune.vllm.binding.host import VLLMHost

T = TypeVar("T")
PREEMPTED_ROOM = 2  # a stream's slots per vLLM seat (`StreamSession`)


@dataclass(frozen=True)
class ForwardBatch:
    """The requests of one vLLM forward, in vLLM's order."""

    req_ids: list[str]
    starts: list[int]  # (R + 1,) where each request's tokens start in the forward; then the end
    computed: list[int]  # (R,) tokens of each request computed before this forward
    prompt: list[int]  # (R,) prompt length of each request
    tokens: int  # tokens the forward runs (vLLM may pad past starts[-1])

    @classmethod
    def read(cls, runner, positions: torch.Tensor) -> ForwardBatch:
        """From vLLM's model runner, during its forward."""
        batch = runner.input_batch
        n = batch.num_reqs
        return cls(
            list(batch.req_ids[:n]),
            runner.query_start_loc.np[: n + 1].tolist(),
            batch.num_computed_tokens_cpu[:n].tolist(),
            batch.num_prompt_tokens[:n].tolist(),
            int(positions.shape[0]),
        )

    def scheduled(self, i: int) -> int:
        return self.starts[i + 1] - self.starts[i]

    @property
    def prompts(self) -> bool:
        """Every request runs the rest of its prompt, nothing else: all of it, or what follows
        a cached prefix (prefix caching is on only for methods that do not decide per forward,
        `bwprune.vllm.running.runner`, so a method that reads prompts always sees them whole)."""
        return all(c < p and c + self.scheduled(i) == p
                   for i, (c, p) in enumerate(zip(self.computed, self.prompt)))  # fmt: skip

    @property
    def decode(self) -> bool:
        """Every request runs one token past its prompt."""
        return all(self.scheduled(i) == 1 and c >= p
                   for i, (c, p) in enumerate(zip(self.computed, self.prompt)))  # fmt: skip

    def entering(self, slots: list[str | None], ran: dict[str, int]) -> bool:
        """Requests arrive in this forward, each running its prompt to the end: requests new to
        the stream, or ones vLLM preempted, recomputed into the slots they kept. `ran`: tokens
        each seated request had computed after its last forward; a recomputed one counts fewer
        now (from its first token, or, under prefix caching, from past a cached prefix). vLLM
        seats resumed requests only in such forwards, so one whose every token but the last was
        still cached, which alone would be a decode step, enters with them."""
        rows = list(zip(self.req_ids, self.computed, self.prompt))
        arriving = any(r not in slots or c < ran.get(r, 0) for r, c, _ in rows)
        return arriving and all(c + self.scheduled(i) >= p for i, (_, c, p) in enumerate(rows))

    def describe(self) -> str:
        rows = zip(self.req_ids, self.computed, self.prompt)
        return "; ".join(f"{r}: {self.scheduled(i)} token(s) from position {c}, prompt {p}"
                         for i, (r, c, p) in enumerate(rows))  # fmt: skip


def place_prompts(batch: ForwardBatch, host: VLLMHost, device: torch.device) -> torch.Tensor:
    """A prompt forward's (R, T) left-padded `valid` mask, its rows in vLLM's order; the host is
    told where the method's tokens are (only vLLM's padding past them differs)."""
    lengths = torch.tensor([batch.scheduled(i) for i in range(len(batch.req_ids))], device=device)
    width = int(lengths.max())
    padded = batch.tokens != batch.starts[-1]
    host.place(torch.arange(batch.starts[-1], device=device) if padded else None, batch.tokens)
    return torch.arange(width, device=device)[None] >= (width - lengths)[:, None]


class Session:
    """One method's driver bound to a vLLM model for static-batch generations."""

    def __init__(self, driver: MethodDriver, host: VLLMHost, runner, device: torch.device) -> None:
        """One static batch (its requests all queued before its first forward). `runner`:
        vLLM's model runner (its input batch says what each forward runs)."""
        self.driver, self.host, self.runner = driver, host, runner
        self.slots: list[str] = []  # the request in each slot
        self.rows: list[str] = []  # the requests the generation started with, in slot order
        self.timer = StepTimer(device)
        self.step = 0

    def forward(self, positions: torch.Tensor, run: Callable[[], T]) -> T:
        batch = ForwardBatch.read(self.runner, positions)
        if not self.slots and batch.prompts:
            self.timer.mark()
            return self._prefill(batch, positions.device, run)
        present = set(batch.req_ids)
        if self.slots and batch.decode and present <= set(self.slots):
            self.timer.mark()
            return self._decode(batch, present, positions.device, run)
        raise UserError(
            "the vLLM host runs static batches (every prompt whole in the first forward, then "
            "one token per request); this forward is a server's batch (chunked prefill or "
            f"requests joining a running batch): {batch.describe()}"
        )

    def ledger_rows(self) -> dict[str, dict]:
        """The generation's per-request ledger summaries, by the request id `LLM.generate`
        reports (the engine's own id adds a suffix: `<id>-<8 random characters>`)."""
        return {r.rsplit("-", 1)[0]: row for r, row in zip(self.rows, self.driver.rows())}

    def times(self) -> tuple[float, list[float]]:
        """Seconds of the prefill and of each decode step, each from the start of its forward to
        the start of the next (the end of the generation for the last): the model and all vLLM
        does around it (scheduling, sampling), as the HF loop's step times include its own."""
        intervals = self.timer.intervals_s()
        return (intervals[0] if intervals else 0.0), intervals[1:]

    def end_generation(self) -> None:
        """`LLM.generate` returned: the last step's time ends here."""
        self.timer.mark()

    def _prefill(self, batch: ForwardBatch, device: torch.device, run: Callable[[], T]) -> T:
        self.slots, self.rows = list(batch.req_ids), list(batch.req_ids)
        self.driver.start(len(self.slots))
        return self.driver.prefill(place_prompts(batch, self.host, device), run)

    def _decode(self, batch: ForwardBatch, present: set[str], device: torch.device,
                run: Callable[[], T]) -> T:  # fmt: skip
        if len(present) < len(self.slots):  # finished requests left vLLM's batch
            keep = [i for i, r in enumerate(self.slots) if r in present]
            self.driver.keep_rows(torch.tensor(keep, device=device))
            self.slots = [self.slots[i] for i in keep]
        where = {r: batch.starts[i] for i, r in enumerate(batch.req_ids)}
        order = [where[r] for r in self.slots]
        same = order == list(range(len(order))) and batch.tokens == len(order)
        self.host.place(None if same else torch.tensor(order, device=device), batch.tokens)
        finished = torch.zeros(len(self.slots), dtype=torch.bool, device=device)
        out = self.driver.decode(self.step, finished, lambda capturable: run())
        self.step += 1
        return out


class StreamSession:
    """One method's driver bound to a vLLM model for a stream: requests arrive at any time (a
    server's, or an offline stream's `max_num_seqs` at a time), each runs in a slot of its own
    while it lasts, as in `bwprune.generation.stream`."""

    def __init__(self, driver: MethodDriver, host: VLLMHost, runner, device: torch.device,
                 slots: int, on_leave: Callable[[str, dict], None] | None = None,
                 timed: bool = True) -> None:  # fmt: skip
        """`slots`: vLLM's `max_num_seqs`; `on_leave(request id, ledger summary)` is called as
        each request leaves the stream (a server's; without it, `release` hands summaries back);
        `timed`: forwards are timed for `take` (a server never takes them, and an endless
        stream's marks would pile up).

        The method gets `PREEMPTED_ROOM` times as many slots as vLLM has seats: a request vLLM
        preempts (its KV cache full) keeps its slot and its ledger while it waits, to be
        recomputed whole into that slot, and meanwhile vLLM may seat new requests (its waiting
        queue skips a preempted request that is not ready to resume). A slot no request runs in
        sits out every forward, so the extra slots change no decision."""
        self.driver, self.host, self.runner = driver, host, runner
        self.on_leave, self.device = on_leave, device
        slots *= PREEMPTED_ROOM
        self.slots: list[str | None] = [None] * slots  # the request in each slot
        self.summaries: dict[str, dict] = {}  # request id -> ledger summary, left, not released
        self.ran: dict[str, int] = {}  # request id -> tokens computed after its last forward
        self.step = 0  # decode forwards so far: the stream's clock
        driver.start(slots)  # a stream is one generation, its slots empty until requests come
        driver.leave(torch.arange(slots, device=device))
        self.laps = Laps(device) if timed else None
        self._running: tuple[str, int] | None = None  # the forward in flight: kind, tokens

    def forward(self, positions: torch.Tensor, run: Callable[[], T]) -> T:
        self._lap()
        batch = ForwardBatch.read(self.runner, positions)
        self._leave(set(self.runner.requests))
        entering = batch.entering(self.slots, self.ran)
        for i, request in enumerate(batch.req_ids):
            self.ran[request] = batch.computed[i] + batch.scheduled(i)
        if entering:
            self._running = ("prefill", 0)
            return self._enter(batch, positions.device, run)
        if batch.decode and set(batch.req_ids) <= set(self.slots):
            self._running = ("step", len(batch.req_ids))
            return self._decode(batch, positions.device, run)
        raise UserError(
            "a stream in vLLM needs forwards that are all prompts or all decode steps "
            "(vLLM's scheduler mixes them: run it with scheduler_cls="
            f"bwprune.vllm.binding.scheduler.UnmixedScheduler); this forward: {batch.describe()}"
        )

    def take(self) -> BatchTiming:
        """The time since the last `take` (the first forward for the first), split as the HF
        stream's (`bwprune.generation.stream.Laps`); until the next forward it is host time."""
        self._lap()
        timing = self.laps.take()
        self.laps.restart()
        self._running = ("host", 0)
        return timing

    def release(self, requests: list[str]) -> list[dict]:
        """`requests` (the ids they were added with) finished: they leave at once, before any
        request takes their seats, as rows leave the HF stream; their ledger summaries."""
        external = {r: r if r in requests else r.rsplit("-", 1)[0]
                    for r in self.slots if r is not None}  # fmt: skip
        self._leave({r for r, e in external.items() if e not in requests})
        internal = {external[r]: r for r in external}
        return [self.summaries.pop(internal[r]) for r in requests]

    def close(self) -> None:
        """The stream is over: every request still in a slot leaves."""
        self._leave(set())

    def _lap(self) -> None:
        if self.laps is None:
            return
        if self._running is None:
            self.laps.restart()
        else:
            self.laps.lap(*self._running)

    def _leave(self, known: set[str]) -> None:
        """Requests vLLM no longer holds (finished, aborted) leave their slots."""
        gone = [i for i, r in enumerate(self.slots) if r is not None and r not in known]
        if not gone:
            return
        summaries = self.driver.leave(torch.tensor(gone, device=self.device))
        for i, summary in zip(gone, summaries):
            request, self.slots[i] = self.slots[i], None
            self.ran.pop(request, None)
            if self.on_leave is None:
                self.summaries[request] = summary  # until `release` hands it back
            else:
                self.on_leave(request, summary)

    def _enter(self, batch: ForwardBatch, device: torch.device, run: Callable[[], T]) -> T:
        """Arriving requests take free slots in vLLM's order (a recomputed one keeps its own)."""
        free = [i for i, r in enumerate(self.slots) if r is None]
        new = [r for r in batch.req_ids if r not in self.slots]
        if len(new) > len(free):
            held = sum(r is not None for r in self.slots)
            raise UserError(
                f"{held} requests hold the stream's {len(self.slots)} slots ({PREEMPTED_ROOM}x "
                f"vLLM's seats, room for requests vLLM preempted) and {len(new)} more arrive: "
                "more requests are preempted than the method can follow; give vLLM a larger "
                "KV cache (generation.vllm.kv_cache_gib, serve.kv_cache_gib)"
            )
        taken = iter(free)
        slots = [self.slots.index(r) if r in self.slots else next(taken) for r in batch.req_ids]
        for slot, request in zip(slots, batch.req_ids):
            self.slots[slot] = request
        valid = place_prompts(batch, self.host, device)
        return self.driver.enter(torch.tensor(slots, device=device), valid, run)

    def _decode(self, batch: ForwardBatch, device: torch.device, run: Callable[[], T]) -> T:
        """One token for each request in the forward; every other slot sits this step out."""
        where = {r: batch.starts[i] for i, r in enumerate(batch.req_ids)}
        rows = [i for i, r in enumerate(self.slots) if r in where]
        order = [where[self.slots[i]] for i in rows]
        same = order == list(range(len(order))) and batch.tokens == len(order)
        self.host.place(None if same else torch.tensor(order, device=device), batch.tokens)
        finished = torch.ones(len(self.slots), dtype=torch.bool, device=device)
        finished[rows] = False
        out = self.driver.decode(self.step, finished, lambda capturable: run(),
                                 torch.tensor(rows, device=device))  # fmt: skip
        self.step += 1
        return out


@contextmanager
def bound(session: Session | StreamSession) -> Iterator[None]:
    """`session` drives every forward of its model while the block runs: its method's glue
    attached, the model's forwards going through it; on the way out unbound, then detached."""
    model = session.runner.model
    with session.driver.attached():
        model.bwprune_session = session
        try:
            yield
        finally:
            model.bwprune_session = None
