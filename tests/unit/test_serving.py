"""Serving without vLLM: settings, keys, the port and the server's identity, what a load test's
result becomes, the serving table."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from bwprune.errors import UserError
from bwprune.report.serving import load_records, serving_frame
from bwprune.vllm.serving.load import load_metrics, record_key, request_rows
from bwprune.vllm.serving.server import ServeSettings, answers_as, refuse_taken, wait_ready
from tests.conftest import compose_cfg
from tests.system.standin_server import impostor


def serve_cfg(*overrides: str):
    from hydra import compose, initialize_config_dir

    from tests.conftest import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("serve", overrides=["progress=false", *overrides])


def test_a_host_beyond_loopback_needs_an_api_key(monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    settings = ServeSettings.from_config(serve_cfg())
    assert settings.url == "http://127.0.0.1:8765" and settings.headers == {}
    for host in ("0.0.0.0", "192.168.1.7", "gpu-node"):  # a name may resolve to anything
        with pytest.raises(UserError, match=rf"serve.host='{host}'.*serve.api_key.*VLLM_API_KEY"):
            ServeSettings.from_config(serve_cfg(f"serve.host={host}"))
    for host in ("127.0.0.2", "localhost"):
        assert ServeSettings.from_config(serve_cfg(f"serve.host={host}")).api_key is None
    assert ServeSettings.from_config(serve_cfg("serve.host='::1'")).url == "http://[::1]:8765"
    keyed = ServeSettings.from_config(serve_cfg("serve.host=0.0.0.0", "serve.api_key=s3cret"))
    assert keyed.headers == {"Authorization": "Bearer s3cret"} and "s3cret" not in repr(keyed)
    monkeypatch.setenv("VLLM_API_KEY", "from-env")  # vLLM's own variable counts as the key
    assert ServeSettings.from_config(serve_cfg("serve.host=0.0.0.0")).api_key == "from-env"
    assert ServeSettings.from_config(serve_cfg("serve.api_key=s3cret")).api_key == "s3cret"


def settings_on(port: int, startup_s: float = 60) -> ServeSettings:
    return ServeSettings("127.0.0.1", port, startup_s, drain_s=1, stop_s=5, kv_cache_gib=1)


@pytest.mark.parametrize("name, compile_, eager, cached", [
    ("dense", "auto", False, True), ("ours", "auto", False, False),
    ("griffin", "auto", False, False), ("cats", "auto", False, False),
    ("teal", "auto", True, False), ("ours", "false", True, False),
])  # fmt: skip
def test_a_server_compiles_what_keeps_its_decisions_in_the_ffn(tmp_path, name, compile_, eager,
                                                               cached):  # fmt: skip
    """Ours, Griffin and CATS decide inside the FFN's op and are served compiled like dense;
    TEAL masks attention's inputs and runs eager; prefix caching only for a fixed model."""
    from bwprune.config import build_method
    from bwprune.vllm.serving.serve import server_command

    cfg = serve_cfg(f"method={name}", f"generation.vllm.compile={compile_}")
    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 512,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "hidden_size": 64}))  # fmt: skip
    command = server_command(cfg, tmp_path, tmp_path / "ledger.jsonl", build_method(cfg.method),
                             "bwprune-x")  # fmt: skip
    assert ("--enforce-eager" in command) == eager
    assert ("--no-enable-prefix-caching" not in command) == cached
    config = json.loads(command[command.index("--additional-config") + 1])
    assert config["bwprune"]["compiled"] is not eager
    assert config["bwprune"]["rows"] is (name in ("ours", "griffin"))  # neuron-set methods slice
    assert command[command.index("--max-model-len") + 1] == "512"  # its KV cache holds more


def test_a_taken_port_is_refused_in_one_line():
    with impostor(["bwprune"]) as port, pytest.raises(UserError) as refused:
        refuse_taken(settings_on(port))
    assert str(refused.value) == (
        f"serve.port={port}: another process listens on 127.0.0.1:{port}; free it (`lsof -i "
        f":{port}` names it, `fuser -k {port}/tcp` ends it) or choose another serve.port"
    )
    refuse_taken(settings_on(port))  # free again


