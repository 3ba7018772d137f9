"""`make serve METHOD=ours [ARGS=overrides]`: vLLM's OpenAI-compatible server on the loopback
address with the method inside (conf/serve.yaml; bwprune/vllm/serve.py), until Ctrl-C.

    python scripts/serve.py method=ours sparsity=0.5 batch_size=16
    curl http://127.0.0.1:8765/v1/completions -H 'Content-Type: application/json' \
        -d '{"model": "bwprune", "prompt": "2+2=", "max_tokens": 8, "temperature": 0}'

Each request's realized sparsity is appended to <folder>/ledger.jsonl as it finishes.
"""

import sys
import time
from pathlib import Path

from bwprune.config import compose_config
from bwprune.errors import UserError
from bwprune.vllm.serve import export_served, running_server, served_folder

ROOT = Path(__file__).resolve().parent.parent


def main(overrides: list[str]) -> None:
    cfg = compose_config(ROOT / "conf", overrides, name="serve")
    folder = served_folder(cfg)
    prepared = export_served(cfg, folder)
    with running_server(cfg, folder, folder / "ledger.jsonl", prepared.method,
                        folder / "server.log") as server:  # fmt: skip
        print(f"serving {cfg.model.name} with {cfg.method.name} at {server.url}/v1 (model name "
              f"'bwprune'); log: {folder / 'server.log'}; Ctrl-C stops it", flush=True)  # fmt: skip
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except UserError as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        pass
