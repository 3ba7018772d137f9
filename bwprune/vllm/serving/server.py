"""vLLM's API server as a child of this process (`bwprune.vllm.serving.serve.running_server`): where
it listens and with which key (`ServeSettings`), started tied to this process and counted ready
only when it answers as itself (`launched`), stopped on every way out, signals included
(`stopped_by_signals`).

Why: a job scheduler stops a job with SIGTERM (SLURM, systemd, `docker stop`, `timeout`), which
Python's default answers by ending at once, and vLLM's server was left running on the port; the
next launch then took that server's /health for its own, and every request went to it. Now a
taken port refuses the launch, readiness asks for a served-model name drawn for this launch alone,
and the server dies with its launcher however the launcher ends (`bwprune.vllm.serving.tether`).
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import ipaddress
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig

from bwprune.errors import UserError

log = logging.getLogger(__name__)
LOOPBACK = ("127.0.0.1", "localhost", "::1")  # as named in errors: any 127.x address is one too
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


@dataclass(frozen=True)
class ServeSettings:
    """conf/serve.yaml `serve` (how the server runs, never what it computes)."""

    host: str
    port: int
    startup_s: float  # how long the server may take to answer as itself
    drain_s: int  # stopped, how long requests in flight may finish before they are aborted
    stop_s: float  # how long the whole server may take to stop before it is killed
    kv_cache_gib: float
    api_key: str | None = field(default=None, repr=False)  # never in a log line

    @classmethod
    def from_config(cls, cfg: DictConfig) -> ServeSettings:
        """A host other machines can reach only with an API key (`serve.api_key`, else vLLM's
        VLLM_API_KEY): vLLM then answers no /v1 request without it."""
        s = cfg.serve
        key = s.api_key or os.environ.get("VLLM_API_KEY") or None
        if key is None and not is_loopback(str(s.host)):
            raise UserError(f"serve.host={s.host!r} is reachable from other machines: set "
                            f"serve.api_key (or vLLM's VLLM_API_KEY environment variable) so "
                            f"only clients with the key are answered, or listen on a loopback "
                            f"address, one of {list(LOOPBACK)}")  # fmt: skip
        if not 0 <= int(s.drain_s) < float(s.stop_s):
            raise UserError(f"serve.drain_s={s.drain_s} must be >= 0 and below serve.stop_s="
                            f"{s.stop_s} (the server is killed after stop_s)")  # fmt: skip
        return cls(str(s.host), int(s.port), float(s.startup_s), int(s.drain_s), float(s.stop_s),
                   float(s.kv_cache_gib), None if key is None else str(key))  # fmt: skip

    @property
    def url(self) -> str:
        return f"http://{f'[{self.host}]' if ':' in self.host else self.host}:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        """What a request to the server carries besides its body: the API key, if there is one."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def refuse_taken(settings: ServeSettings) -> None:
    """One line when another process listens on the server's port, before anything starts:
    vLLM itself fails to bind it only after loading the model."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as vLLM binds: TIME_WAIT is free
        try:
            s.bind((settings.host, settings.port))
        except OSError as e:
            where = f"{settings.host}:{settings.port}"
            if e.errno != errno.EADDRINUSE:
                raise UserError(f"serve.host={settings.host!r}: cannot listen on {where} "
                                f"({e.strerror})") from e  # fmt: skip
            raise UserError(f"serve.port={settings.port}: another process listens on {where}; "
                            f"free it (`lsof -i :{settings.port}` names it, `fuser -k "
                            f"{settings.port}/tcp` ends it) or choose another "
                            f"serve.port") from e  # fmt: skip


@contextmanager
def launched(command: list[str], settings: ServeSettings, name: str, log_path: Path,
             env: dict[str, str]) -> Iterator[subprocess.Popen]:  # fmt: skip
    """`command`, a server that lists the model `name` at /v1/models, running and answering as
    itself for as long as the block runs (`wait_ready`); its output goes to `log_path`, `env` and
    the API key into its environment (not its command line, which `ps` shows to every user).

    It runs tied to this process (`bwprune.vllm.serving.tether`) in a process group of its own: a
    signal meant for this process (a terminal's Ctrl-C or hang-up reaches its whole foreground
    group) reaches the server only as `stop`'s one SIGTERM, and `stop` can end the whole group."""
    refuse_taken(settings)
    env = {**os.environ, **env, **({"VLLM_API_KEY": settings.api_key} if settings.api_key else {})}
    tethered = [sys.executable, "-m", "bwprune.vllm.serving.tether", str(os.getpid()), *command]
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(tethered, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip
    try:
        wait_ready(settings, proc, name, log_path)
        yield proc
    finally:
        stop(proc, settings.stop_s)


def wait_ready(settings: ServeSettings, proc: subprocess.Popen, name: str, log_path: Path) -> None:
    """Until the server answers as itself: `name`, drawn for this launch, among its /v1/models.
    Any other server on the port (one left running, any process) may answer /health, never that."""
    deadline = time.monotonic() + settings.startup_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise UserError(f"the vLLM server exited ({proc.returncode}) before it was ready; "
                            f"the end of {log_path}:\n{tail}")  # fmt: skip
        if answers_as(settings, name):
            return
        time.sleep(0.25)
    raise UserError(f"the vLLM server did not answer as itself at {settings.url}/v1/models within "
                    f"serve.startup_s={settings.startup_s:g} s (its log: {log_path})")  # fmt: skip


def answers_as(settings: ServeSettings, name: str) -> bool:
    """Whether the server at `settings.url` lists the model `name`."""
    request = urllib.request.Request(f"{settings.url}/v1/models", headers=settings.headers)
    try:
        with urllib.request.urlopen(request, timeout=2) as r:
            models = json.loads(r.read())["data"]
        return any(m["id"] == name for m in models)
    except (OSError, http.client.HTTPException, ValueError, LookupError, TypeError):
        return False  # nothing listening yet, an error status, not HTTP, not vLLM's answer


def stop(proc: subprocess.Popen, stop_s: float) -> None:
    """SIGTERM, on which vLLM's API server stops cleanly: requests in flight may finish for
    `serve.drain_s` (`bwprune.vllm.serving.serve.server_command`), then its engine and worker shut
    down and the requests still seated leave, their ledger lines written. The worker, a grandchild,
    may finish after the API server has exited, so the whole process group is waited for;
    whatever of it still runs after `stop_s` is killed, so that nothing of the server outlives
    this."""
    deadline = time.monotonic() + stop_s
    proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=stop_s)
    while group_runs(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if group_runs(proc.pid):
        log.warning("the vLLM server did not stop within serve.stop_s=%g s: killed", stop_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def group_runs(group: int) -> bool:
    """Whether a process of process group `group` still runs (a zombie runs no more: when the
    API server has exited, its children's new parent reaps them)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):  # a process that ended while this looked
            state, _, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
            if int(pgrp) == group and state != "Z":
                return True
    return False


@contextmanager
def stopped_by_signals() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt in the block, the first of them only:
    Ctrl-C, a job scheduler's stop (SLURM, systemd, `docker stop`, `timeout` send SIGTERM) and a
    closed terminal all leave through `launched`'s way out, which stops the server and waits for
    it. Python's default ends the process at once on SIGTERM and SIGHUP, skipping that; later
    signals are ignored so nothing cuts the wait short (`serve.stop_s` bounds it)."""
    previous = {s: signal.getsignal(s) for s in SIGNALS}

    def interrupt(signum: int, frame) -> None:
        for s in SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for s in SIGNALS:
        signal.signal(s, interrupt)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def run_until_signal(main: Callable[[list[str]], None], args: list[str],
                     stopped: str | None) -> None:  # fmt: skip
    """A serving script's entry: `main(args)` inside `stopped_by_signals`; a `UserError` exits
    with its one line, a stop with `stopped` (what was kept), or quietly when None."""
    try:
        with stopped_by_signals():
            main(args)
    except UserError as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt as e:
        if stopped is not None:
            sys.exit(f"stopped ({e}): {stopped}")
