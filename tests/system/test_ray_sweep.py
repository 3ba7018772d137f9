"""A sweep through our Ray launcher (`hydra/launcher=ray`) on a Ray instance the sweep starts and
stops: each job a Ray task, two at once, then tables built from it."""

import os

import pytest
import ray

from tests.system.sweep import job_id, sweep_then_tables


@pytest.mark.slow
def test_a_ray_sweep_writes_complete_runs_that_tables_read(tmp_path):
    # Two CPUs whatever the machine has: both one-CPU jobs run at once (Ray sets their threads).
    launcher = ["hydra/launcher=ray", "+hydra.launcher.ray.init.num_cpus=2"]
    jobs = sweep_then_tables(tmp_path, launcher, dict(os.environ))
    tasks = [job_id(job) for job in jobs]  # each job's id is its Ray task's
    assert len(set(tasks)) == 2, tasks
    for task in tasks:  # not Hydra's own `<name>_<num>`
        assert ray.TaskID.from_hex(task).hex() == task, task
