"""The server lives and dies with its launcher (bwprune/vllm/serving/server.py,
bwprune/vllm/serving/tether.py): SIGINT, SIGTERM and SIGHUP to the launcher's process group (what
Ctrl-C, a job scheduler and a closed terminal send) stop the server with one SIGTERM and wait for
it, kill -9 of the launcher stops it too, and nothing is left on the port; a taken port refuses
scripts/serve.py in one line.

The server is a stand-in (tests/system/standin_server.py) launched as scripts/serve.py launches
vLLM's (`stopped_by_signals` around `launched`): vLLM takes half a minute to start. vLLM's own
stop on that SIGTERM, its seated request's ledger line written, is tested in
tests/system/test_serving.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.system.standin_server import impostor

ROOT = Path(__file__).resolve().parents[2]
NAME = "bwprune-0123abcd"  # the launch's own served name
LAUNCHER = f"""
import sys
from pathlib import Path
from bwprune.vllm.serving.server import ServeSettings, launched, stopped_by_signals
port, stopped, log = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
settings = ServeSettings("127.0.0.1", port, startup_s=60, drain_s=1, stop_s=20,
                         kv_cache_gib=1)
server = [sys.executable, "-m", "tests.system.standin_server", "127.0.0.1", str(port), stopped,
          "bwprune", "{NAME}"]
try:
    with stopped_by_signals(), launched(server, settings, "{NAME}", log, {{}}) as proc:
        print(proc.pid, flush=True)
        proc.wait()
except KeyboardInterrupt:
    pass
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def ended(pid: int) -> bool:
    """Gone, or a zombie its new parent has not reaped yet (it runs no more)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGHUP", "SIGKILL"])
def test_the_server_stops_with_its_launcher(tmp_path, sig):
    port, stopped = free_port(), tmp_path / "stopped"
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(port), str(stopped), str(tmp_path / "server.log")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )  # fmt: skip
    line = launcher.stdout.readline()  # the server's pid, once it answered as itself
    assert line, launcher.communicate(timeout=30)[1]
    server = int(line)
    try:
        os.killpg(launcher.pid, getattr(signal, sig))
        _, err = launcher.communicate(timeout=30)
        assert launcher.returncode == (-signal.SIGKILL if sig == "SIGKILL" else 0), err
        deadline = time.monotonic() + 10
        while not ended(server) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ended(server)
        # one clean stop, waited for (kill -9: the tether's SIGTERM), and the port free
        assert stopped.read_text() == "SIGTERM\n"
        assert port_is_free(port)
    finally:  # a failure leaves no orphan behind
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signal.SIGKILL)


def test_a_taken_port_refuses_the_launch_in_one_line(tmp_path):
    """Before torch loads and the method is prepared: the answer comes in a second or two."""
    with impostor(["bwprune"]) as port:
        out = subprocess.run(
            [sys.executable, "scripts/serve.py", "model=tiny_llama", f"serve.port={port}",
             f"paths.cache_dir={tmp_path}"],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert out.returncode == 1
    assert out.stderr == (
        f"error: serve.port={port}: another process listens on 127.0.0.1:{port}; free it "
        f"(`lsof -i :{port}` names it, `fuser -k {port}/tcp` ends it) or choose another "
        f"serve.port\n"
    )
    assert not (tmp_path / "vllm").exists()  # nothing was prepared
