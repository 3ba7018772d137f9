"""The method where vLLM's workers are: installed in each, bound to its forwards, read back.

A method decides inside the forwards of vLLM's model, so its state lives in the worker that runs
them: with tensor parallelism, one worker per rank, each in a process of its own, each with its
own copy of the method and its host (`bwprune.vllm.binding.host`), all deciding the same kept sets.
The runner (`bwprune.vllm.running.runner`) reaches them only through these functions, which vLLM
calls in every worker (`LLM.collective_rpc`): the same calls at every size, run in this process when
vLLM runs its one worker here. A function's first argument is the worker; what it returns comes back
from every rank, in rank order (pickled when the worker is another process).
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field

import torch

from bwprune.engine.ledger import SparsityLedger
from bwprune.engine.protocol import MethodDriver
from bwprune.generation.runner import BatchTiming
from bwprune.methods.base import PruningMethod
from bwprune.vllm.binding.host import VLLMHost
from bwprune.vllm.binding.session import Session, StreamSession, bound


@dataclass
class Installed:
    """A worker's methods (key -> driver) and the one bound to its forwards, if any."""

    drivers: dict[str, MethodDriver] = field(default_factory=dict)
    session: Session | StreamSession | None = None
    bound: ExitStack | None = None


@dataclass(frozen=True)
class Generated:
    """What a static batch's session recorded: each request's ledger summary, the prefill and
    decode-step times, and the host's per-phase split of those steps."""

    rows: dict[str, dict]
    prefill_s: float
    step_s: list[float]
    phases: dict


def _installed(worker) -> Installed:
    if not hasattr(worker, "bwprune"):
        worker.bwprune = Installed()
    return worker.bwprune


def install(worker, key: str, method: PruningMethod, ledger: SparsityLedger, compiled: bool,
            tp_select: str = "global") -> None:  # fmt: skip
    """`method` (prepared on the HF model) drives this worker's model as `key` from now on, until
    replaced (`VLLMHost` says what `compiled` and `tp_select` mean)."""
    host = VLLMHost(method, compiled, tp_select)
    _installed(worker).drivers[key] = MethodDriver(method, worker.model_runner.model, None, ledger,
                                                   host)  # fmt: skip


def driver(worker, key: str) -> MethodDriver:
    """The driver installed as `key`: for a caller in the worker's own process (a driver holds
    the model, which does not leave its process)."""
    return _installed(worker).drivers[key]


def begin(worker, key: str, slots: int | None = None) -> None:
    """Bind `key`'s method to the model's forwards: a static batch (`slots` None) or a stream of
    `slots` seats."""
    state = _installed(worker)
    close(worker)  # a session an error left bound
    driver, runner = state.drivers[key], worker.model_runner
    device = torch.device(runner.device)
    if slots is None:
        session = Session(driver, driver.host, runner, device)
    else:
        session = StreamSession(driver, driver.host, runner, device, slots)
    stack = ExitStack()
    stack.enter_context(bound(session))
    state.session, state.bound = session, stack


def end(worker) -> Generated:
    """The static batch is over: its record, and the method unbound."""
    session = _installed(worker).session
    session.end_generation()
    prefill_s, step_s = session.times()
    generated = Generated(session.ledger_rows(), prefill_s, step_s,
                          session.driver.host.log.summary(step_s))  # fmt: skip
    close(worker)
    return generated


def release(worker, requests: list[str]) -> tuple[list[dict], BatchTiming]:
    """Requests of the stream finished: their ledger summaries, and the time since the last call
    (`StreamSession.release`, `take`)."""
    session = _installed(worker).session
    return session.release(requests), session.take()


def end_stream(worker) -> None:
    """The stream is over: the requests still seated leave, and the method is unbound."""
    _installed(worker).session.close()
    close(worker)


def close(worker) -> None:
    """Unbind whatever is bound (nothing: nothing happens)."""
    state = _installed(worker)
    if state.bound is not None:
        state.bound.close()
    state.session, state.bound = None, None
