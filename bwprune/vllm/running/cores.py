"""Where vLLM's CPU workers compute: each tensor-parallel worker bound to its share of the cores.

vLLM binds a CPU worker's OpenMP threads by `VLLM_CPU_OMP_THREADS_BIND`; its default (`auto`)
binds one worker per NUMA node and refuses more workers than nodes, which is every small machine
(this one has one node). So a run or server of more than one worker binds them here, unless the
shell already did.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)
BIND = "VLLM_CPU_OMP_THREADS_BIND"


def thread_binding(size: int) -> str:
    """vLLM's CPU workers' cores (`VLLM_CPU_OMP_THREADS_BIND`): this process's cores split into
    `size` contiguous groups, one per worker (vLLM's own default binds by NUMA node, and fails
    where there are fewer nodes than workers). With fewer cores than workers, workers share
    cores one each, in turn: correct, and slow (a model whose heads divide only by a larger size
    than the machine has cores, e.g. SmolLM2-135M's 9 heads at size 3 on 2 cores)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < size:
        log.warning("vLLM: %d workers share %d cores (each worker's forwards wait on the others')",
                    size, len(cores))  # fmt: skip
        return "|".join(str(cores[r % len(cores)]) for r in range(size))
    share = len(cores) // size
    return "|".join(",".join(map(str, cores[r * share : (r + 1) * share])) for r in range(size))


def binding(size: int) -> str:
    """The cores `size` workers are bound to: the shell's binding if it sets one (other than
    `auto`), else `thread_binding`'s."""
    own = os.environ.get(BIND, "auto")
    return thread_binding(size) if own == "auto" else own


@contextmanager
def workers_bound(size: int) -> Iterator[None]:
    """vLLM's CPU workers bound to their shares of the cores (`thread_binding`) while an engine
    of `size` workers starts, unless the shell binds them (`VLLM_CPU_OMP_THREADS_BIND` set to other
    than `auto`). vLLM freezes its settings once an engine has started in a process (its env
    cache), so the cache is cleared around the start: a later engine in the same process reads
    its own binding, not this one's."""
    if size == 1 or os.environ.get(BIND, "auto") != "auto":
        yield
        return
    from vllm import envs

    before = os.environ.get(BIND)
    envs.disable_envs_cache()
    os.environ[BIND] = thread_binding(size)
    try:
        yield
    finally:
        if before is None:
            del os.environ[BIND]
        else:
            os.environ[BIND] = before
        envs.disable_envs_cache()
