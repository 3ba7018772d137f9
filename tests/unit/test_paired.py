"""Paired speedup over dense inside a run (generation/paired.py, runs/speedup.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from bwprune.cli import speedup_line, summary
from bwprune.config import compose_config
from bwprune.errors import UserError
from bwprune.experiment import run
from bwprune.generation import paired as paired_module
from bwprune.generation.paired import PairedSettings, PairedTiming, own_forcing, pair_status
from bwprune.generation.remeasure import remeasure, runs_without_interval
from bwprune.generation.runner import BatchedRunner, SamplingConfig
from bwprune.generation.timing import Precision
from bwprune.methods.base import PruningMethod
from bwprune.models.adapters import adapter_for
from bwprune.models.loading import load_model
from bwprune.runs.pairing import pairing_key
from bwprune.runs.speedup import paired_speedup, schedule_ideal, step_span, time_to_answer
from bwprune.runs.tracking import summary_metrics
from tests.conftest import CONF_DIR, chat, tiny_model

TINY = ["model=tiny_llama", "limit=4", "batch_size=2", "generation.max_new_tokens=16"]


def _timing(method_s: list[float], dense_s: list[float], prefill: float = 0.5) -> dict:
    """A timing row with a `paired` entry: decode seconds per trial, the same prefill."""
    return {
        "prefill_s": 1.0, "decode_s": 3.0, "step_ms": [1.0] * 8,
        "paired": {
            "method": [{"prefill_s": prefill, "decode_s": m} for m in method_s],
            "dense": [{"prefill_s": prefill, "decode_s": d} for d in dense_s],
            "weight_bytes": {"read": 1000, "params": 1200},
            "overhead_s": 2.0,
        },
    }  # fmt: skip


def test_paired_speedup_is_dense_time_over_method_time_with_its_spread():
    realized = {"params": 0.25, "sparse_step_fraction": 0.5}
    s = paired_speedup([_timing([1.0, 2.0], [2.0, 3.0]), {"prefill_s": 1, "decode_s": 1,
                                                          "step_ms": []}], realized)  # fmt: skip
    assert s["step"] == {"median": 1.75, "min": 1.5, "max": 2.0}
    assert s["e2e"]["max"] == pytest.approx(2.5 / 1.5)
    assert (s["batches"], s["repeats"]) == (1, 2)
    # (c) on sparse steps = 0.25 / 0.5 of 1200 bytes skipped, of 1000 read per step.
    assert s["bandwidth_bound"] == pytest.approx(1000 / (1000 - 600))
    assert s["ideal"] == pytest.approx(schedule_ideal(0.5, 2.5))
    assert s["overhead_fraction"] == pytest.approx(2.0 / 6.0)
    assert paired_speedup([{"prefill_s": 1, "decode_s": 1, "step_ms": []}], realized) is None


def test_a_run_timed_to_a_precision_carries_the_interval_and_whether_it_was_reached():
    precision = {"pairs": 6, "target": 0.03, "confidence": 0.95, "stopped": "cap",
                 "interference": {"cores": 2, "load": [1.0, 2.5], "steal": 0.01,
                                  "overloaded": True}}  # fmt: skip
    row = _timing([1.0] * 6, [1.0, 1.1, 1.2, 1.3, 1.4, 1.5])
    row["paired"]["precision"] = precision
    s = paired_speedup([row], {"params": 0.0, "sparse_step_fraction": 0.0})
    assert (s["step"]["low"], s["step"]["high"]) == (1.0, 1.5)  # 6 pairs: (min, max) at 95 %
    i = s["interval"]
    assert i["half_width"] == pytest.approx(0.25 / 1.25) and not i["reached"]
    assert (i["pairs"], i["load_max"], i["overloaded"]) == ([6], 2.5, True)
    assert step_span(s["step"]) == (1.0, 1.5, "interval")
    line = speedup_line(s)
    assert "6 pairs, 95% interval ±20.0%, target ±3% not reached; load 2.5 above" in line, line
    assert "step 1.25x [1.00, 1.50]" in line
    wandb = summary_metrics({"benchmark": "gsm8k", "metrics": {"speedup": s}})
    assert (wandb["speed/speedup_step_low"], wandb["speed/pairs"]) == (1.0, 6)
    assert wandb["speed/interval_reached"] is False and wandb["speed/interval_overloaded"]
    del row["paired"]["precision"]  # timed before intervals: min-max only
    s = paired_speedup([row], {"params": 0.0, "sparse_step_fraction": 0.0})
    assert "low" not in s["step"] and "interval" not in s
    assert step_span(s["step"]) == (1.0, 1.5, "range")


def test_time_to_answer_counts_the_steps_a_longer_answer_takes():
    metrics = {"n": 4, "prefill_s": 1.0, "decode_s": 4.0, "decode_iterations": 200,
               "speedup": {"step": {"median": 1.5}, "prefill": {"median": 1.0}}}  # fmt: skip
    # Dense: the same prefill, and 100 steps at 1.5x this run's per-step cost.
    dense = {"n": 4, "decode_iterations": 100}
    assert time_to_answer(metrics, dense) == pytest.approx((1.0 + 4.0 * 1.5 / 2) / 5.0)
    assert time_to_answer(metrics, {**dense, "n": 3}) is None  # not the same problems


def test_an_auto_budget_is_the_runs_generation_time_shared_by_the_timed_batches():
    speed = {"batches": 2, "warmup": 1, "repeats": 6, "max_repeats": 40, "half_width": 0.03,
             "confidence": 0.95, "budget_s": "auto"}  # fmt: skip
    settings = PairedSettings.from_config(speed)
    assert settings.for_batch(30.0, run_batches=2).budget_s == pytest.approx(30.0)
    assert settings.for_batch(30.0, run_batches=100).budget_s == pytest.approx(1500.0)
    assert settings.for_batch(30.0, run_batches=1).budget_s == pytest.approx(30.0)
    fixed = PairedSettings.from_config({**speed, "budget_s": 600})
    assert fixed.for_batch(30.0, run_batches=2).budget_s == 600.0


def test_the_progress_line_shows_pairs_interval_target_and_time():
    precision = Precision(6, 40, 0.03, 0.95, 300.0)
    status = {"pairs": 0, "warming_up": True, "half_width": None, "seconds": 12.4,
              "precision": precision}  # fmt: skip
    assert pair_status(status) == "timing vs dense: warm-up, 12 s (budget 300 s)"
    line = pair_status({**status, "pairs": 7, "warming_up": False, "half_width": 0.0523})
    assert line == ("timing vs dense: 7 of 6-40 pairs, interval ±5.2% (target ±3.0%), "
                    "12 s (budget 300 s)")  # fmt: skip
    assert "no interval yet" in pair_status({**status, "pairs": 3, "warming_up": False})


class Slow(PruningMethod):
    """A method that only adds time (20 ms per forward): its paired speedup must be below 1."""

    def begin_step(self, ctx) -> None:
        time.sleep(0.02)


def test_a_method_that_adds_work_times_below_dense():
    model, tok = tiny_model("tiny_llama")
    adapter = adapter_for(model)
    runner = BatchedRunner(model, tok, Slow(), adapter, SamplingConfig(12))
    ids, attn = runner.encode(chat(tok, ["What is 2 + 3?", "Hi"]))
    completions, timing = runner.generate_tokens(ids, attn)
    paired = PairedTiming(
        runner, adapter, model, PairedSettings(1, 1, Precision(3, 3, 0.03, 0.95, 60.0))
    )
    row = {"prefill_s": timing.prefill_s, "decode_s": timing.decode_s, "step_ms": [],
           "paired": paired.measure(ids, attn, completions)}  # fmt: skip
    s = paired_speedup([row], {"params": 0.0, "sparse_step_fraction": 0.0})
    assert s["step"]["max"] < 0.9, s
    assert not any(m._forward_hooks for m in model.modules()), "the method left attached"


def test_a_timed_trial_decodes_at_most_each_row_s_first_max_steps_tokens(monkeypatch):
    """`speed.max_steps`: a long answer's batch is timed on its first tokens, not regenerated."""
    model, tok = tiny_model("tiny_llama")
    adapter = adapter_for(model)
    runner = BatchedRunner(model, tok, PruningMethod(), adapter, SamplingConfig(12))
    ids, attn = runner.encode(chat(tok, ["What is 2 + 3?", "Hi"]))
    completions, _ = runner.generate_tokens(ids, attn)
    forced = own_forcing(completions, runner.pad_id, runner.device, 5)
    assert forced.lengths.tolist() == [min(c.new_tokens, 5) for c in completions]
    for row, c in zip(forced.tokens.tolist(), completions):
        assert row[: min(c.new_tokens, 5)] == c.token_ids[:5]
    seen = []
    real = BatchedRunner.generate_tokens

    def spy(self, *args, forced=None, **kwargs):
        seen.append(forced.lengths.tolist())
        return real(self, *args, forced=forced, **kwargs)

    monkeypatch.setattr(BatchedRunner, "generate_tokens", spy)
    settings = PairedSettings(1, 1, Precision(2, 2, 0.03, 0.95, 60.0), max_steps=5)
    entry = PairedTiming(runner, adapter, model, settings).measure(ids, attn, completions)
    assert seen and all(max(lengths) <= 5 for lengths in seen)
    assert entry["max_steps"] == 5


