"""Where decode time goes: every decode forward's kind, each refresh's host time and the overlap of
consecutive kept sets, as a host logs them (`bwprune.methods.host.PhaseLog`)."""

import pytest

from bwprune.generation.runner import BatchedRunner, SamplingConfig
from bwprune.methods.host import PhaseLog
from bwprune.models.adapters import adapter_for
from tests.conftest import PROMPTS, chat, method_from_conf, prepared


def test_summary_takes_each_kind_of_step_apart():
    log = PhaseLog(["dense", "dense", "refresh", "sparse", "sparse", "sparse"], [0.002],
                   [[0.75, 0.25]])  # fmt: skip
    out = log.summary([0.010, 0.012, 0.009, 0.004, 0.006, 0.005])
    assert out["dense_step_ms"] == pytest.approx(11.0)
    assert out["refresh_step_ms"] == pytest.approx(9.0)
    assert out["sparse_step_ms"] == pytest.approx(5.0)
    assert out["refreshes"] == 1 and out["refresh_ms"] == pytest.approx(2.0)
    assert out["overlap"] == pytest.approx(0.5)
    assert PhaseLog().summary([]) == {"refreshes": 0}


def test_a_sharded_forwards_gathers_are_summed_and_shown_beside_its_phases():
    """Tensor parallel: each layer's gather adds to its forward's (layer 0 starts a forward);
    the summary's median is per forward, and the phase table shows it only for such rows."""
    from bwprune.report.speed_table import phase_table

    log = PhaseLog(["dense", "sparse"], [], [])
    for forward in ([0.001, 0.002, 0.001], [0.003, 0.003, 0.002], [0.001, 0.001, 0.002]):
        for layer, seconds in enumerate(forward):
            log.gathered(layer, seconds)
    out = log.summary([0.010, 0.005])
    assert list(log.gather_s) == pytest.approx([0.004, 0.008, 0.004])
    assert out["gather_ms"] == pytest.approx(4.0)
    row = {"batch_size": 4, "method": "ours@vllm_tp2", "phases": out,
           "speedup_decode": {"median": 1.1}}  # fmt: skip
    assert phase_table([row]).splitlines()[0].endswith("all-gather ms per observing forward |")
    assert phase_table([row]).splitlines()[2].endswith("| 4.00 |")
    del out["gather_ms"]
    assert "all-gather" not in phase_table([row])


def test_an_endless_streams_log_keeps_only_its_latest_steps(monkeypatch):
    """A server's stream never ends: the log holds the last STEPS forwards and REFRESHES
    refreshes, and summarises the steps it was given."""
    monkeypatch.setattr(PhaseLog, "STEPS", 8)
    monkeypatch.setattr(PhaseLog, "REFRESHES", 2)
    log = PhaseLog()
    for step in range(1000):
        log.kinds.append("sparse" if step % 2 else "dense")
        if step % 10 == 0:
            log.refresh_s.append(step / 1e3)
            log.overlap.append([0.5] * 30)
    assert (len(log.kinds), len(log.refresh_s), len(log.overlap)) == (8, 2, 2)
    out = log.summary([0.001, 0.003] * 4)
    assert out["dense_step_ms"] == pytest.approx(1.0) and out["sparse_step_ms"] == pytest.approx(
        3.0
    )
    assert out["refresh_ms"] == pytest.approx(985.0)


def test_a_generation_logs_its_schedule_refreshes_and_overlaps(tiny):
    """ours at t_init 4, periods of 3 sparse + 2 dense steps over 20 steps: dense steps 0-3,
    the first mask at step 4, then a refresh at every period's first sparse step; each refresh
    after the first moves only part of the kept set (the overlaps are those of the kept sets)."""
    model, tok = tiny
    method = method_from_conf("ours", sparsity=0.5, t_init=4, t_explore=2, t_prune=3)
    prepared(method, model, tok)
    runner = BatchedRunner(model, tok, method, adapter_for(model),
                           SamplingConfig(21, ignore_eos=True))  # fmt: skip
    _, timing = runner.generate_tokens(*runner.encode(chat(tok, PROMPTS)))
    kinds = list(runner.driver.host.log.kinds)
    assert len(kinds) == len(timing.step_s) == 20
    period = ["refresh", "sparse", "sparse", "dense", "dense"]
    assert kinds == ["dense"] * 4 + period * 3 + ["refresh"]
    assert timing.phases["refreshes"] == 4
    assert 0.0 <= timing.phases["overlap"] <= 1.0
    assert set(timing.phases) >= {"dense_step_ms", "sparse_step_ms", "refresh_step_ms"}
