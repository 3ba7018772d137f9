"""Sharded runs: shards get whole batches of the unsharded run, and merge into exactly that run."""

import json
import shutil

import pytest

from bwprune.errors import UserError
from bwprune.experiment import run
from bwprune.report.collect import load_runs
from bwprune.runs.recorder import RunRecorder
from bwprune.runs.shards import shard_batches
from tests.conftest import compose_cfg


def test_shards_are_dealt_whole_batches_round_robin():
    items = list(range(7))
    shards = [shard_batches(items, 2, s, 2) for s in (0, 1)]
    assert shards == [[[0, 1], [4, 5]], [[2, 3], [6]]]
    assert sorted(x for s in shards for b in s for x in b) == items


# `ours` shares one mask per batch: only batches identical to the unsharded run's give its outputs.
BASE = ["model=tiny_llama", "method=ours", "limit=5", "batch_size=2",
        "generation.max_new_tokens=12", "quality.enabled=true", "quality.max_tokens=6"]  # fmt: skip


@pytest.mark.slow
def test_merged_shards_equal_the_unsharded_run(tmp_path):
    whole = run(compose_cfg(BASE, tmp_path / "whole"))
    sharded = tmp_path / "sharded"
    first = run(compose_cfg([*BASE, "shard=0", "num_shards=2"], sharded))
    assert first["metrics"]["problems"] == 3  # batches 0 and 2 of 3: problems 0, 1 and 4
    assert not (sharded / "runs" / whole["run_key"]).exists()  # shard 1 still missing
    run(compose_cfg([*BASE, "shard=1", "num_shards=2"], sharded))

    merged_dir = sharded / "runs" / whole["run_key"]
    merged = json.loads((merged_dir / "run.json").read_text())
    assert len(merged["merged_from"]) == len(merged["shard_provenance"]) == 2
    assert not list((sharded / "runs").glob(".merging-*"))  # the staging folder is gone
    ignore = (
        "decode_tokens_per_s",
        "decode_ms_per_step",
        "prefill_s",
        "decode_s",
        "decode_s_per_problem",
        "speedup",
        "time_to_answer",
    )  # timings: each run its own
    assert {k: v for k, v in merged["metrics"].items() if k not in ignore} == {
        k: v for k, v in whole["metrics"].items() if k not in ignore
    }

    def outputs(d):
        return [(s["index"], s["completion"], s["sparsity"]) for s in RunRecorder(d, "").samples()]

    assert outputs(merged_dir) == outputs(tmp_path / "whole" / "runs" / whole["run_key"])
    assert run(compose_cfg(BASE, sharded))["run_key"] == whole["run_key"]  # complete: skipped
    assert list(load_runs(sharded / "runs")["run_key"]) == [whole["run_key"]]  # shards hidden

    for key in merged["merged_from"]:  # a clone that keeps the merged run only
        shutil.rmtree(sharded / "runs" / key)
    again = run(compose_cfg([*BASE, "shard=0", "num_shards=2"], sharded))
    assert again["stored"] and again["run_key"] == whole["run_key"]
    assert not (sharded / "runs" / merged["merged_from"][0]).exists()  # the shard not redone


def test_perplexity_cannot_be_sharded(tmp_path):
    cfg = compose_cfg(["model=tiny_llama", "benchmark=wikitext2", "num_shards=2"], tmp_path)
    with pytest.raises(UserError, match=r"num_shards=2: benchmark=wikitext2 .* cannot be sharded"):
        run(cfg)


def test_continuous_shards_stream_their_own_work_and_merge(tmp_path):
    """A stream is cut into shards as static batches are; each shard streams its part, and for a
    method whose rows do not see each other the merged run equals the unsharded stream."""
    stream = ["model=tiny_llama", "limit=5", "batch_size=2", "generation.max_new_tokens=8",
              "generation.batching=continuous"]  # fmt: skip
    whole = run(compose_cfg(stream, tmp_path / "whole"))
    sharded = tmp_path / "sharded"
    for shard in (0, 1):
        run(compose_cfg([*stream, f"shard={shard}", "num_shards=2"], sharded))

    def outputs(d):
        return [(s["index"], s["completion"]) for s in RunRecorder(d, "").samples()]

    merged = outputs(sharded / "runs" / whole["run_key"])
    assert sorted(merged) == sorted(outputs(tmp_path / "whole" / "runs" / whole["run_key"]))
