"""One sandbox's cgroups on cgroup v1, v2 or both (hybrid hosts), and what they are used for.

Roles, each served by one hierarchy chosen once per driver (:meth:`CgroupPlan.choose`):

- ``memory``, ``cpu``, ``pids``: the limits, on whichever hierarchy has the controller
  (v1: ``memory.limit_in_bytes``, ``cpu.cfs_quota_us``, ``pids.max``; v2: ``memory.max``,
  ``cpu.max``, ``pids.max``). A controller the host lacks leaves its protection unavailable.
- ``core``: freezing (v1 ``freezer.state``; v2 ``cgroup.freeze``) and tracking. Every process
  of the sandbox is below ``<core>/<parent>/<id>``: the holder in it, each command execd starts
  in a child ``c-<token>`` of it, so a command's strays are found (and killed) by cgroup even
  after they left its process tree, and destroy finds everything.

Rootless (the driver is not root), only hierarchies whose ``<mount>/<parent>`` directory an
administrator delegated to this user (writable by it) are used; without a delegated ``core``
there is no freezing and no tracking (the driver then kills a sandbox through its pid
namespace's init, see ``local.py``), and ``protections`` says so.

Per sandbox the directories are ``<hierarchy>/<parent>/<sandbox id>``; their paths go into the
jail file, so a later driver (or execd) never has to recompute them. Writes here are tiny
cgroupfs writes done inline; only waiting (frozen, empty) yields to the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import os
import signal
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Literal

from sandpod_lifecycle.runtime.base import ACTIVE, DestroyFailed, HostCapabilities, Resources
from sandpod_service.jailfile import JailCgroups

__all__ = ["CgroupPlan", "SandboxCgroups"]

LIMITS = ("memory", "cpu", "pids")
CFS_PERIOD_US = 100_000
UNDELEGATED = (
    "unavailable: rootless, and no cgroup delegated to this user for %s "
    "(an administrator can create <cgroup mount>/<parent> and chown it to the user)"
)
POLL = 0.005  # seconds between looks at freezer / emptiness state (the kernel offers no wakeup
# we can wait on without inotify plumbing; these waits last milliseconds)
REFREEZE_EVERY = 20  # v1 freezer polls between a thaw-and-freeze again (see wait_frozen)


@dataclasses.dataclass(frozen=True, slots=True)
class Hierarchy:
    version: Literal[1, 2]
    mount: Path


@dataclasses.dataclass(frozen=True, slots=True)
class CgroupPlan:
    """Which hierarchy serves each role on this host, and the parent cgroup name."""

    parent: str
    core: Hierarchy | None  # None: rootless without a delegated freezer hierarchy
    limits: dict[str, Hierarchy]  # role -> hierarchy; absent: the host has no such controller

    @classmethod
    def choose(
        cls, caps: HostCapabilities, parent: str, core: Literal["auto", "v1", "v2"] = "auto"
    ) -> CgroupPlan:
        """Pick hierarchies. ``core="auto"``: the v1 freezer hierarchy if mounted (joining v1
        cgroups is cheap), else cgroup v2. Rootless, a hierarchy counts only if its
        ``<mount>/<parent>`` is delegated to us (see the module docstring). Raises ValueError if
        the requested core is missing (as root)."""
        if "/" in parent or parent in ("", ".", ".."):
            raise ValueError(f"cgroup parent must be a plain name, got {parent!r}")
        v1 = {c: m for c, m in caps.cgroup_v1.items() if caps.root or _delegated(m / parent)}
        v2 = (
            caps.cgroup_v2
            if caps.root or (caps.cgroup_v2 is not None and _delegated(caps.cgroup_v2 / parent))
            else None
        )
        v2_controllers = (
            caps.cgroup_v2_controllers
            if caps.root or v2 is None
            else frozenset(_read(v2 / parent / "cgroup.subtree_control").split())
        )
        v1_freezer = v1.get("freezer")
        chosen: Hierarchy | None
        if core == "v1" or (core == "auto" and v1_freezer is not None):
            if v1_freezer is None:
                raise ValueError("no v1 freezer hierarchy on this host")
            chosen = Hierarchy(1, v1_freezer)
        elif v2 is not None:
            chosen = Hierarchy(2, v2)
        elif caps.root:
            raise ValueError("no cgroup v2 hierarchy on this host")
        else:
            chosen = None
        limits: dict[str, Hierarchy] = {}
        for role in LIMITS:
            if role in v1:
                limits[role] = Hierarchy(1, v1[role])
            elif v2 is not None and role in v2_controllers:
                limits[role] = Hierarchy(2, v2)
        return cls(parent, chosen, limits)

    def for_sandbox(self, sandbox_id: str) -> SandboxCgroups:
        return SandboxCgroups(
            core=None if self.core is None else str(self.core.mount / self.parent / sandbox_id),
            core_version=0 if self.core is None else self.core.version,
            limits={
                role: (h.version, str(h.mount / self.parent / sandbox_id))
                for role, h in self.limits.items()
            },
        )

    def sandbox_ids(self) -> set[str]:
        """Names of every sandbox cgroup under our parent, in any hierarchy (for orphans)."""
        found: set[str] = set()
        used = {*self.limits.values(), *([self.core] if self.core is not None else [])}
        for h in used:
            with contextlib.suppress(OSError):
                found.update(e.name for e in os.scandir(h.mount / self.parent) if e.is_dir())
        return found


@dataclasses.dataclass(frozen=True, slots=True)
class SandboxCgroups:
    """The cgroup directories of one sandbox (serialisable into the jail file)."""

    core: str | None  # None: no freezing or tracking (rootless without delegation)
    core_version: int
    limits: dict[str, tuple[int, str]]  # role -> (version, directory)

    # -- identity ------------------------------------------------------------------------------

    @property
    def dirs(self) -> list[str]:
        """Every distinct directory, core first (the order processes join them in)."""
        out = [] if self.core is None else [self.core]
        out += [d for _, d in self.limits.values() if d not in out]
        return out

    @property
    def joined(self) -> list[str]:
        """Directories a command joins directly (it joins a child of ``core`` instead of it)."""
        return [d for d in self.dirs if d != self.core]

    @property
    def holder_joined(self) -> list[str]:
        """Directories the holder joins: :attr:`dirs`, except that a v1 memory cgroup (a
        hierarchy of its own) is swapped for its parent (``<memory>/<parent>``, no limit), so
        the holder is never a candidate of the sandbox's OOM killer. On cgroup v2 the memory
        cgroup's parent may hold no process (its controllers are enabled for the children), and
        a rootless parent whose ``tasks`` is not ours cannot be joined: the holder stays in."""
        memory = self.limits.get("memory")
        if memory is None or memory[0] != 1 or memory[1] == self.core:
            return self.dirs
        parent = Path(memory[1]).parent
        if not os.access(parent / "tasks", os.W_OK):
            return self.dirs
        return [str(parent) if d == memory[1] else d for d in self.dirs]

    @property
    def holder_outside_memory(self) -> bool:
        """Whether the holder is outside the sandbox's memory cgroup (see holder_joined)."""
        memory = self.limits.get("memory")
        return memory is not None and memory[1] not in self.holder_joined

    def to_jail(self) -> JailCgroups:
        """The jail file's ``cgroups`` (execd reads the same directories from it)."""
        return JailCgroups(core=self.core, core_version=self.core_version, limits=self.limits)

    @classmethod
    def from_jail(cls, cgroups: JailCgroups) -> SandboxCgroups:
        return cls(cgroups.core, cgroups.core_version, dict(cgroups.limits))

    # -- creation ------------------------------------------------------------------------------

    def create(self, resources: Resources) -> dict[str, str]:
        """Make the directories and write the limits; return the protections they give.

        Raises:
            OSError: a directory or limit could not be written (the caller cleans up).
        """
        for d in self.dirs:
            _enable_v2_controllers(d, self.limits)
            Path(d).mkdir(parents=True, exist_ok=False)
        protections = {"freezer": ACTIVE if self.core is not None else UNDELEGATED % "freezer"}
        for role in LIMITS:
            if role not in self.limits:
                protections[role] = (
                    UNDELEGATED % role
                    if self.core is None
                    else (f"unavailable: no {role} cgroup controller on this host")
                )
                continue
            version, d = self.limits[role]
            _write_limit(role, version, Path(d), resources)
            protections[role] = ACTIVE
        return protections

    # -- freezing ------------------------------------------------------------------------------

    def _freeze_file(self) -> tuple[Path, str, str]:
        if self.core is None:
            raise OSError(errno.EOPNOTSUPP, UNDELEGATED % "freezer")
        if self.core_version == 1:
            return Path(self.core, "freezer.state"), "FROZEN", "THAWED"
        return Path(self.core, "cgroup.freeze"), "1", "0"

    def set_frozen(self, frozen: bool) -> None:
        path, on, off = self._freeze_file()
        path.write_text(on if frozen else off)

    def freeze_requested(self) -> bool:
        """Whether the sandbox is paused: freezing was asked for (v1 ``FREEZING``/``FROZEN``,
        v2 ``cgroup.freeze`` = 1). Unlike :meth:`frozen`, this does not flicker while the
        kernel freezes a task that was forking at the time."""
        if self.core is None:
            return False
        if self.core_version == 1:
            return _read(Path(self.core, "freezer.state")).strip() in ("FREEZING", "FROZEN")
        return _read(Path(self.core, "cgroup.freeze")).strip() == "1"

    def frozen(self) -> bool:
        """True once every process is frozen (not while v1 is still ``FREEZING``)."""
        if self.core is None:
            return False
        if self.core_version == 1:
            return _read(Path(self.core, "freezer.state")).strip() == "FROZEN"
        return "frozen 1" in _read(Path(self.core, "cgroup.events")).splitlines()

    async def wait_frozen(self, want: bool, timeout: float) -> bool:
        """Wait until the freeze (or thaw) took effect; False after ``timeout`` seconds.

        A v1 freezer can stay ``FREEZING`` while the sandbox forks: a task created after the
        kernel walked the cgroup is never asked to freeze. As runc's v1 freezer does, the
        request is written again on every poll, and every ``REFREEZE_EVERY`` polls the cgroup
        is thawed and frozen again, which restarts the walk over the tasks there are now.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        polls = 0
        while self.frozen() != want:
            if loop.time() > deadline:
                return False
            await asyncio.sleep(POLL)
            polls += 1
            if want and self.core_version == 1:
                if polls % REFREEZE_EVERY == 0:
                    self.set_frozen(False)
                self.set_frozen(True)
        return True

    # -- processes -----------------------------------------------------------------------------

    def procs(self) -> set[int]:
        """Every process in any of the sandbox's cgroups, children included (host pids)."""
        pids: set[int] = set()
        for d in self.dirs:
            for sub in _tree(Path(d)):
                pids.update(int(p) for p in _read(sub / "cgroup.procs").split())
        return pids

    def memory_usage(self) -> int | None:
        """Bytes charged to the sandbox's memory cgroup, None without a memory controller."""
        if "memory" not in self.limits:
            return None
        version, d = self.limits["memory"]
        raw = _read(Path(d, "memory.usage_in_bytes" if version == 1 else "memory.current"))
        return int(raw) if raw.strip() else None

    def oom_kills(self) -> int:
        """How many processes the sandbox's memory cgroup's OOM killer killed (0 without one)."""
        if "memory" not in self.limits:
            return 0
        version, d = self.limits["memory"]
        text = _read(Path(d, "memory.oom_control" if version == 1 else "memory.events"))
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        return 0

    def kill_all(self) -> None:
        """SIGKILL every process of the sandbox (one pass; :meth:`teardown` repeats it)."""
        if self.core is not None and self.core_version == 2:
            with contextlib.suppress(OSError):  # kernel >= 5.14: atomic, the whole subtree
                Path(self.core, "cgroup.kill").write_text("1")
                return
        procs_files = [sub / "cgroup.procs" for d in self.dirs for sub in _tree(Path(d))]
        _kill_members(procs_files)

    async def teardown(self, timeout: float, reap: Callable[[], None]) -> None:
        """Kill everything, wait until the cgroups are empty, remove the directories.

        ``reap`` is called while waiting so the caller can collect its own zombie children
        (a zombie still pins its cgroup). Raises DestroyFailed after ``timeout`` seconds.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            self.kill_all()
            with contextlib.suppress(OSError):  # a frozen process only dies once thawed
                if self.core is not None:
                    self.set_frozen(False)
            reap()
            left = self.procs()
            if not left:
                break
            if loop.time() > deadline:
                raise DestroyFailed(f"processes would not die: {sorted(left)}", pids=sorted(left))
            await asyncio.sleep(POLL)
        while True:
            reap()
            busy = self.remove()
            if not busy:
                return
            if loop.time() > deadline:
                raise DestroyFailed(f"cgroups would not go away: {busy}", cgroups=busy)
            await asyncio.sleep(POLL)

    def remove(self) -> list[str]:
        """rmdir every directory, children first; return those still present."""
        busy: list[str] = []
        for d in self.dirs:
            for sub in reversed(list(_tree(Path(d)))):
                try:
                    sub.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    busy.append(str(sub))
        return busy


def _delegated(path: Path) -> bool:
    """Whether we may create cgroups below ``path`` (rootless: an administrator chowned it)."""
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _tree(root: Path) -> Iterable[Path]:
    """``root`` and its sub-cgroups, parents before children (empty if ``root`` is gone)."""
    if not root.is_dir():
        return
    stack = [root]
    while stack:
        d = stack.pop()
        yield d
        with contextlib.suppress(OSError):
            stack.extend(Path(e.path) for e in os.scandir(d) if e.is_dir(follow_symlinks=False))


def _kill_members(procs_files: list[Path]) -> None:
    """SIGKILL the members listed in ``procs_files`` without ever hitting a recycled pid.

    A pidfd is opened for each listed pid, then the lists are read again: a pid still listed
    names a process that is a member *now*, and the pidfd opened before refers to that process
    or to one that has since died (the signal then fails harmlessly), never to a stranger.
    """
    listed = {int(p) for f in procs_files for p in _read(f).split()}
    fds: dict[int, int] = {}
    for pid in listed:
        with contextlib.suppress(OSError):
            fds[pid] = os.pidfd_open(pid)
    try:
        still = {int(p) for f in procs_files for p in _read(f).split()}
        for pid, fd in fds.items():
            if pid in still:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
    finally:
        for fd in fds.values():
            os.close(fd)


def _enable_v2_controllers(d: str, limits: dict[str, tuple[int, str]]) -> None:
    """On cgroup v2, enable our controllers on every ancestor from the root down to ``d``'s
    parent (``+memory +cpu +pids`` in ``cgroup.subtree_control``), creating the parent."""
    wanted = [role for role, (version, path) in limits.items() if version == 2 and path == d]
    if not wanted:
        return
    sandbox_dir = Path(d)
    parent = sandbox_dir.parent
    parent.mkdir(exist_ok=True)
    mount = parent.parent
    for level in (mount, parent):
        enabled = set(_read(level / "cgroup.subtree_control").split())
        missing = [c for c in wanted if c not in enabled]
        if missing:
            (level / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in missing))


def _write_limit(role: str, version: int, d: Path, res: Resources) -> None:
    if role == "memory":
        if version == 1:
            (d / "memory.limit_in_bytes").write_text(str(res.memory_bytes))
            if (d / "memory.memsw.limit_in_bytes").exists():  # memory+swap: no swapping around it
                (d / "memory.memsw.limit_in_bytes").write_text(str(res.memory_bytes))
        else:
            (d / "memory.max").write_text(str(res.memory_bytes))
            if (d / "memory.swap.max").exists():
                (d / "memory.swap.max").write_text("0")
    elif role == "cpu":
        quota = res.cpu_millicores * CFS_PERIOD_US // 1000
        if version == 1:
            (d / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
            (d / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (d / "cpu.max").write_text(f"{quota} {CFS_PERIOD_US}")
    else:
        (d / "pids.max").write_text(str(res.pids))
