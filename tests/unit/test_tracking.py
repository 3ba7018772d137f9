"""Live W&B logging, checked on the offline run's own records (no server is reachable in tests).

W&B writes an offline run to `run-<id>.wandb`, a LevelDB-style log of protobuf records; the history
and summary read from it are what `wandb sync` would upload.
"""

import json
import struct
import time
from pathlib import Path

import pytest

from bwprune.experiment import run
from bwprune.runs.tracking import running_metrics, summary_metrics, wandb_run_id
from tests.conftest import interrupt_generation

TINY = ["model=tiny_llama", "limit=6", "batch_size=2", "generation.max_new_tokens=8"]
WANDB = ["logger=wandb", "logger.mode=offline", "quality.enabled=true", "quality.max_tokens=4"]
BLOCK = 32768  # LevelDB log block; W&B's file starts with a 7-byte header


def wandb_records(path: Path) -> list:
    """The complete protobuf records of an offline W&B run file (LevelDB log chunks)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, chunks, records = path.read_bytes(), 7, b"", []
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a chunk header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if pos + 7 + length > len(data):  # the writer is still at it
            break
        chunks += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a record is complete
            records.append(pb.Record())
            records[-1].ParseFromString(chunks)
            chunks = b""
    return records


def offline_run(path: Path, timeout_s: float = 60) -> tuple[str, list[dict], dict]:
    """(run id, history entries, final summary) of a finished offline run. W&B's service writes
    the file in the background and may still be at it after `finish` returns: wait for the run's
    `exit` record, its last."""
    deadline = time.monotonic() + timeout_s
    while not any(r.WhichOneof("record_type") == "exit" for r in wandb_records(path)):
        assert time.monotonic() < deadline, f"no exit record in {path} after {timeout_s} s"
        time.sleep(0.2)
    history, summary, run_id = [], {}, None
    for r in wandb_records(path):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            run_id = r.run.run_id
        elif kind == "history":
            history.append(_items(r.history.item))
        elif kind == "summary":
            summary.update(_items(r.summary.update))
    return run_id, history, summary


def _items(items) -> dict:
    """W&B stores a key holding "/" as a nested key."""
    return {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}


@pytest.fixture
def wandb_files(monkeypatch, tmp_path) -> list[Path]:
    """The `.wandb` file of every W&B run started in the test, in order. W&B keeps the folder of
    the process's first run: the one set here holds it when this test is first, so it is asked for
    rather than assumed."""
    import wandb

    for var in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb"))
    real_init, files = wandb.init, []

    def init(**kwargs):
        run_ = real_init(**kwargs)
        files.append(Path(run_.dir).parent / f"run-{run_.id}.wandb")
        return run_

    monkeypatch.setattr(wandb, "init", init)
    return files


def test_offline_history_has_one_entry_per_batch_and_summary_equals_run_json(
    cfg_factory, wandb_files
):
    record = run(cfg_factory(*TINY, *WANDB))
    (path,) = wandb_files
    run_id, history, summary = offline_run(path)
    assert run_id == wandb_run_id(record["run_key"])
    assert [h["n"] for h in history] == [2, 4, 6], "one entry per batch, problems as the step"
    assert all(h["live_rows"] == 2 and "quality/kl" in h for h in history)
    final = summary_metrics(record)
    assert {k: summary[k] for k in final} == final
    assert history[-1]["acc/gsm8k"] == record["metrics"]["accuracy"]
    assert history[-1]["sparsity/realized_ffn"] == pytest.approx(final["sparsity/realized_ffn"])


def test_resumed_run_continues_its_curves(cfg_factory, wandb_files, monkeypatch):
    overrides = [*TINY, "logger=wandb", "logger.mode=offline"]
    resume = interrupt_generation(monkeypatch, call=2)
    with pytest.raises(KeyboardInterrupt):
        run(cfg_factory(*overrides))
    resume()
    run(cfg_factory(*overrides))
    (first_id, first, _), (second_id, second, _) = map(offline_run, wandb_files)
    assert first_id == second_id, "the same W&B run, resumed"
    assert [h["n"] for h in first] == [2] and [h["n"] for h in second] == [4, 6]


def test_running_metrics_of_the_rows_so_far():
    sparsity = {"decode_steps": 4, "sparse_steps": 2, "ffn": 0.25, "ffn_sparse_steps": 0.5,
                "params": 0.1, "per_layer": [0.25]}  # fmt: skip
    rows = [
        {"index": i, "correct": c, "score_reason": r, "new_tokens": t, "sparsity": sparsity}
        for i, (c, r, t) in enumerate([(True, "ok", 5), (None, "no_answer", 9), (False, "ok", 4)])
    ]
    timings = [{"decode_s": 2.0, "decode_tokens": 12, "step_ms": [1.0], "prefill_s": 0.5}]
    m = running_metrics(rows, timings, 0.5, "gsm8k")
    assert m["n"] == 3 and m["acc/gsm8k"] == pytest.approx(1 / 3)
    assert m["unscorable_share"] == pytest.approx(1 / 3) and m["gen/mean_new_tokens"] == 6
    assert m["speed/decode_tokens_per_s"] == 6 and m["sparsity/realized_ffn"] == 0.25
    assert m["sparsity/realized_params"] == pytest.approx(0.1) and m["sparsity/target"] == 0.5


def test_a_key_without_a_reachable_server_falls_back_to_offline_at_once(
    cfg_factory, wandb_files, monkeypatch, caplog
):
    """wandb alone would retry for ~90 s; the run goes offline within the connect timeout."""
    import socket

    with socket.socket() as probe:  # a loopback port nobody listens on: connecting is refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
    start = time.monotonic()
    with caplog.at_level("WARNING", logger="bwprune.runs.tracking"):
        run(cfg_factory(*TINY, "logger=wandb", "logger.mode=auto", "logger.connect_timeout_s=2"))
    assert time.monotonic() - start < 60
    assert "not reachable within 2 s; logging offline" in caplog.text
    assert offline_run(wandb_files[0])[1]  # its history was logged, offline
