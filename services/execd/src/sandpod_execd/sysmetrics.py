"""What a sandbox uses right now, read from ``/proc`` and the filesystem (no NATS, no contract).

In the ``process`` runtime a sandbox has no cgroup of its own, so its processes are found by their
environment: execd gives every command ``SANDPOD_SANDBOX_ID`` and ``SANDPOD_WORKSPACE`` (see
:class:`~sandpod_execd.sandbox.SandboxContext`), and descendants inherit them, including ones that
left the process group with ``setsid``. CPU time and RSS are summed over those processes (RSS
counts shared pages once per process). A command that clears its environment escapes the count.
In a jail the variables hold the paths the command sees (``SANDPOD_WORKSPACE=/workspace``), so
callers pass what the sandbox's commands really carry; jails with cgroups are measured by
:mod:`sandpod_execd.cgstats` instead.

Disk usage is a bounded walk of the workspace (``MAX_ENTRIES`` entries, ``MAX_WALK_SECONDS``), on
the loop with a yield every ``YIELD_EVERY`` entries, so a huge workspace can neither stall other
requests nor make the reply wait long; ``complete`` says whether the walk saw everything (it also
descends at most :data:`~sandpod_execd.files.rooted.MAX_DEPTH` levels). The walk
goes descriptor by descriptor (:func:`~sandpod_execd.files.rooted.tree`: each child directory
opened with ``O_NOFOLLOW`` relative to its parent's descriptor), never by path string: a sandbox
process that swaps a directory for a link to ``/`` mid-walk ends that branch instead of making
execd sum the host's files.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import stat
import time

from sandpod_execd.files.rooted import tree

__all__ = [
    "DiskUsage",
    "ProcessUsage",
    "disk_usage",
    "filesystem",
    "host_memory",
    "sandbox_processes",
    "stat_fields",
]

MAX_ENTRIES = 200_000
MAX_WALK_SECONDS = 2.0
YIELD_EVERY = 1000  # entries (or /proc processes) between yields to the loop
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclasses.dataclass(frozen=True, slots=True)
class ProcessUsage:
    processes: int
    cpu_seconds: float
    rss: int  # bytes


@dataclasses.dataclass(frozen=True, slots=True)
class DiskUsage:
    used: int  # bytes allocated
    entries: int
    complete: bool


def stat_fields(pid: str) -> tuple[float, int, int] | None:
    """(user + system CPU seconds, RSS bytes, session id) of a live process, None if gone or
    a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # the command name may hold spaces and parentheses: the fields start after the last ')'
    fields = raw[raw.rfind(b")") + 2 :].split()
    if len(fields) < 22 or fields[0] == b"Z":
        return None
    cpu = (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime (clock ticks)
    return cpu, int(fields[21]) * _PAGE, int(fields[3])  # rss (pages), session


async def sandbox_processes(sandbox_id: str, workspace: str) -> ProcessUsage:
    """Count and sum the live processes whose environment names this sandbox and workspace."""
    markers = (
        f"\0SANDPOD_SANDBOX_ID={sandbox_id}\0".encode(),
        f"\0SANDPOD_WORKSPACE={workspace}\0".encode(),
    )
    me = str(os.getpid())
    count, cpu, rss = 0, 0.0, 0
    with os.scandir("/proc") as it:
        pids = [e.name for e in it if e.name.isdigit() and e.name != me]
    for i, pid in enumerate(pids):
        if i % YIELD_EVERY == YIELD_EVERY - 1:
            await asyncio.sleep(0)
        fields = _usage_if_marked(pid, markers)
        if fields is not None:
            count, cpu, rss = count + 1, cpu + fields[0], rss + fields[1]
    return ProcessUsage(count, cpu, rss)


def kill_marked(sandbox_id: str, workspace: str) -> int:
    """SIGKILL every live process whose environment names this sandbox and workspace (a
    released sandbox's background processes, sessions and terminals); how many were hit."""
    markers = (
        f"\0SANDPOD_SANDBOX_ID={sandbox_id}\0".encode(),
        f"\0SANDPOD_WORKSPACE={workspace}\0".encode(),
    )
    me, hit = str(os.getpid()), 0
    with os.scandir("/proc") as it:
        pids = [e.name for e in it if e.name.isdigit() and e.name != me]
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = b"\0" + f.read()
        except OSError:
            continue
        if all(m in env for m in markers):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(pid), signal.SIGKILL)
                hit += 1
    return hit


def _usage_if_marked(pid: str, markers: tuple[bytes, ...]) -> tuple[float, int, int] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = b"\0" + f.read()
    except OSError:  # gone, or another user's process
        return None
    return stat_fields(pid) if all(m in env for m in markers) else None


async def disk_usage(
    *roots: str, max_entries: int = MAX_ENTRIES, max_seconds: float = MAX_WALK_SECONDS
) -> DiskUsage:
    """Bytes allocated under ``roots`` (like ``du``: hard links once, symlinks not followed),
    all walked within one bound. A root that is itself a link is not followed either. The
    result is incomplete if a bound (entries, time, or the walk's depth) cut the walk."""
    deadline = time.monotonic() + max_seconds
    used, entries = 0, 0
    seen_links: set[tuple[int, int]] = set()
    complete = True

    def depth_cut() -> None:
        nonlocal complete
        complete = False  # a directory deeper than rooted.MAX_DEPTH went unread

    for root in roots:
        try:
            top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        walk = tree(top, on_cut=depth_cut)
        try:
            for _, _, st in walk:
                if entries >= max_entries or time.monotonic() > deadline:
                    return DiskUsage(used, entries, complete=False)
                entries += 1
                if entries % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
                if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                    if (st.st_dev, st.st_ino) in seen_links:
                        continue
                    seen_links.add((st.st_dev, st.st_ino))
                used += st.st_blocks * 512
        except OSError:
            complete = False  # a directory became unreadable mid-walk
        finally:
            walk.close()  # closes the descriptors of the directories it was in
            os.close(top)
    return DiskUsage(used, entries, complete)


def filesystem(path: str) -> tuple[int, int]:
    """(bytes free for unprivileged users, total bytes) of the filesystem holding ``path``."""
    try:
        vfs = os.statvfs(path)
    except OSError:
        return 0, 0
    return vfs.f_bavail * vfs.f_frsize, vfs.f_blocks * vfs.f_frsize


def host_memory() -> tuple[int, int]:
    """(total, available) bytes of the host's memory, from /proc/meminfo."""
    values: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    values[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return values.get("MemTotal", 0), values.get("MemAvailable", 0)
