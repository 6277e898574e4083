"""What a jailed sandbox uses, read from its cgroups (the ``local`` runtime; no NATS, no contract).

The lifecycle's local runtime puts every process of a sandbox in cgroups and names them in the
jail file (``"cgroups"``: a ``core`` directory for freezing and tracking, whose ``c-<token>``
children hold execd's commands, and one directory per limit role, ``memory``, ``cpu`` and
``pids``, each on cgroup v1 or v2; see ``sandpod_lifecycle.runtime.cgroups``). A process cannot
leave them, whatever it does to its environment or process group, so this is the sandbox's
real footprint:

- processes: the members listed in ``cgroup.procs`` of those directories and their children,
  except the holder's own (the sandbox's pid 1, its idle ``sleep`` and the ``unshare`` above
  it: infrastructure, not work). They are told apart by session: the holder's chain shares
  one, and every command execd starts is the leader of a new one, which none of its
  descendants can leave for the holder's;
- CPU: what the kernel charged to the cgroup since it was made, processes that exited included
  (v2 ``cpu.stat`` ``usage_usec``; v1 ``cpuacct.usage`` where cpuacct is mounted with cpu);
  hosts that account no CPU per cgroup get the live members' user + system time instead;
- memory: bytes charged to the memory cgroup (v1 ``memory.usage_in_bytes``, v2
  ``memory.current``; page cache included, as the limit counts it) and that limit (v1
  ``memory.limit_in_bytes``, v2 ``memory.max``); without a memory cgroup, the members' RSS.

Every read is a small cgroupfs file; the number of directories is bounded by the commands
running (finished commands' cgroups are swept by the jail), the members by the pids limit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator, Mapping

from sandpod_execd.sysmetrics import stat_fields
from sandpod_service.jailfile import JailCgroups

__all__ = ["CgroupDirs", "CgroupUsage", "members", "read_usage"]

NO_LIMIT_V1 = 1 << 62  # v1 reports "no limit" as a page-rounded LONG_MAX; anything this big is none


@dataclasses.dataclass(frozen=True, slots=True)
class CgroupDirs:
    """The cgroup directories of one sandbox, as the jail file's ``cgroups`` names them."""

    core: str | None  # freezing and tracking; commands live in its c-<token> children
    core_version: int
    limits: Mapping[str, tuple[int, str]]  # role -> (cgroup version, directory)

    @classmethod
    def from_jail(cls, cgroups: JailCgroups) -> CgroupDirs | None:
        """The jail file's ``cgroups``; None if they name no directory."""
        if cgroups.core is None and not cgroups.limits:
            return None
        return cls(cgroups.core, cgroups.core_version, dict(cgroups.limits))

    def dirs(self) -> list[str]:
        """Every distinct directory, core first."""
        out = [] if self.core is None else [self.core]
        return out + [d for _, d in self.limits.values() if d not in out]


@dataclasses.dataclass(frozen=True, slots=True)
class CgroupUsage:
    processes: int
    cpu_seconds: float
    memory: int  # bytes
    memory_limit: int | None  # bytes; None: the sandbox has no memory limit of its own


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _tree(root: str) -> Iterator[str]:
    """``root`` and its sub-cgroups (nothing if it is gone)."""
    stack = [root]
    while stack:
        d = stack.pop()
        with contextlib.suppress(OSError), os.scandir(d) as it:
            yield d
            stack.extend(e.path for e in it if e.is_dir(follow_symlinks=False))


def members(dirs: CgroupDirs) -> set[int]:
    """Pids listed in any of the sandbox's cgroups or their children."""
    pids: set[int] = set()
    for d in dirs.dirs():
        for sub in _tree(d):
            pids.update(int(p) for p in (_read(os.path.join(sub, "cgroup.procs")) or "").split())
    return pids


def _cpu_seconds(dirs: CgroupDirs) -> float | None:
    """CPU time charged to the sandbox, or None where the host does not account it."""
    v2 = [d for v, d in ((dirs.core_version, dirs.core), *dirs.limits.values()) if v == 2 and d]
    for d in v2:  # every v2 cgroup has cpu.stat, controllers enabled or not
        for line in (_read(os.path.join(d, "cpu.stat")) or "").splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
    cpu = dirs.limits.get("cpu")
    if cpu is not None and cpu[0] == 1:
        raw = _read(os.path.join(cpu[1], "cpuacct.usage"))  # cpu,cpuacct mounted together
        if raw is not None and raw.strip():
            return int(raw) / 1e9
    return None


def _memory(dirs: CgroupDirs) -> tuple[int, int | None] | None:
    """(bytes charged, limit or None) of the memory cgroup, None without one."""
    role = dirs.limits.get("memory")
    if role is None:
        return None
    version, d = role
    usage = _read(os.path.join(d, "memory.usage_in_bytes" if version == 1 else "memory.current"))
    if usage is None or not usage.strip():
        return None
    raw = _read(os.path.join(d, "memory.limit_in_bytes" if version == 1 else "memory.max")) or ""
    raw = raw.strip()
    limit = int(raw) if raw.isdigit() else None  # v2 "max": none
    if limit is not None and version == 1 and limit >= NO_LIMIT_V1:
        limit = None
    return int(usage), limit


def read_usage(dirs: CgroupDirs, holder: int) -> CgroupUsage:
    """The sandbox's processes (the holder's session excluded), CPU time and memory, from its
    cgroups."""
    own = stat_fields(str(holder))
    infra = own[2] if own is not None else None
    count, cpu, rss = 0, 0.0, 0
    for pid in members(dirs) - {holder}:
        fields = stat_fields(str(pid))
        if fields is not None and fields[2] != infra:  # gone or a zombie: not a live process
            count, cpu, rss = count + 1, cpu + fields[0], rss + fields[1]
    charged = _cpu_seconds(dirs)
    memory = _memory(dirs)
    return CgroupUsage(
        processes=count,
        cpu_seconds=cpu if charged is None else charged,
        memory=rss if memory is None else memory[0],
        memory_limit=None if memory is None else memory[1],
    )
