"""vLLM's Ray executor on CPU workers: Ray places them as if each were a device.

vLLM places a Ray worker on a bundle holding one unit of its platform's Ray device key ("GPU" on
CUDA), and its CPU platform names none, so its Ray executor refuses to start there ("current
platform cpu does not support ray", vllm-project/vllm#21602). A CPU worker needs no device, only
a unit Ray can count: Ray's "GPU" resource is such a unit when a Ray instance declares it
(`num_gpus`) on a node without GPUs. So for CPU workers this module

- names "GPU" as the CPU platform's Ray device key, in this process and, through a worker set-up
  hook in the Ray job's runtime environment, in every Ray worker before vLLM asks it;
- starts a local Ray instance declaring one such unit per worker, or joins the cluster
  `RAY_ADDRESS` names, whose CPU nodes declare theirs (`ray start --num-gpus=N`).

The workers then compute as vLLM's multiprocessing ones do; only who starts them changes. Nothing
here runs where vLLM's platform has a Ray device of its own (CUDA).
"""

from __future__ import annotations

import logging
import os

from bwprune.errors import UserError

log = logging.getLogger(__name__)
DEVICE_KEY = "GPU"  # a unit Ray counts per node; on a CPU node a number the node declares
HOOK = f"{__name__}.declare_device"


def declare_device() -> None:
    """vLLM's CPU platform names `DEVICE_KEY` as its Ray device (the Ray workers' set-up hook)."""
    from vllm.platforms.cpu import CpuPlatform

    CpuPlatform.ray_device_key = DEVICE_KEY


def ray_for_cpu_workers(size: int) -> None:
    """A Ray instance that vLLM can place `size` CPU workers on, joined by this process: the one
    it has joined already, else the cluster `RAY_ADDRESS` names, else a new local one. One line
    naming what is missing when the instance declares fewer than `size` units, or was started
    without the workers' hook."""
    import ray

    declare_device()
    runtime = {"worker_process_setup_hook": HOOK}
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address, runtime_env=runtime)
        else:
            ray.init(num_cpus=os.cpu_count(), num_gpus=size, runtime_env=runtime,
                     include_dashboard=False)  # fmt: skip
            log.info("Ray: a local instance for %d CPU workers", size)
    elif ray.get_runtime_context().runtime_env.get("worker_process_setup_hook") != HOOK:
        raise UserError(
            "generation.vllm.executor=ray on CPU: this process joined Ray without the workers' "
            f'hook; join with ray.init(runtime_env={{"worker_process_setup_hook": "{HOOK}"}})'
        )
    units = ray.cluster_resources().get(DEVICE_KEY, 0)
    if units < size:
        raise UserError(
            f"generation.vllm.tensor_parallel_size={size} with executor=ray on CPU: the Ray "
            f"cluster declares {units:g} worker units ({DEVICE_KEY!r}); start its CPU nodes with "
            f"`ray start --num-gpus=<workers per node>`, {size} in all"
        )
