"""`hydra/launcher=ray` (conf/hydra/launcher/ray.yaml): each job of a sweep is one Ray task, on a
Ray instance started for the sweep or on a running cluster (`ray.init`'s `address`).

Why our own and not hydra-ray-launcher's `RayLauncher`, which does the same for a local cluster:
hydra-ray-launcher 1.2.2 requires `cloudpickle<3` (its AWS launcher pickles job specs with it),
and joblib 1.6 — hydra/launcher=parallel's — requires `cloudpickle>=3`, so installing it moves
joblib back to 1.5 and cloudpickle to 2.2, under vLLM too; it also pulls boto3 and `ray[default]`.
A task needs none of that: Ray pickles it with its own vendored cloudpickle. This is the plugin's
local launcher on `ray` alone, with its config layout (`ray.init`, `ray.remote`), so its overrides
read the same.

Not responsible for the code and data a task needs: a local instance's workers inherit this
process's environment and `sys.path`, a cluster's nodes need the same checkout, virtual
environment and results folder at the same paths (docs/cluster.md).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger(__name__)


class RayLauncher(Launcher):
    """Submits a batch of jobs as Ray tasks, then waits for all of them (Hydra's sweepers hand a
    launcher one batch at a time)."""

    def __init__(self, ray: DictConfig) -> None:
        self.ray = ray  # init: ray.init's keyword arguments; remote: each task's options
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        import ray  # here, not at import: Hydra imports every plugin module on each start

        assert self.config is not None and self.hydra_context is not None
        assert self.task_function is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if not ray.is_initialized():  # a later batch of the same sweep reuses it
            ray.init(**OmegaConf.to_container(self.ray.init, resolve=True))
        job = ray.remote(_run_job).options(**OmegaConf.to_container(self.ray.remote, resolve=True))
        log.info("Ray is launching %d jobs, sweep output dir: %s", len(job_overrides), sweep_dir)
        pending = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            log.info("\t#%d : %s", idx, " ".join(filter_overrides(overrides)))
            # Composed here: a bad override fails before any job is submitted.
            sweep_config = self.hydra_context.config_loader.load_sweep_config(
                self.config, list(overrides)
            )
            with open_dict(sweep_config):
                sweep_config.hydra.job.num = idx  # its id is its Ray task's, set in the task
            pending.append(
                job.remote(
                    self.hydra_context, sweep_config, self.task_function, Singleton.get_state()
                )
            )
        return ray.get(pending)


def _run_job(
    hydra_context: HydraContext,
    sweep_config: DictConfig,
    task_function: TaskFunction,
    singleton_state: dict[Any, Any],
) -> JobReturn:
    """One job in a Ray worker, from the directory the sweep was started in: the project's
    relative paths are relative to it, and a cluster's workers start wherever `ray start` ran.
    The job's id (`hydra.job.id`, in its `.hydra/hydra.yaml`) is its Ray task's, as a SLURM job's
    is its SLURM id: what Ray's logs and `ray list tasks` name it by."""
    import ray

    setup_globals()
    Singleton.set_state(singleton_state)
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = ray.get_runtime_context().get_task_id()
    HydraConfig.instance().set_config(sweep_config)
    worker_cwd = os.getcwd()
    os.chdir(sweep_config.hydra.runtime.cwd)
    try:
        return run_job(
            hydra_context=hydra_context,
            task_function=task_function,
            config=sweep_config,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )
    finally:
        os.chdir(worker_cwd)  # the worker runs later tasks too
