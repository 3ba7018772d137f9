"""Stand-ins for vLLM's API server in the serving tests: they start in a fraction of a second
where vLLM takes half a minute.

`main` (tests/system/test_server_lifecycle.py) lists the model names it is given at /v1/models
and, on SIGTERM, appends one line to a file after a moment (as vLLM's worker writes the ledger
lines of the requests still seated), then exits:

    python -m tests.system.standin_server <host> <port> <stopped file> <model name>...

`impostor` is another server on the port, as an earlier bwprune server left running would be.
"""

import http.server
import json
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


def models_handler(names: list[str]) -> type[http.server.BaseHTTPRequestHandler]:
    """Answers every GET (/health, /v1/models) with the model list of `names`."""
    body = json.dumps({"object": "list", "data": [{"id": n} for n in names]}).encode()

    class Models(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    return Models


@contextmanager
def impostor(names: list[str]) -> Iterator[int]:
    """A server on a free loopback port listing `names`, for as long as the block runs; its port."""
    server = http.server.HTTPServer(("127.0.0.1", 0), models_handler(names))
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def main(host: str, port: int, stopped: str, names: list[str]) -> None:
    server = http.server.HTTPServer((host, port), models_handler(names))

    def stop(signum: int, frame) -> None:
        time.sleep(0.5)  # a stop that takes a while: the launcher must wait for it
        with open(stopped, "a", encoding="utf-8") as f:
            f.write(f"{signal.Signals(signum).name}\n")
        server.server_close()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:])
