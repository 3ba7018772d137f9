"""A sweep through Hydra's submitit launcher on submitit's local executor (`hydra/launcher=local`):
the pickled-job path a SLURM sweep takes, run as two processes here, then tables built from it."""

import os

import pytest

from tests.system.sweep import sweep_then_tables


@pytest.mark.slow
def test_a_submitit_sweep_writes_complete_runs_that_tables_read(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the two jobs run at once: one core each
    sweep_then_tables(tmp_path, ["hydra/launcher=local"], env)
    assert len(list(tmp_path.glob("hydra/multirun/*/*/.submitit/*/*_result.pkl"))) == 2
