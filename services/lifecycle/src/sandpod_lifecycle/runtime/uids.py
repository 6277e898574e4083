"""Sandbox uids that are never handed to a new sandbox while anything of the old one remains.

A uid outlives its sandbox wherever the kernel keys state by uid rather than by namespace: the
user and user-session keyrings (the jails share the host's user namespace), and any process that
escaped the sandbox's cgroup. So :func:`next_uid` does not take the lowest free uid: it walks the
installation's range round-robin from a cursor persisted in the state dir (a deleted sandbox's
uid comes back only after the whole range was used), and skips every uid that a jail record
holds, that any process on the host runs as (real, effective, saved or filesystem uid), or that
still owns keys (``/proc/key-users``). SysV IPC and POSIX message queues die with the sandbox's
IPC namespace; files live in its own directories, removed by ``destroy``.

The caller holds the state dir's allocation lock (``LocalRuntime._allocate``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["busy_uids", "next_uid"]

CURSOR_FILE = "uid-cursor"


def busy_uids(proc: Path = Path("/proc")) -> set[int]:
    """Every uid a live process on the host runs as, or that owns keys in a keyring."""
    uids: set[int] = set()
    with contextlib.suppress(OSError):
        for entry in os.scandir(proc):
            if entry.name.isdigit():
                uids.update(_process_uids(entry.path))
    with contextlib.suppress(OSError):
        for line in (proc / "key-users").read_text().splitlines():
            head = line.split(":", 1)[0].strip()
            if head.isdigit():
                uids.add(int(head))
    return uids


def _process_uids(pid_dir: str) -> set[int]:
    """The real, effective, saved and filesystem uids of a process (its ``Uid:`` line, found in
    the first KiB of ``status``: the 9th line; the whole file only if it is not there). Bytes,
    no decoding: this runs for every process on the host at every create."""
    try:
        with open(f"{pid_dir}/status", "rb") as f:
            head = f.read(1024)
            start = head.find(b"\nUid:")
            end = head.find(b"\n", start + 1) if start >= 0 else -1
            if end < 0:
                head = head + f.read()
                start = head.find(b"\nUid:")
                end = head.find(b"\n", start + 1) if start >= 0 else len(head)
    except OSError:
        return set()  # gone meanwhile
    if start < 0:
        return set()
    return {int(u) for u in head[start + 5 : end].split()}


def next_uid(
    state_dir: Path, base: int, count: int, held: Iterable[int], busy: set[int] | None = None
) -> int | None:
    """The next uid of ``[base, base + count)`` after the persisted cursor that nothing uses;
    advances the cursor. None: every uid of the range is in use.

    ``busy``: :func:`busy_uids`, if the caller took it already (None: taken here). It may be
    taken before the allocation lock: a uid no process runs as cannot gain one meanwhile but
    through an allocation (a jail record, in ``held``) -- a sandbox's processes cannot change
    uid, and a new process of an old uid is forked by one that already ran as it."""
    cursor_file = state_dir / CURSOR_FILE
    try:
        last = int(cursor_file.read_text())
    except (OSError, ValueError):
        last = base - 1
    taken = set(held) | (busy_uids() if busy is None else busy)
    start = (last + 1 - base) % count
    for step in range(count):
        uid = base + (start + step) % count
        if uid not in taken:
            tmp = cursor_file.with_suffix(".tmp")
            tmp.write_text(str(uid))
            tmp.replace(cursor_file)
            return uid
    return None
