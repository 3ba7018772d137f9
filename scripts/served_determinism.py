"""Served determinism (docs/serving.md): for each of serve.determinism.methods, a fresh server, the
same greedy requests alone and under traffic, and how often each answer equals the first one alone
(conf/serve.yaml; bwprune/vllm/serving/determinism.py); records under results/serve/determinism/.

    python scripts/served_determinism.py generation.max_new_tokens=32
    python scripts/served_determinism.py "serve.determinism.methods=['ours:method.t_init=2']" \
        serve.determinism.dir=results/serve/determinism_t2     # a variant: a dir of its own
"""

import sys
from pathlib import Path

from bwprune.config import compose_config
from bwprune.errors import UserError
from bwprune.vllm.serving.server import run_until_signal

ROOT = Path(__file__).resolve().parent.parent


def main(overrides: list[str]) -> None:
    from bwprune.vllm.serving.determinism import served_determinism

    base = compose_config(ROOT / "conf", overrides, name="serve")
    names = [str(entry).partition(":")[0] for entry in base.serve.determinism.methods]
    if len(set(names)) < len(names):  # a record is named by its method alone
        raise UserError(f"serve.determinism.methods={list(base.serve.determinism.methods)} "
                        f"names a method twice; its records (<dir>/<model>/<method>.json) would "
                        f"overwrite each other: run a variant with a serve.determinism.dir of its "
                        f"own")  # fmt: skip
    print("| method | same answer alone | same answer under traffic |\n|---|---|---|", flush=True)
    for entry in base.serve.determinism.methods:
        name, _, extra = str(entry).partition(":")
        chosen = [*overrides, f"method={name}", *filter(None, extra.split(","))]
        record = served_determinism(compose_config(ROOT / "conf", chosen, name="serve"))
        print(f"| {entry} | {record['alone_same']:.2f} | {record['traffic_same']:.2f} |",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    run_until_signal(main, sys.argv[1:], "the server is stopped; the methods done are recorded")
