"""`make soak [METHOD=ours] [ARGS=overrides]`: one server at saturation for serve.soak.requests
requests (conf/serve.yaml; bwprune/vllm/serving/soak.py), watched per minute for drift in
throughput, latency, the worker's memory and the ledger; a record under results/serve/soak/.

    python scripts/soak.py method=ours                               # 1000 requests
    python scripts/soak.py method=ours serve.kv_cache_gib=0.06 generation.vllm.max_model_len=1024
                                                                     # a KV cache that preempts
"""

import sys
from pathlib import Path

from bwprune.config import compose_config
from bwprune.vllm.serving.server import run_until_signal

ROOT = Path(__file__).resolve().parent.parent


def main(overrides: list[str]) -> None:
    cfg = compose_config(ROOT / "conf", overrides, name="serve")
    from bwprune.vllm.serving.soak import soak

    record = soak(cfg)
    print(f"{record['key']}: {record['requests']} requests in {record['duration_s']:.0f} s, "
          f"{record['preemptions']} preemptions, {record['ledger_lines']} ledger "
          f"lines")  # fmt: skip
    print("| minute | finished | tok/s | E2E p50 s | E2E p99 s | worker MiB | ledger lines |")
    print("|---|---|---|---|---|---|---|")
    for m in record["minutes"]:
        p50, p99 = (m[k] and m[k] / 1e3 for k in ("e2e_p50_ms", "e2e_p99_ms"))
        print(
            f"| {m['minute']} | {m['finished']} | {m['tok_per_s']:.1f} | {p50 or 0:.1f} | "
            f"{p99 or 0:.1f} | {m.get('worker_rss_mib', 0):.0f} | {m['ledger_lines']} |"
        )
    print(record["verdict"])


if __name__ == "__main__":
    run_until_signal(main, sys.argv[1:], "the server is stopped; the soak's record is incomplete")
