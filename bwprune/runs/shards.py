"""Sharding a benchmark across jobs, and merging the shards' records into the one unsharded run.

Shards are dealt whole batches, round-robin, from the batches of the unsharded run. A batch-shared
mask depends on which problems share the batch, so only this keeps every shard's batch identical
to a batch of the unsharded run: the merged shards then are that run (same samples, same realized
sparsity), and they are written under its run key, where tables and `run.py` find them.
The last shard to finish merges; a complete unsharded run is never rewritten.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import TypeVar

from omegaconf import DictConfig, OmegaConf

from bwprune.runs.identity import run_key, target_sparsity
from bwprune.runs.recorder import RunRecorder
from bwprune.runs.summary import summarize
from bwprune.runs.tracking import make_tracker

log = logging.getLogger(__name__)
Item = TypeVar("Item")


def shard_batches(
    items: Sequence[Item], batch_size: int, shard: int, num_shards: int
) -> list[list[Item]]:
    """This shard's batches: batch j of the unsharded run goes to shard j mod `num_shards`."""
    batches = [list(items[i : i + batch_size]) for i in range(0, len(items), batch_size)]
    return batches[shard::num_shards]


def with_shard(cfg: DictConfig, shard: int, num_shards: int) -> DictConfig:
    """`cfg` as shard `shard` of `num_shards` would have it (0 of 1: the unsharded run)."""
    out = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    out.shard, out.num_shards = shard, num_shards
    return out


def merge_shards(cfg: DictConfig) -> dict | None:
    """Once every shard of `cfg`'s run is complete, write the unsharded run from their records.

    Returns the merged `run.json` record, or None while a shard is still missing. The merged
    folder is built aside and renamed into place, so two shards finishing together cannot
    interleave their writes; the merged run is mirrored to the tracker like any run.
    """
    runs_dir = cfg.paths.runs_dir
    shards = [RunRecorder(runs_dir, run_key(with_shard(cfg, i, cfg.num_shards)))
              for i in range(cfg.num_shards)]  # fmt: skip
    missing = [r.key for r in shards if not r.is_complete()]
    if missing:
        log.info("%d of %d shards complete; merging waits for %s", len(shards) - len(missing),
                 len(shards), missing)  # fmt: skip
        return None
    whole = with_shard(cfg, 0, 1)
    key = run_key(whole)
    final = RunRecorder(runs_dir, key)
    if final.is_complete():
        return final.record()
    # Built aside (a unique folder, also across hosts sharing the file system), then renamed.
    staging = tempfile.mkdtemp(prefix=".merging-", dir=runs_dir)
    merged = RunRecorder(staging, key)
    merged.start(whole)
    rows = [r.rows() for r in shards]
    samples = sorted((s for shard, _ in rows for s in shard), key=RunRecorder.row_key)
    timings = sorted((t for _, shard in rows for t in shard),
                     key=lambda t: (t["samples"][0], t["indices"][0]))  # fmt: skip
    merged.write(samples, timings)
    records = [r.record() for r in shards]
    record = merged.finish(
        summarize(samples, timings, target_sparsity(whole)),
        records[0]["provenance"],
        extra={
            **{k: records[0][k] for k in ("benchmark", "model", "method")},
            "merged_from": [r.key for r in shards],
            "shard_provenance": [r["provenance"] for r in records],
        },
    )
    final.dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(merged.dir, final.dir)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if final.is_complete():  # another shard's merge got there first: the same run
            return final.record()
        log.warning("not merged: %s exists and is not a complete run; remove it, or finish it "
                    "with the unsharded config", final.dir)  # fmt: skip
        return None
    shutil.rmtree(staging, ignore_errors=True)
    log.info("merged %d shards into %s", len(shards), final.dir)
    tracker = make_tracker(whole, key, record["method"])
    try:
        tracker.log_run(record, samples)
    finally:
        tracker.finish()
    return record
