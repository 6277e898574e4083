"""One ``sandpod up`` per state dir: an ``flock`` on ``<state dir>/up.lock`` for its whole life.

Two supervisors on one state dir would share NATS data, pid records and jails and tear each
other's sandboxes down; the second one must refuse before it starts anything. The lock belongs
to the open file (``O_CLOEXEC``: no child inherits it), so it is released when the supervisor
exits however it exits, and a stale file from a crash never blocks. The holder's pid is written
into the file so the refusal can name it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

__all__ = ["LOCK_FILE", "StateDirBusy", "hold_state_dir"]

LOCK_FILE = "up.lock"


class StateDirBusy(RuntimeError):
    """Another process holds the state dir's lock; the message says what to do."""


def hold_state_dir(state_dir: Path) -> int:
    """Lock ``state_dir`` for this process; return the lock's file descriptor (keep it open).

    Raises:
        StateDirBusy: another ``sandpod up`` runs on this state dir.
        OSError: the state dir cannot be created or the lock file opened.
    """
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = state_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = ""
        with contextlib.suppress(OSError, ValueError):
            holder = f" (pid {int(os.pread(fd, 32, 0).split()[0])})"
        os.close(fd)
        raise StateDirBusy(
            f"another `sandpod up`{holder} is already running on the state dir {state_dir}; "
            "stop it first, or pass --state-dir (and --port, --gateway-port) for a second "
            "installation"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