def test_only_the_server_launched_counts_as_ready(tmp_path):
    """Another server on the port answers /health and lists the model `bwprune` (one left
    running by an earlier launch), but not this launch's own name: never taken for ours."""
    log = tmp_path / "server.log"
    log.write_text("Address already in use\n")
    with impostor(["bwprune", "bwprune-earlier"]) as port:
        settings = settings_on(port, startup_s=0.5)
        assert answers_as(settings, "bwprune-earlier")
        with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as alive:
            with pytest.raises(UserError, match="did not answer as itself"):
                wait_ready(settings, alive, "bwprune-0123abcd", log)
            alive.kill()
        exited = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
        exited.wait()
        with pytest.raises(UserError, match=r"exited \(1\) before it was ready(.|\n)*in use"):
            wait_ready(settings_on(port), exited, "bwprune-0123abcd", log)


def test_a_record_key_names_the_rate_and_changes_with_what_is_computed():
    cfg = serve_cfg("method=ours")
    key = record_key(cfg, 0.5)
    assert key.startswith("gsm8k/smollm2_135m/ours/rate=0.5_bs=16_n=32_")
    assert record_key(cfg, 1.0) != key
    assert record_key(serve_cfg("method=ours", "method.memory_policy=request"), 0.5) != key
    assert record_key(serve_cfg("method=ours", "serve.port=9000"), 0.5) == key  # how, not what
    assert compose_cfg(["method=ours"]).batch_size != cfg.batch_size  # serve.yaml's own seats


class Gsm8kLike:
    def score(self, text, gold, finish, think_open):
        from bwprune.scoring.common import Score

        answer = text.split()[-1] if finish == "stop" else None
        return Score(None if answer is None else answer == gold, answer, "ok")


class Example:
    def __init__(self, index, gold):
        self.index, self.id, self.gold = index, f"p{index}", gold


RESULT = {
    "generated_texts": ["so 4", "and so on", "it is 7"], "output_lens": [10, 8, 5],
    "ttfts": [0.1, 0.2, 0.3], "latencies": [1.0, 0.9, 0.7], "duration": 3.0,
    "request_throughput": 1.0, "output_throughput": 7.7,
}  # fmt: skip


def test_a_request_row_holds_its_latencies_score_and_nll():
    rows = request_rows(Gsm8kLike(), [Example(0, "4"), Example(1, "2"), Example(2, "7")],
                        ["q0", "q1", "q2"], RESULT, [(2.0, 4), (1.0, 2), (0.5, 1)], 8)  # fmt: skip
    assert [r["finish_reason"] for r in rows] == ["length", "length", "stop"]
    assert [r["correct"] for r in rows] == [None, None, True]
    assert rows[0]["tpot_ms"] == pytest.approx(1e3 * 0.9 / 9)
    assert rows[2]["e2e_ms"] == pytest.approx(700.0)
    m = load_metrics(rows, RESULT, {"ffn": 0.4, "params": 0.2})
    assert m["dense_nll_per_token"] == pytest.approx(3.5 / 7)
    assert m["accuracy"] == pytest.approx(1 / 3)
    assert m["e2e_ms"]["p50"] == pytest.approx(900.0)
    assert m["ttft_ms"]["mean"] == pytest.approx(200.0)


def write_record(root, method: str, rate: float, predictions: list, policy: str = "max"):
    folder = root / method / f"{policy}_{rate}"
    folder.mkdir(parents=True)
    policy_line = f"  memory_policy: {policy}\n" if method == "ours" else ""
    (folder / "config.yaml").write_text(f"method:\n  name: {method}\n{policy_line}")
    (folder / "requests.jsonl").write_text(
        "".join(json.dumps({"index": i, "prediction": p}) + "\n" for i, p in enumerate(predictions))
    )
    spread = {"p50": 1.0, "p99": 2.0, "mean": 1.5}
    metrics = {
        "requests": len(predictions),
        "request_throughput": rate,
        "output_throughput": 9.0,
        "ttft_ms": spread,
        "tpot_ms": spread,
        "e2e_ms": spread,
        "accuracy": 0.5,
        "dense_nll_per_token": 0.8,
        "realized_sparsity": {"ffn": 0.3, "params": 0.1},
    }
    (folder / "run.json").write_text(json.dumps(
        {"key": f"{method}/{policy}/{rate}", "benchmark": "gsm8k", "model": "m",
         "batch_size": 4, "rate": rate, "metrics": metrics}))  # fmt: skip


