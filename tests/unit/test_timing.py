"""Timing (bwprune/generation/timing.py): the alternation every paired comparison uses, adaptive
(`alternate_until`) for a run's paired timing and `make bench`, and step intervals read without a
sync per step."""

import pytest
import torch

from bwprune.generation import speed
from bwprune.generation.speed import measure
from bwprune.generation.timing import Precision, StepTimer, alternate, alternate_until
from bwprune.methods.base import PruningMethod
from bwprune.models.adapters import adapter_for
from bwprune.report.speed_table import markdown_table
from bwprune.runs.interference import between, snapshot
from bwprune.runs.speedup import median_interval, schedule_ideal
from tests.conftest import tiny_model


def test_alternation_reverses_the_order_every_repeat_and_drops_warm_up():
    calls: list[str] = []
    counter = iter(range(100))

    def trial(label):
        return lambda: calls.append(label) or next(counter)

    repeats: list[int] = []
    results = alternate({"a": trial("a"), "b": trial("b")}, repeats=3, warmup=1,
                        after_repeat=repeats.append)  # fmt: skip
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a"]  # A B, B A, ... so drift hits both
    assert results == {"a": [3, 4, 7], "b": [2, 5, 6]}  # the warm-up pair (0, 1) is dropped
    assert repeats == [0, 1, 2, 3]


def test_cpu_step_timer_gives_one_interval_between_consecutive_marks():
    timer = StepTimer(torch.device("cpu"))
    for _ in range(4):
        timer.mark()
    intervals = timer.intervals_s()
    assert len(intervals) == 3 and all(s >= 0 for s in intervals)


def _ratio_trials(ratios: list[float]) -> dict:
    """Trials whose i-th pair has ratio `ratios[i]` (dense time / method time)."""
    dense, method = iter(ratios), iter([1.0] * len(ratios))
    return {
        "method": lambda: {"decode_s": next(method)},
        "dense": lambda: {"decode_s": next(dense)},
    }


def _decode_ratios(results) -> list[list[float]]:
    return [[d["decode_s"] / m["decode_s"] for d, m in zip(results["dense"], results["method"])]]


def test_pairs_are_added_until_the_interval_is_tight_and_no_further():
    # 1.0 ± 1 %: tight as soon as an interval exists (6 pairs at 95 %).
    steady = [1.0, 1.01, 0.99, 1.0, 1.01, 0.99] + [5.0] * 20
    precision = Precision(1, 40, 0.03, 0.95, 1e9)
    results, stop = alternate_until(_ratio_trials([9.9, *steady]), precision, 1, _decode_ratios)
    assert stop["pairs"] == 6 and stop["stopped"] == "tight" and stop["reached"]
    assert [d["decode_s"] for d in results["dense"]] == steady[:6]  # warm-up (9.9) left out
    assert stop["half_width"] == pytest.approx(0.01)
    assert set(stop["interference"]) == {"cores", "load", "steal", "overloaded"}


def test_noisy_pairs_stop_at_the_cap_or_the_budget_unreached():
    noisy = [1.0, 1.5, 0.7] * 20
    _, stop = alternate_until(_ratio_trials(noisy), Precision(3, 9, 0.03, 0.95, 1e9), 0,
                              _decode_ratios)  # fmt: skip
    assert (stop["pairs"], stop["stopped"], stop["reached"]) == (9, "cap", False)
    ticks = iter(range(100))  # one second per clock reading: one per pair from the third on
    _, stop = alternate_until(_ratio_trials(noisy), Precision(3, 40, 0.03, 0.95, 2.5), 0,
                              _decode_ratios, clock=lambda: next(ticks))  # fmt: skip
    assert (stop["pairs"], stop["stopped"]) == (5, "budget")
    _, stop = alternate_until(_ratio_trials(noisy), Precision(3, 40, 0.03, 0.95, 0.0), 0,
                              _decode_ratios)  # fmt: skip
    assert (stop["pairs"], stop["stopped"]) == (3, "budget")  # never before min_pairs


