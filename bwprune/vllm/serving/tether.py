"""The served vLLM's first step: its life tied to the process that started it.

    python -m bwprune.vllm.serving.tether <launcher pid> <command...>

asks Linux to send this process SIGTERM when its parent dies, by any means (`kill -9` included),
then execs `command` (vLLM's API server, `bwprune.vllm.serving.server.launched`) in its place.
vLLM's API server stops on SIGTERM as on Ctrl-C: its engine and worker shut down and the requests
still seated leave, their ledger lines written. So a launcher that is killed leaves no server
behind.

Why PR_SET_PDEATHSIG, and why here: the kernel delivers it whatever ends the parent, at once, and
it survives exec (it is cleared only for set-user-ID binaries, which Python is not). A watchdog
thread polling `getppid()` in the server would need code inside vLLM's process and notices a poll
period late; `Popen(preexec_fn=...)` would run it between fork and exec in a launcher that holds
torch's threads, which CPython documents as unsafe (a lock held by another thread at the fork
deadlocks the child). The launcher may die before the prctl call takes effect; then this
process's parent is no longer `launcher pid` and the server is not started at all.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def tie_to(launcher: int) -> None:
    """SIGTERM to this process when its parent dies; exits if `launcher` has died already."""
    if not sys.platform.startswith("linux"):
        sys.exit(f"serving ties the server's life to its launcher with Linux's prctl "
                 f"(PR_SET_PDEATHSIG); this platform ({sys.platform}) has none")  # fmt: skip
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != launcher:
        sys.exit(f"the launcher (pid {launcher}) ended before its server started")


if __name__ == "__main__":
    tie_to(int(sys.argv[1]))
    os.execvp(sys.argv[2], sys.argv[2:])
