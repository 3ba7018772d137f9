"""The interface every pruning method implements (ours and all baselines): host-free decisions.

A method decides from tensors alone. It never sees a module, a hook or a padded (B, T) batch:
a *host* (`bwprune.methods.host`: the HuggingFace loop's, vLLM's model runner's) adapts what its
engine computes into what a method reads — the activations of the tokens that count, flat,
`(N, D)` with the row (slot) each token belongs to (`Tokens`) — and applies what the method
returns: a kept neuron set per layer, or a keep mask per token. Only
`bwprune.engine.protocol.MethodDriver` drives a method, in this order:

    setup(shape), prepare                    once: the model's shape; calibration, static pruning
    rows(RowsStart(B))                       a generation starts with B rows in slots 0..B-1
      begin_step(ctx) -> forward -> end_step(ctx)   every forward; `end_step`: what it skipped
      rows(RowsGathered(index))              live-row compaction: only slots `index` go on
      rows(RowsLeft(slots))                  a stream: rows finished; their slots are empty
      rows(RowsEntered(slots))               a stream: new rows took the empty slots; the next
                                             forward is their prompts' prefill alone

The base classes keep the plumbing (which slots hold a row, when each arrived, per-slot state
that follows compaction) and seal it: the hooks they implement as templates are listed in
`sealed`, and a subclass that overrides one fails at class creation, naming the hook meant for
it. A method author overrides at most four hooks (README, "Adding a pruning method").
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from bwprune.models.adapters import ModelAdapter


@dataclass(frozen=True)
class StepSparsity:
    """What one forward skipped: returned by `PruningMethod.end_step` (None = dense forward),
    read by the ledger (`bwprune.engine.ledger`).

    Valid until the next forward begins: a method may hand out tensors it reuses every step (the
    threshold methods do, for CUDA graphs), so a consumer that keeps one clones it.
    """

    ffn: torch.Tensor  # (L,) shared by the batch, or (B, L) per row: fraction of the FFN skipped
    params: torch.Tensor | None = None  # () or (B,): parameters skipped; None = FFN neurons only


class Phase(enum.Enum):
    PREFILL = "prefill"  # a prompt, or a scoring forward over given text
    DECODE = "decode"


@dataclass(frozen=True)
class RowsStart:
    """A generation starts: `size` rows take slots 0..size-1 (fresh scores, memory, schedule)."""

    size: int
    device: torch.device | str = "cpu"  # where per-slot state lives (the model's)


@dataclass(frozen=True)
class RowsGathered:
    """Live-row compaction: from the next forward on, slot i holds the row of old slot index[i]."""

    index: torch.Tensor  # (B',) ascending


@dataclass(frozen=True)
class RowsLeft:
    """A stream: the rows in `slots` finished; the slots stay, empty, until rows enter them."""

    slots: torch.Tensor


@dataclass(frozen=True)
class RowsEntered:
    """A stream: new rows took `slots`; the next forward is their prompts' prefill alone."""

    slots: torch.Tensor


RowEvent = RowsStart | RowsGathered | RowsLeft | RowsEntered


@dataclass(frozen=True)
class StepContext:
    """What a method is told about the forward that is about to run (or just ran).

    `finished` rows have stopped before this forward; `occupied` slots hold a row (in a stream an
    empty slot is both unoccupied and finished); `arrival` numbers the rows in the order they
    entered (0 for the rows a generation started with), so a method can tell who came when
    without tracking slots itself. During a PREFILL, `entering` names the slots whose prompts it
    runs (all of them when a generation starts).
    """

    phase: Phase
    step: int  # decode steps since the generation started (a stream's clock, not a row's)
    finished: torch.Tensor  # (B,) bool
    occupied: torch.Tensor  # (B,) bool
    arrival: torch.Tensor  # (B,) int64
    entering: torch.Tensor | None = None  # (k,) slots of this prefill; None for a decode step

    @property
    def batch_size(self) -> int:
        return self.finished.shape[0]


@dataclass(frozen=True)
class Tokens:
    """The tokens of one forward as a method sees them: flat, each with its row (slot).

    `counts` marks the tokens whose activations may steer a decision: a host that cannot drop a
    finished row's filler token from a forward (a compiled decode step has a fixed shape) passes
    it with counts False. During a PREFILL, `position` is each token's place in its row's prompt
    and `length` that prompt's length: a row's tokens need not be contiguous, nor all in one
    forward (chunked prefill).
    """

    rows: torch.Tensor  # (N,) int64
    counts: torch.Tensor  # (N,) bool
    position: torch.Tensor | None = None  # (N,) int64, PREFILL only
    length: torch.Tensor | None = None  # (N,) int64, PREFILL only


@dataclass(frozen=True)
class ModelShape:
    """What a method may know of the model without seeing it: the FFN width of every layer."""

    d_ff: tuple[int, ...]

    @classmethod
    def of(cls, adapter: ModelAdapter) -> ModelShape:
        return cls(tuple(f.d_ff for f in adapter.ffns()))


