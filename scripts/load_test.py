"""`make load-sweep [ARGS=overrides]`: load tests of served methods at several request rates
(conf/serve.yaml; bwprune/vllm/serving/load.py), one fresh server each, a record each under
results/serve/; `make tables` and `make figures` then give the latency-throughput view.

    python scripts/load_test.py                                  # serve.methods x serve.rates
    python scripts/load_test.py 'serve.methods=[ours]' 'serve.rates=[0.5]' limit=8

A method is a name in conf/method/, or 'name:override,...' in quotes (Hydra's list grammar):
    python scripts/load_test.py "serve.methods=[dense,'ours:method.memory_policy=max']"
Recorded tests are skipped, so an interrupted sweep (Ctrl-C, SIGTERM, SIGHUP: the server is
stopped first) picks up where it stopped.
"""

import sys
from pathlib import Path

from bwprune.config import compose_config
from bwprune.vllm.serving.load import load_test
from bwprune.vllm.serving.server import run_until_signal

ROOT = Path(__file__).resolve().parent.parent


def main(overrides: list[str]) -> None:
    base = compose_config(ROOT / "conf", overrides, name="serve")
    for entry in base.serve.methods:
        name, _, extra = str(entry).partition(":")
        chosen = [*overrides, f"method={name}", *filter(None, extra.split(","))]
        cfg = compose_config(ROOT / "conf", chosen, name="serve")
        for rate in cfg.serve.rates:
            m = load_test(cfg, float(rate))["metrics"]
            print(f"{entry} at {float(rate):g} req/s: {m['request_throughput']:.3f} req/s, "
                  f"{m['output_throughput']:.1f} tok/s, e2e p50 {m['e2e_ms']['p50']:.0f} ms / "
                  f"p99 {m['e2e_ms']['p99']:.0f} ms, tpot p50 {m['tpot_ms'].get('p50', 0):.1f} "
                  f"ms, accuracy {m['accuracy']:.3f}, (c) {m['realized_sparsity']['params']:.3f}",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    run_until_signal(
        main, sys.argv[1:], "the complete records are kept; the same command runs the rest"
    )
