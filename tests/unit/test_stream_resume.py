"""A resumed continuous-batching run is the uninterrupted one, sample for sample.

Why: in a stream, which rows share a forward depends on every row before, and a batch-shared
method (ours, Griffin, TEAL's shared mask) decides from the rows it shares a forward with; a
stream resumed with only its missing problems gave 15 of 28 completions differently. A resumed
stream replays from its first problem and writes only what is missing.
"""

from collections.abc import Callable

import pytest

import bwprune.generation.runner as runner_module
from bwprune.experiment import run
from bwprune.generation.stream import StreamRunner
from bwprune.runs.identity import run_key
from bwprune.runs.recorder import RunRecorder
from tests.conftest import compose_cfg, small_calibration

STREAM = ["model=tiny_llama", "limit=12", "batch_size=3", "generation.batching=continuous",
          "generation.max_new_tokens=24"]  # fmt: skip
METHODS = {
    "ours": ["method=ours", "method.t_init=2", "method.t_prune=3", "method.t_explore=2"],
    "griffin": ["method=griffin"],
    "teal": ["method=teal"],
}
KILLED_AFTER = (1, 4, 8)  # samples on disk when the run is stopped


@pytest.fixture
def rows_stop_at_different_steps(monkeypatch):
    """The random tiny model rarely emits its EOS: with these tokens as stops its rows end at
    different steps, so slots free at different times and the stream's rows mix."""
    monkeypatch.setattr(runner_module, "stop_token_ids", lambda model, tok: list(range(3, 320, 9)))


def _stop_after(monkeypatch: pytest.MonkeyPatch, samples: int) -> Callable[[], None]:
    """Stop the run (as a kill would, after a write) once `samples` samples are recorded;
    returns what lets the stream run to its end again."""
    real, recorded = StreamRunner.run, []

    def run_until(self, prompts, on_finish, **kw):
        def finish(items, completions, timing):
            on_finish(items, completions, timing)
            recorded.extend(items)
            if len(recorded) >= samples:
                raise KeyboardInterrupt

        return real(self, prompts, finish, **kw)

    monkeypatch.setattr(StreamRunner, "run", run_until)
    return lambda: monkeypatch.setattr(StreamRunner, "run", real)


def _outputs(cfg) -> list[tuple]:
    rows = RunRecorder(cfg.paths.runs_dir, run_key(cfg)).samples()
    return sorted((s["index"], s["completion"], s["new_tokens"], s["sparsity"]) for s in rows)


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_a_resumed_stream_is_the_uninterrupted_stream(
    method, tmp_path, monkeypatch, rows_stop_at_different_steps
):
    args = [*STREAM, *METHODS[method], *small_calibration(tmp_path)]
    whole = compose_cfg(args, tmp_path / "whole")
    uninterrupted = run(whole)
    assert len({s[2] for s in _outputs(whole)}) > 1  # rows of different lengths: a real mix
    for killed_after in KILLED_AFTER:
        cfg = compose_cfg(args, tmp_path / f"killed_after_{killed_after}")
        resume = _stop_after(monkeypatch, killed_after)
        with pytest.raises(KeyboardInterrupt):
            run(cfg)
        kept = len(RunRecorder(cfg.paths.runs_dir, run_key(cfg)).samples())
        assert killed_after <= kept < 12
        resume()
        resumed = run(cfg)
        assert _outputs(cfg) == _outputs(whole), (method, killed_after)
        realized = resumed["metrics"]["realized_sparsity"]
        assert realized == uninterrupted["metrics"]["realized_sparsity"]