def test_agreement_is_with_dense_at_the_same_rate(tmp_path):
    write_record(tmp_path, "dense", 1.0, ["4", "2", None, "9"])
    write_record(tmp_path, "dense", 2.0, ["4", "5", None, "9"])
    write_record(tmp_path, "ours", 1.0, ["4", "3", None, None])
    write_record(tmp_path, "ours", 1.0, ["4", "2", "1", "9"], policy="request")
    write_record(tmp_path, "teal", 3.0, ["4", "2", None, "9"])  # no dense at its rate
    frame = load_records(tmp_path).set_index(["method", "rate"])
    assert frame.loc[("ours (max)", 1.0), "agreement"] == pytest.approx(1 / 3)  # 3 answered, 1 same
    assert frame.loc[("ours (request)", 1.0), "agreement"] == pytest.approx(3 / 4)
    assert frame.loc[("dense", 2.0), "agreement"] == pytest.approx(1.0)
    assert pd.isna(frame.loc[("teal", 3.0), "agreement"])
    table = serving_frame(load_records(tmp_path))
    assert list(table["method"][:3]) == ["dense", "dense", "ours (max)"]
    assert "TPOT p50 ms" in table.columns and "agree" in table.columns


def test_a_soak_is_read_per_minute_and_judged():
    from bwprune.vllm.serving.soak import minutes, verdict

    results = [{"start_s": t - 2.0, "end_s": t, "tokens": 30, "error": None}
               for t in np.arange(3.0, 200.0, 1.0)]  # fmt: skip
    samples = [{"t_s": t, "answered": 0, "ledger_lines": int(t), "worker_rss_mib": 500.0 + t / 60}
               for t in range(0, 200, 5)]  # fmt: skip
    rows = minutes(results, samples)
    assert [m["minute"] for m in rows] == [1, 2, 3, 4]
    assert [m["finished"] for m in rows[:3]] == [57, 60, 60]
    assert rows[1]["tok_per_s"] == pytest.approx(30.0) and rows[1]["e2e_p50_ms"] == 2000.0
    assert rows[1]["ledger_lines"] == 115 and rows[3]["span_s"] == pytest.approx(19.0)
    judged = verdict(results, len(results), rows, growth_mib=64)
    assert judged["failed"] == 0 and judged["one_ledger_line_per_request"]
    assert judged["memory_within_bound"] and judged["worker_rss_growth_mib"] < 3
    assert judged["p50_trend_per_minute"] is None  # two full minutes after the first: no trend
    leaking = [{**m, "worker_rss_mib": 500.0 + 100 * m["minute"]} for m in rows]
    assert not verdict(results, len(results) - 1, leaking, 64)["memory_within_bound"]
    assert not verdict(results, len(results) - 1, leaking, 64)["one_ledger_line_per_request"]
    # vLLM alone grew as much under the same load: only the growth beyond it is the method's
    beyond = verdict(results, len(results), leaking, 64, control_mib=290.0)
    assert beyond["memory_within_bound"] and beyond["vllm_alone_growth_mib"] == 290.0
    assert not verdict(results, len(results), leaking, 64, control_mib=200.0)["memory_within_bound"]
    assert verdict(results, None, rows, 64)["one_ledger_line_per_request"] is None  # vLLM alone


def test_every_method_soak_shares_one_control_of_vllm_alone():
    from bwprune.vllm.serving.soak import ALONE, control_key, soak_key

    ours, dense = serve_cfg("method=ours"), serve_cfg("method=dense")
    assert control_key(ours) == control_key(dense) != soak_key(dense)
    assert control_key(ours).split("/")[1] == ALONE and soak_key(ours).split("/")[1] == "ours"
    dense.serve.kv_cache_gib = 0.1  # another load, another control
    assert control_key(dense) != control_key(ours)


def test_served_determinism_compares_with_the_first_answer_alone():
    from bwprune.vllm.serving.determinism import same

    alone = [["4", "4", "5"], ["7", "7", "7"]]
    assert same(alone, alone, skip_first=True) == pytest.approx(3 / 4)
    assert same([["4", "x", "4"], ["7", "7", "1"]], alone) == pytest.approx(4 / 6)
