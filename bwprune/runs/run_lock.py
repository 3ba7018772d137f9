"""One process at a time per run folder: an advisory `flock` on `<run folder>/.lock`.

Why `flock` and not a pid file alone: the kernel releases the lock when its holder dies, even by
`kill -9`, so a lock left by a dead process is taken over at once, with no guess about staleness
(on NFS, Linux maps it to a lock the server holds). The file names its holder (pid, host, start
time) for the message of whoever waits. A second process of the same config waits rather than
fails, so a parallel sweep with two jobs of one run key (e.g. `dense` at two `sparsity` values)
ends with one intact record and both jobs done. This module knows nothing of what a run writes.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import datetime, timezone
from pathlib import Path

from bwprune.errors import UserError

log = logging.getLogger(__name__)

LOCK_NAME = ".lock"


@contextmanager
def hold(folder: Path) -> Iterator[None]:
    """Own `folder` (created if missing) for the block; waits while another process owns it.

    On exit the lock file is removed, and so is `folder` if nothing else is in it (a run that
    failed before writing anything leaves no trace).
    """
    fd = _acquire(folder)
    try:
        yield
    finally:
        # Unlinked while still locked: a waiter then finds its file gone and locks the new one.
        (folder / LOCK_NAME).unlink(missing_ok=True)
        os.close(fd)
        with suppress(OSError):  # not empty, or another process's folder by now: keep it
            folder.rmdir()


def holder(folder: Path) -> str:
    """Who holds (or last held) `folder`'s lock, in words, from what its holder wrote."""
    try:
        info = json.loads((folder / LOCK_NAME).read_text())
        return f"pid {info['pid']} on {info['host']} (since {info['since']})"
    except (OSError, ValueError, KeyError):  # gone, or not yet written by a holder just started
        return "another process"


def _acquire(folder: Path) -> int:
    """An open descriptor of `folder`/.lock, exclusively locked by this process."""
    path = folder / LOCK_NAME
    waiting = False
    while True:
        try:
            folder.mkdir(parents=True, exist_ok=True)  # a holder that failed may remove it
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # removed between mkdir and open: try again
            continue
        except OSError as e:
            raise UserError(f"cannot create the run folder {str(folder)!r}: {e.strerror}") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not waiting:
                    log.warning("%s is being run by %s; waiting for it to finish", folder,
                                holder(folder))  # fmt: skip
                    waiting = True
                fcntl.flock(fd, fcntl.LOCK_EX)
            if _is_current(fd, path):
                since = datetime.now(timezone.utc).isoformat(timespec="seconds")
                info = {"pid": os.getpid(), "host": socket.gethostname(), "since": since}
                os.ftruncate(fd, 0)
                os.write(fd, json.dumps(info).encode())
                return fd
        except OSError as e:
            os.close(fd)
            raise UserError(f"cannot lock {str(path)!r}: {e.strerror}") from None
        except BaseException:  # Ctrl-C while waiting
            os.close(fd)
            raise
        os.close(fd)  # the holder removed this file as it let go: lock the one there now


def _is_current(fd: int, path: Path) -> bool:
    """Whether `fd` is still the file at `path` (not one its holder unlinked)."""
    try:
        mine, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)