def test_dense_against_itself_is_one_within_its_spread(tmp_path):
    cfg = compose_config(
        Path(CONF_DIR),
        [*TINY, "method=dense", "speed.paired=true", "speed.batches=2", "speed.repeats=5",
         "speed.max_repeats=5", "speed.warmup=1", f"paths.results_dir={tmp_path}",
         "progress=false"],
    )  # fmt: skip
    record = run(cfg)
    s = record["metrics"]["speedup"]
    assert (s["batches"], s["repeats"]) == (2, 10)
    for key in ("step", "e2e"):
        assert s[key]["min"] <= 1.0 <= s[key]["max"], s
    line = summary(record, str(tmp_path))
    assert "speedup vs dense (paired, 2 batches, 10 pairs, 95% interval ±" in line, line


def test_a_method_that_edits_weights_is_timed_against_the_model_as_loaded(
    cfg_factory, monkeypatch, tmp_path
):
    seen = {}
    real_init = PairedTiming.__init__

    def spy(self, runner, adapter, dense_model, settings):
        seen["runner"], seen["dense"] = runner.model, dense_model
        real_init(self, runner, adapter, dense_model, settings)

    monkeypatch.setattr(paired_module.PairedTiming, "__init__", spy)
    valid = tmp_path / "valid.txt"
    valid.write_text("The quick brown fox jumps over the lazy dog. " * 200)
    cfg = cfg_factory(*TINY, "method=wanda", "method.pattern=unstructured",
                      f"calibration.text_file={valid}", "calibration.num_sequences=2",
                      "calibration.seq_len=32")  # fmt: skip
    assert "speedup" in run(cfg)["metrics"]
    loaded, _ = load_model(cfg.model, cache_dir="unused")
    assert seen["dense"] is not seen["runner"]
    assert all(torch.equal(a, b) for a, b in zip(seen["dense"].parameters(), loaded.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(seen["runner"].parameters(),
                                                     loaded.parameters()))  # fmt: skip


def test_auto_times_pruned_runs_only_and_false_times_none(cfg_factory):
    assert "speedup" not in run(cfg_factory(*TINY, "method=dense"))["metrics"]
    assert "speedup" in run(cfg_factory(*TINY, "method=ours"))["metrics"]
    assert "speedup" not in run(cfg_factory(*TINY, "method=teal", "speed.paired=false"))["metrics"]


def test_a_finished_run_gets_its_speedup_measured_after_the_fact(cfg_factory):
    run(cfg_factory(*TINY, "method=dense"))
    record = run(cfg_factory(*TINY, "method=ours", "speed.paired=false"))
    assert "speedup" not in record["metrics"]
    folder = Path(cfg_factory().paths.runs_dir) / record["run_key"]
    samples = (folder / "samples.jsonl").read_text()
    # As recorded before the class was renamed and the stream options existed (committed runs).
    recorded = OmegaConf.load(folder / "config.yaml")
    recorded.method._target_ = "bwprune.methods.ours.BWAP"
    for late in ("memory_policy", "memory_decay", "memory_window", "on_enter"):
        recorded.method.pop(late)
    OmegaConf.save(recorded, folder / "config.yaml")
    current = cfg_factory("speed.batches=2", "speed.repeats=2", "speed.max_repeats=2")
    new = remeasure(folder, current)
    m = new["metrics"]
    assert (m["speedup"]["batches"], m["speedup"]["repeats"]) == (2, 4)
    assert m["time_to_answer"] > 0 and new["speed_measured"]["device"] == "cpu"
    assert new["finished_at"] == record["finished_at"]
    assert (folder / "samples.jsonl").read_text() == samples
    rows = [json.loads(line) for line in (folder / "timing.jsonl").read_text().splitlines()]
    assert [r["paired"]["replayed_equal"] for r in rows if "paired" in r] == [2, 2]
    assert {k: v for k, v in m.items() if k not in ("speedup", "time_to_answer")} == {
        k: v for k, v in record["metrics"].items()
    }
    # Re-timed on fewer batches: the later batch's earlier timing no longer counts.
    again = remeasure(folder, cfg_factory("speed.batches=1", "speed.repeats=6",
                                          "speed.max_repeats=6"))["metrics"]["speedup"]  # fmt: skip
    assert (again["batches"], again["repeats"], again["interval"]["pairs"]) == (1, 6, [6])
    assert "low" in again["step"]


def test_the_runs_left_to_re_time_are_those_with_a_min_max_alone(tmp_path):
    spread = {"median": 1.1, "min": 0.9, "max": 1.2}
    records = {
        "dense/a": {"metrics": {"n": 4}},
        "ours/timed": {"metrics": {"speedup": {"step": spread, "interval": {"pairs": [6]}}}},
        "ours/old": {"metrics": {"speedup": {"step": spread}}},
        "teal/old": {"metrics": {"speedup": {"step": spread}}},
    }
    for key, record in records.items():
        (tmp_path / key).mkdir(parents=True)
        (tmp_path / key / "run.json").write_text(json.dumps(record))
    (tmp_path / "teal" / "unfinished").mkdir()  # no run.json: nothing to time
    assert runs_without_interval(tmp_path) == [tmp_path / "ours/old", tmp_path / "teal/old"]


def test_bad_speed_settings_name_the_value(cfg_factory):
    with pytest.raises(UserError, match=r"speed.paired='sometimes'.*auto"):
        run(cfg_factory(*TINY, "method=ours", "speed.paired=sometimes"))
    with pytest.raises(UserError, match=r"speed\.repeats=0"):
        run(cfg_factory(*TINY, "method=ours", "speed.repeats=0"))
    with pytest.raises(UserError, match=r"speed\.max_steps=0 must be >= 1"):
        run(cfg_factory(*TINY, "method=ours", "speed.max_steps=0"))


def test_a_run_pairs_with_a_dense_run_recorded_before_engine_keys_and_late_options():
    old = {"batch_size": 4, "seed": 0, "limit": 8, "subset": None,
           "generation": {"do_sample": False, "max_new_tokens": 16}}  # fmt: skip
    new = {**old, "generation": {**old["generation"], "compile": "auto", "compaction": True,
                                 "batch_invariant": False}}  # fmt: skip
    assert pairing_key(old, "gsm8k", "m") == pairing_key(new, "gsm8k", "m")
    invariant = {**new, "generation": {**new["generation"], "batch_invariant": True}}
    assert pairing_key(old, "gsm8k", "m") != pairing_key(invariant, "gsm8k", "m")


def test_a_batch_that_stopped_at_once_has_no_per_step_ratio():
    s = paired_speedup([_timing([0.0], [0.0])], {"params": 0.0, "sparse_step_fraction": 0.0})
    assert s["step"] is None and s["e2e"]["median"] == pytest.approx(1.0)
    assert time_to_answer({"n": 1, "speedup": s}, {"n": 1}) is None


def test_wandb_summary_and_live_curves_carry_the_speedup():
    from bwprune.runs.tracking import running_metrics, summary_metrics

    row = {**_timing([1.0, 1.0], [1.2, 1.3]), "indices": [0], "samples": [0], "decode_tokens": 8}
    sample = {"index": 0, "correct": False, "score_reason": "wrong", "new_tokens": 8,
              "sparsity": {"ffn": 0.3, "ffn_sparse_steps": 0.5, "params": 0.2, "decode_steps": 8,
                           "sparse_steps": 4, "per_layer": [0.3]}}  # fmt: skip
    live = running_metrics([sample], [row], 0.5, "gsm8k")
    assert live["speed/speedup_step_median"] == pytest.approx(1.25)
    record = {"benchmark": "gsm8k", "metrics": {"speedup": paired_speedup([row], {}),
                                                "time_to_answer": 1.1}}  # fmt: skip
    out = summary_metrics(record)
    assert out["speed/speedup_e2e_min"] < out["speed/speedup_step_max"] == pytest.approx(1.3)
    assert out["speed/time_to_answer"] == 1.1