class Slots:
    """Which slots hold a row and when each arrived: kept by the base class for every method."""

    def __init__(self) -> None:
        self.occupied = torch.zeros(0, dtype=torch.bool)
        self.arrival = torch.zeros(0, dtype=torch.long)
        self.arrivals = 0  # rows that have entered since the generation started

    def apply(self, event: RowEvent) -> None:
        if isinstance(event, RowsStart):
            self.occupied = torch.ones(event.size, dtype=torch.bool, device=event.device)
            self.arrival = torch.zeros(event.size, dtype=torch.long, device=event.device)
            self.arrivals = 0
        elif isinstance(event, RowsGathered):
            index = event.index.to(self.occupied.device)
            self.occupied, self.arrival = self.occupied[index], self.arrival[index]
        elif isinstance(event, RowsLeft):
            self.occupied[event.slots.to(self.occupied.device)] = False
        else:
            slots = event.slots.to(self.occupied.device)
            self.occupied[slots] = True
            order = torch.arange(len(slots), device=slots.device)
            self.arrival[slots] = self.arrivals + 1 + order
            self.arrivals += len(slots)


class SlotState(dict):
    """A method's per-slot tensors (first dimension: the batch's slots), by name; a value may be
    one tensor or a list of them (one per layer). They follow the rows with no code in the
    method: compaction gathers them, entering rows find their slots zeroed."""

    def follow(self, event: RowEvent) -> None:
        for name, value in self.items():
            self[name] = [self._follow(t, event) for t in value] if isinstance(value, list) \
                else self._follow(value, event)  # fmt: skip

    @staticmethod
    def _follow(t: torch.Tensor, event: RowEvent) -> torch.Tensor:
        if isinstance(event, RowsGathered):
            return t[event.index.to(t.device)]
        if isinstance(event, RowsEntered):
            return t.index_fill(0, event.slots.to(t.device), 0)
        return t


class PruningMethod:
    """A training-free pruning method. Defaults are those of a method that changes nothing.

    A method's constructor has no defaults: `conf/method/<name>.yaml` is their one source, and
    every method is built from it (`bwprune.config.build_method`; tests: `method_from_conf`).

    `batch_coupled` is True when one row's computation can depend on the other rows of its batch
    (a batch-shared mask); uncoupled methods must give each row the output it gets alone (the
    contract suite, tests/contract/, holds every method to what it declares here).
    `edits_weights` is True when `prepare` changes the model's weights or shapes (static pruning):
    the model as loaded is then gone, and timing it against dense needs the model loaded again.
    """

    batch_coupled: bool = False
    edits_weights: bool = False
    sealed: ClassVar[dict[str, str]] = {"rows": "start", "setup": "prepare"}  # hook -> instead

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        for base in cls.__mro__[1:]:
            for hook, instead in base.__dict__.get("sealed", {}).items():
                if hook in cls.__dict__:
                    raise TypeError(
                        f"{cls.__name__} overrides {base.__name__}.{hook}, which fixes the call "
                        f"order of its family; override {instead} instead"
                    )

    # -- what a method author overrides ---------------------------------------------------------
    def prepare(
        self, model: nn.Module, adapter: ModelAdapter, tokenizer: PreTrainedTokenizerBase
    ) -> None:
        """One-off work before any generation, the one hook that sees the model: calibration,
        static weight pruning, per-layer sizes. The tokenizer is here for calibration text
        (`bwprune.methods.calibration.calibration_windows`)."""

    def start(self, batch_size: int) -> None:
        """A generation starts with `batch_size` rows: fresh scores, memory, schedule."""

    def end_step(self, ctx: StepContext) -> StepSparsity | None:
        """What the forward that just ran skipped (None: it was dense). Static methods report
        what `prepare` removed; the families below report what their decisions skipped."""
        return None

    # -- plumbing, driven by `MethodDriver` -----------------------------------------------------
    def setup(self, shape: ModelShape) -> None:
        """Before `prepare`: the model's shape, all a method's decisions may depend on."""
        self.shape = shape

    @property
    def slots(self) -> Slots:
        if "_slots" not in self.__dict__:
            self._slots = Slots()
        return self._slots

    @property
    def slot_state(self) -> SlotState:
        """Per-slot tensors a method keeps here follow compaction and refills by themselves."""
        if "_slot_state" not in self.__dict__:
            self._slot_state = SlotState()
        return self._slot_state

    def rows(self, event: RowEvent) -> None:
        """The one lifecycle entry: slot bookkeeping, the family's and the method's per-slot
        state, then `start` when a generation starts (per-slot state is the method's to make)."""
        self.slots.apply(event)
        if isinstance(event, RowsStart):
            self.slot_state.clear()
        self.slot_state.follow(event)
        self.follow_rows(event)
        if isinstance(event, RowsStart):
            self.start(event.size)

    def follow_rows(self, event: RowEvent) -> None:
        """A family's per-slot state follows the rows (gathered, emptied, refilled)."""

    def begin_step(self, ctx: StepContext) -> None:
        """Before every forward (prefill and each decode step)."""

    def capturable(self) -> bool:
        """Asked after `begin_step` of a decode step: True when that forward, host glue
        included, only computes tensors (writes no Python-side state), so the engine may run
        it compiled and graph-captured (`bwprune.engine.step`)."""
        return True