def test_progress_hears_the_start_and_every_pair_with_the_interval_so_far():
    heard: list[dict] = []
    steady = [1.0, 1.01, 0.99, 1.0, 1.01, 0.99]
    alternate_until(_ratio_trials([9.9, *steady]), Precision(1, 40, 0.03, 0.95, 1e9), 1,
                    _decode_ratios, progress=heard.append)  # fmt: skip
    assert [h["pairs"] for h in heard] == [0, 1, 2, 3, 4, 5, 6]
    assert heard[0]["warming_up"] and not heard[1]["warming_up"]
    assert [h["half_width"] for h in heard[:6]] == [None] * 6  # no interval below six pairs
    assert heard[-1]["half_width"] == pytest.approx(0.01)
    assert all(h["seconds"] >= 0 and h["precision"].half_width == 0.03 for h in heard)


def test_the_interval_of_the_median_is_exact_and_absent_below_six_values():
    assert median_interval([1.0, 2.0, 3.0, 4.0, 5.0], 0.95) is None  # (min, max) covers 94 %
    assert median_interval([3.0, 1.0, 2.0, 6.0, 5.0, 4.0], 0.95) == (1.0, 6.0)  # covers 97 %
    # n = 30: ranks 10 and 21 cover 1 - 2 P(Bin(30, 1/2) <= 9) = 95.7 %, ranks 11 and 20 only 90 %.
    assert median_interval([float(i) for i in range(1, 31)], 0.95) == (10.0, 21.0)


def test_interference_flags_a_load_above_the_cores_and_reads_steal(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 0 0 0 50 0 0\ncpu0 1 2 3\n")
    start = snapshot(stat)
    stat.write_text("cpu  200 0 100 1600 0 0 0 100 0 0\n")
    end = snapshot(stat)
    assert between(start, end, cores=16)["steal"] == pytest.approx(50 / 1000)
    quiet = between({"load": 1.3, "ticks": None}, {"load": 1.9, "ticks": None}, cores=2)
    alone = between({"load": 2.0, "ticks": None}, {"load": 2.1, "ticks": None}, cores=2)
    busy = between({"load": 1.3, "ticks": None}, {"load": 2.4, "ticks": None}, cores=2)
    # the timing's own threads keep the load at about the cores: a quarter core more is others'
    assert (quiet["overloaded"], alone["overloaded"], busy["overloaded"]) == (False, False, True)
    assert busy["steal"] is None


def test_make_bench_times_through_the_same_procedure_and_shows_its_intervals():
    model, tok = tiny_model("tiny_llama")
    methods = {"dense": PruningMethod(), "dense_again": PruningMethod()}
    rows = measure(model, tok, adapter_for(model), methods, [2], Precision(6, 6, 0.03, 0.95, 1e9),
                   new_tokens=4, prompt_len=8, warmup=0, with_hf_generate=False)  # fmt: skip
    again = next(r for r in rows if r["method"] == "dense_again")
    assert again["precision"]["pairs"] == 6 and again["repeats"] == 6
    s = again["speedup_decode"]
    assert s["low"] == s["min"] and s["high"] == s["max"]  # 6 repeats: (min, max) at 95 %
    assert "Speedups: median [95% interval of the median]" in markdown_table(rows)


def test_a_scheduled_methods_ideal_comes_from_its_own_mask_frozen_step():
    """Griffin (every step sparse, a faster step) timed last must not lend ours its step."""

    def run(step_ms: float, f: float) -> dict:
        decode = 64 * step_ms / 1000
        sparsity = {"sparse_step_fraction": f, "ffn_sparse_steps": f, "params": 0.2 * f}
        return {"prefill_s": 0.1, "decode_s": decode, "e2e_s": 0.1 + decode, "step_ms": step_ms,
                "tokens_per_s": 64 / decode, "sparsity": sparsity}  # fmt: skip

    samples = {label: [run(ms, f)] * 6 for label, ms, f in (
        ("dense", 100.0, 0.0), ("ours", 90.0, 0.5), ("ours_frozen", 80.0, 1.0),
        ("griffin", 50.0, 1.0), ("dense@c", 100.0, 0.0), ("ours@c", 90.0, 0.5),
    )}  # fmt: skip
    bytes_ = {"read": 100.0, "params": 100.0}
    rows = {r["method"]: r for r in speed._summarize(4, samples, bytes_, 0.95)}
    assert rows["ours"]["ideal_measured_r"] == pytest.approx(schedule_ideal(0.5, 100 / 80))
    assert "ideal_measured_r" not in rows["ours@c"]  # no ours_frozen@c was timed
