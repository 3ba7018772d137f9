"""`make serve METHOD=ours [ARGS=overrides]`: vLLM's OpenAI-compatible server with the method
inside (conf/serve.yaml; bwprune/vllm/serving/serve.py), until Ctrl-C, SIGTERM or SIGHUP.

    python scripts/serve.py method=ours sparsity=0.5 batch_size=16
    curl http://127.0.0.1:8765/v1/completions -H 'Content-Type: application/json' \
        -d '{"model": "bwprune", "prompt": "2+2=", "max_tokens": 8, "temperature": 0}'

Each request's realized sparsity is appended to <folder>/ledger.jsonl as it finishes. The server
stops with this process, however it ends (kill -9 too: bwprune/vllm/serving/tether.py). Another
machine may reach it only with a key: serve.host=0.0.0.0 and VLLM_API_KEY (or serve.api_key) set,
and requests send `Authorization: Bearer <key>`.
"""

import sys
from pathlib import Path

from bwprune.config import compose_config
from bwprune.errors import UserError
from bwprune.vllm.serving.server import ServeSettings, refuse_taken, run_until_signal

ROOT = Path(__file__).resolve().parent.parent


def main(overrides: list[str]) -> None:
    cfg = compose_config(ROOT / "conf", overrides, name="serve")
    refuse_taken(ServeSettings.from_config(cfg))  # in a second, before torch and the preparation
    from bwprune.vllm.serving.serve import SERVED_NAME, export_served, running_server, served_folder

    folder = served_folder(cfg)
    prepared = export_served(cfg, folder)
    ledger, log = folder / "ledger.jsonl", folder / "server.log"
    with running_server(cfg, folder, ledger, prepared.method, log) as (server, proc):
        key = "; requests need its API key" if server.api_key else ""
        print(f"serving {cfg.model.name} with {cfg.method.name} at {server.url}/v1 (model name "
              f"'{SERVED_NAME}'{key}); log: {log}; Ctrl-C stops it", flush=True)  # fmt: skip
        code = proc.wait()
    raise UserError(f"the vLLM server exited ({code}) while serving; the end of {log}:\n"
                    f"{log.read_text(errors='replace')[-3000:]}")  # fmt: skip


if __name__ == "__main__":
    run_until_signal(main, sys.argv[1:], None)
