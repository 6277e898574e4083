"""Which installations on this host are running: one lock file each in ``<dir>/net-alive``.

A running installation holds a shared ``flock`` on ``net-alive/<id>.lock`` (:func:`hold`;
replicas of one installation share it); the kernel drops it when the process dies. Another
installation judges one whose lock nobody holds with :func:`claim_dead`: it takes that lock
*exclusively* for as long as it removes what the dead one left, so the dead one cannot start
again meanwhile (its :func:`hold` waits), and unlinks the lock file (:func:`forget`) when it
removed everything. :func:`hold` checks after locking that the path still names the file it
locked, and starts over when it was unlinked meanwhile, so a lock is never held on a file
nobody else can open.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["claim_dead", "forget", "hold", "lock_ids"]

SUFFIX = ".lock"


def _path(directory: Path, ident: str) -> Path:
    return directory / f"{ident}{SUFFIX}"


def hold(directory: Path, ident: str) -> int:
    """Take ``ident``'s liveness lock (shared, blocking) and return its descriptor; the caller
    closes it when the installation stops."""
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    path = _path(directory, ident)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # a reaper unlinked it while we waited: lock the new file


@contextlib.contextmanager
def claim_dead(directory: Path, ident: str) -> Iterator[bool]:
    """Yield True while holding ``ident``'s lock exclusively (nobody runs it and nobody can start
    it until the block ends), False when it is running or has no lock file (an installation
    of an older version: never ours to judge)."""
    path = _path(directory, ident)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def forget(directory: Path, ident: str) -> None:
    """Unlink ``ident``'s lock file; only inside :func:`claim_dead`'s block that yielded True
    (a :func:`hold` waiting on the old file then starts over on a new one)."""
    with contextlib.suppress(FileNotFoundError):
        _path(directory, ident).unlink()


def lock_ids(directory: Path) -> list[str]:
    """The ids with a lock file (running or not)."""
    if not directory.is_dir():
        return []
    return sorted(p.name[: -len(SUFFIX)] for p in directory.glob(f"*{SUFFIX}"))
