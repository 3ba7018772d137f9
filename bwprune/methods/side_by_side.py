"""Layers filled side by side: threads that each take the next layer and run torch on one thread.

A generation's first kept set fills every slot of every layer afresh (`bwprune.models.kept_slots`:
its logits must not depend on the generations before it). For SmolLM2 that is about 160 MB read
and as much written, 45-65 ms on one thread, most of a decode step. A second OpenMP thread halves
it on an idle machine, but while another process holds a core each op's barrier waits for the
descheduled thread: under a one-core burner the fill took 90-145 ms on two OpenMP threads against
61-63 on one. Threads that each take the next layer need no barrier: 36-39 against 63-67 ms idle,
and no slower than one thread (61-63 against 63-65 ms) under the burner (30 layers, medians of
15; `bwprune.methods.host.Host` calls this). A refresh between kept sets stays on one thread:
its ops are small, and the Python between them, which holds the interpreter's lock, is much of
their time (dealt to two threads it took 16-19 against 12-16 ms).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

T = TypeVar("T")
R = TypeVar("R")

_POOL: tuple[int, int, ThreadPoolExecutor] | None = None  # (process, threads, pool)


def each(fn: Callable[[T], R], items: Sequence[T], threads: int) -> list[R]:
    """`fn` of every item, in order, on `threads` threads side by side (the caller's: one, or
    a single item). Each thread runs under the caller's inference mode (a forward's tensors may
    be inference tensors, which only inference mode may update in place) and with as many torch
    threads as the caller's setting when it is called: the caller sets one."""
    if threads < 2 or len(items) < 2:
        return [fn(item) for item in items]
    inference = torch.is_inference_mode_enabled()

    def run(item: T) -> R:
        with torch.inference_mode(inference):
            return fn(item)

    return list(_pool(threads).map(run, items))


def _pool(threads: int) -> ThreadPoolExecutor:
    """The process's pool of `threads` threads (a forked process makes its own: the parent's
    threads do not exist in it)."""
    global _POOL
    if _POOL is None or _POOL[:2] != (os.getpid(), threads):
        if _POOL is not None and _POOL[0] == os.getpid():
            _POOL[2].shutdown(wait=False)
        _POOL = (os.getpid(), threads, ThreadPoolExecutor(threads, "bwprune-fill"))
    return _POOL[2]
