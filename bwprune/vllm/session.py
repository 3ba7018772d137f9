"""Per forward: which requests vLLM runs, which of their tokens are prompt or decode, and the
method's lifecycle driven from that.

The plugin's model hands every forward to the bound `Session` (`bwprune.vllm.plugin`). The
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
protocol. Any other forward — a prompt split over forwards (chunked prefill), prompts that join
a running batch, a forward mixing prompt and decode tokens — is refused with one line: that is a
server's batch (continuous batching), which this host does not run yet.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from bwprune.engine.protocol import MethodDriver
from bwprune.errors import UserError
from bwprune.generation.timing import StepTimer
from bwprune.vllm.host import VLLMHost

T = TypeVar("T")


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
        `bwprune.vllm.runner`, so a method that reads prompts always sees them whole)."""
        return all(c < p and c + self.scheduled(i) == p
                   for i, (c, p) in enumerate(zip(self.computed, self.prompt)))  # fmt: skip

    @property
    def decode(self) -> bool:
        """Every request runs one token past its prompt."""
        return all(self.scheduled(i) == 1 and c >= p
                   for i, (c, p) in enumerate(zip(self.computed, self.prompt)))  # fmt: skip

    def describe(self) -> str:
        rows = zip(self.req_ids, self.computed, self.prompt)
        return "; ".join(f"{r}: {self.scheduled(i)} token(s) from position {c}, prompt {p}"
                         for i, (r, c, p) in enumerate(rows))  # fmt: skip


class Session:
    """One method's driver bound to a vLLM model for static-batch generations."""

    def __init__(self, driver: MethodDriver, host: VLLMHost, runner, device: torch.device,
                 progress: Callable[[int, int], None] | None = None) -> None:  # fmt: skip
        """One static batch (its requests all queued before its first forward). `runner`:
        vLLM's model runner (its input batch says what each forward runs); `progress(step,
        live rows)` is called before every decode forward."""
        self.driver, self.host, self.runner, self.progress = driver, host, runner, progress
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
        lengths = torch.tensor([batch.scheduled(i) for i in range(len(self.slots))], device=device)
        width = int(lengths.max())
        valid = torch.arange(width, device=device)[None] >= (width - lengths)[:, None]
        padded = batch.tokens != batch.starts[-1]  # slot order is vLLM's: only padding differs
        self.host.place(torch.arange(batch.starts[-1], device=device) if padded else None)
        return self.driver.prefill(valid, run)

    def _decode(self, batch: ForwardBatch, present: set[str], device: torch.device,
                run: Callable[[], T]) -> T:  # fmt: skip
        if len(present) < len(self.slots):  # finished requests left vLLM's batch
            keep = [i for i, r in enumerate(self.slots) if r in present]
            self.driver.keep_rows(torch.tensor(keep, device=device))
            self.slots = [self.slots[i] for i in keep]
        where = {r: batch.starts[i] for i, r in enumerate(batch.req_ids)}
        order = [where[r] for r in self.slots]
        same = order == list(range(len(order))) and batch.tokens == len(order)
        self.host.place(None if same else torch.tensor(order, device=device))
        if self.progress is not None:
            self.progress(self.step, len(self.slots))
        finished = torch.zeros(len(self.slots), dtype=torch.bool, device=device)
        out = self.driver.decode(self.step, finished, lambda capturable: run())
        self.step += 1
        return out
