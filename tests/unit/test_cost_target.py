"""Matched cost: a run's ρ is chosen so that its realized cost lands on a target.

The search itself on made-up cost curves; then on the tiny Llama, end to end: ours and TEAL
reach a target (c) within tolerance on the calibration problems, which a plain run of those
problems at the chosen ρ confirms; the search is recorded and not repeated on resume; and every
setting that cannot target a cost fails before a folder exists.
"""

from pathlib import Path

import pytest

from bwprune import experiment
from bwprune.cli import interrupted
from bwprune.config import build
from bwprune.engine.step import DecodeStep
from bwprune.errors import UserError
from bwprune.experiment import run
from bwprune.generation.cost_target import CostTarget, Trial, next_rho, search_rho
from bwprune.runs.identity import run_key
from bwprune.runs.recorder import RunRecorder
from bwprune.runs.rescore import rescore

TINY = ["model=tiny_llama", "limit=4", "batch_size=2", "cost.problems=4"]


def steps_of(rho: float) -> float:
    """A cost curve like a top-k method's on a small model: flat steps, then a plateau."""
    return 0.4 * min(int(rho * 128) / 128, 0.9)


@pytest.mark.parametrize("target", [0.05, 0.17, 0.3])
def test_the_search_lands_within_tolerance(target):
    trials = search_rho(steps_of, target, 0.005, 0.5, 0.95, 8)
    assert abs(trials[-1].realized - target) <= 0.005
    assert trials[0].rho == 0.5 and len(trials) <= 4  # interpolation, not 8 bisections


def test_every_trial_stays_inside_the_bracket():
    low, high = Trial(0.2, 0.1), Trial(0.6, 0.5)
    assert next_rho(low, high, 0.3, 0.95) == 0.4  # on the line
    assert next_rho(low, high, 0.49, 0.95) == 0.5  # kept in the middle half
    assert next_rho(low, None, 0.3, 0.95) == 0.575  # nothing above yet: bisect up to max_rho


def test_an_unreachable_target_names_every_trial_and_what_to_change():
    with pytest.raises(UserError, match=r"cost.target=0.5: .* 3 trials \(ρ 0.5 → 0.2000, .*"
                       r"lower cost.target \(or raise cost.max_rho=0.95\)"):  # fmt: skip
        search_rho(steps_of, 0.5, 0.01, 0.5, 0.95, 3)


@pytest.mark.parametrize(("method", "target"), [("ours", 0.12), ("teal", 0.2)])
def test_a_run_reaches_its_target_cost_on_the_calibration_problems(cfg_factory, method, target):
    cfg = cfg_factory(*TINY, f"method={method}", f"cost.target={target}")
    record = run(cfg)
    assert f"/params={target}_bs=2_" in record["run_key"]
    cost = record["metrics"]["cost"]
    assert abs(cost["realized"] - target) <= cost["tolerance"] == 0.01
    assert cost["trials"][-1] == {"rho": cost["rho"], "realized": cost["realized"]}
    assert record["metrics"]["target_sparsity"] == cost["rho"] != 0.5
    # The benchmark's last 4 problems, none of them evaluated.
    assert cost["calibration"]["indices"] == [1315, 1316, 1317, 1318]
    # A plain run of those problems at the chosen ρ realizes exactly what the search measured.
    ids = [e.id for e in build(cfg.benchmark).examples()[-4:]]
    plain = run(cfg_factory("model=tiny_llama", "batch_size=2", f"method={method}",
                            f"sparsity={cost['rho']}", f"subset=[{','.join(ids)}]"))  # fmt: skip
    assert plain["metrics"]["realized_sparsity"]["params"] == pytest.approx(cost["realized"])


def test_the_search_runs_eager_and_the_run_as_configured(cfg_factory, monkeypatch):
    """Each trial is a new model copy and method: compiled, every trial would compile anew."""
    compiled: list[bool] = []
    init = DecodeStep.__init__

    def spy(self, model, compiled_flag, *args, **kwargs):
        compiled.append(compiled_flag)
        init(self, model, compiled_flag, *args, **kwargs)

    monkeypatch.setattr(DecodeStep, "__init__", spy)
    cfg = cfg_factory(*TINY, "method=teal", "cost.target=0.2", "generation.compile=true",
                      "generation.compile_backend=eager", "speed.paired=false")  # fmt: skip
    record = run(cfg)
    trials = len(record["metrics"]["cost"]["trials"])
    assert compiled[:trials] == [False] * trials and compiled[trials:] and all(compiled[trials:])


def test_a_resumed_run_reuses_its_search(cfg_factory, monkeypatch):
    """Stopped after its search, before any batch: the folder keeps the search, and the resumed
    run generates at the stored ρ without searching again."""
    cfg = cfg_factory(*TINY, "method=ours", "cost.target=0.12")

    def stopped(*args):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(experiment, "generate_missing", stopped)
        with pytest.raises(KeyboardInterrupt):
            run(cfg)
    recorder = RunRecorder(cfg.paths.runs_dir, run_key(cfg))
    stored = recorder.cost_search()
    assert stored is not None and not recorder.samples()
    assert "the cost search is kept in" in interrupted(cfg)  # what Ctrl-C prints

    def searched_again(self, cfg):
        raise AssertionError("the stored search was repeated")

    monkeypatch.setattr(CostTarget, "search", searched_again)
    record = run(cfg)
    assert record["metrics"]["cost"] == stored and record["metrics"]["n"] == 4
    assert record["metrics"]["target_sparsity"] == stored["rho"]
    assert rescore(recorder.dir)["metrics"]["cost"] == stored  # rescoring keeps it


def test_the_cost_block_is_part_of_a_run_s_identity_only_when_set(cfg_factory):
    base = run_key(cfg_factory("method=ours"))
    assert run_key(cfg_factory("method=ours", "cost.tolerance=0.02")) == base  # off: ignored
    matched = run_key(cfg_factory("method=ours", "cost.target=0.3"))
    assert matched.split("/")[-1].startswith("params=0.3_bs=4_seed=0_")
    assert run_key(cfg_factory("method=ours", "cost.target=0.3", "cost.tolerance=0.02")) != matched
    assert run_key(cfg_factory("method=ours", "cost.target=0.3", "cost.quantity=ffn")) != matched


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        (["method=dense"], r"method=dense has none \(its config sets no `sparsity`\)"),
        (
            ["method=wanda"],
            r"method=wanda refuses it: .*pattern='2:4' prunes exactly 2/4 .*"
            r"pattern='unstructured' prunes any fraction",
        ),
        (["cost.quantity=bytes"], r"cost.quantity='bytes' is not valid; choose one of \['ffn', "),
        (["cost.problems=1"], r"cost.problems=1 must be >= batch_size=2"),
        (["cost.target=1.2"], r"cost.target=1.2 must be in \(0, 1\)"),
        (["cost.target=abc"], r"cost.target='abc' must be a number"),
        (["limit=null"], r"gsm8k has only 0 problems the run does not evaluate \(1319 of 1319"),
        (["num_shards=2"], r"num_shards=2: each shard would search ρ on its own"),
        (["benchmark=wikitext2"], r"benchmark=wikitext2 generates nothing to calibrate on"),
    ],
)
def test_what_cannot_target_a_cost_fails_before_a_folder_exists(cfg_factory, overrides, error):
    cfg = cfg_factory(*TINY, "method=ours", "cost.target=0.1", *overrides)
    with pytest.raises(UserError, match=error):
        run(cfg)
    assert not Path(cfg.paths.runs_dir).exists() or not any(Path(cfg.paths.runs_dir).iterdir())
