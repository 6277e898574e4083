"""The cgroup v2 side of pause: a freezable cgroup for a sandbox's commands, beside execd's own.

execd cannot freeze its own cgroup (it would freeze itself). When the cgroup v2 hierarchy is
mounted and execd's cgroup is writable (root, or a delegated subtree), :func:`open_commands`
creates ``<execd's cgroup>/sandpod-freeze-<id>-<execd pid>``; the freezer moves the sandbox's
processes into it and writes ``cgroup.freeze`` -- the kernel then freezes them and every child
they fork, invisibly to them (no SIGSTOP, no SIGCHLD, state stays ``S``). On thaw they move
back (still frozen, so none forks inside meanwhile) and the cgroup is removed. No controllers
are enabled in it, so the "no internal processes" rule does not apply. Pods rarely get a
writable cgroup today: :func:`open_commands` then says why not, and the freezer uses signals.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["CommandsCgroup", "open_commands"]


def _v2_mount() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (``/proc/self/mountinfo``), or None."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, _, after = line.partition(" - ")
        if after.split(" ", 1)[0] == "cgroup2":
            return Path(line.split()[4])
    return None


def _own_path() -> str | None:
    """This process's cgroup v2 path (the ``0::`` line of ``/proc/self/cgroup``)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    return next((line[3:] for line in lines if line.startswith("0::")), None)


class CommandsCgroup:
    """The freezable cgroup of one sandbox's commands; its parent is execd's own cgroup."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.parent = path.parent

    def pids(self) -> set[int]:
        try:
            return {int(p) for p in (self.path / "cgroup.procs").read_text().split()}
        except OSError:
            return set()

    def move_in(self, pids: set[int]) -> None:
        _move(self.path, pids)

    def set_frozen(self, frozen: bool) -> None:
        (self.path / "cgroup.freeze").write_text("1" if frozen else "0")

    def frozen(self) -> bool:
        """Whether the kernel reports every process in it frozen (``cgroup.events``)."""
        try:
            return "frozen 1" in (self.path / "cgroup.events").read_text().splitlines()
        except OSError:
            return False

    def release(self) -> None:
        """Move everything back to execd's cgroup (each process thaws as it leaves), then
        remove the cgroup (best effort). Moved while still frozen: a frozen process cannot
        fork, so no child is born inside after the last look."""
        for _ in range(100):
            pids = self.pids()
            if not pids:
                break
            _move(self.parent, pids)
        with contextlib.suppress(OSError):
            self.set_frozen(False)  # whatever could not move: at least not frozen
        with contextlib.suppress(OSError):
            self.path.rmdir()


def _move(cgroup: Path, pids: set[int]) -> None:
    procs = cgroup / "cgroup.procs"
    for pid in pids:
        # one write per pid (the kernel takes one per write); a process gone meanwhile is fine
        with contextlib.suppress(ProcessLookupError, OSError), procs.open("w") as f:
            f.write(str(pid))


def open_commands(sandbox_id: str) -> tuple[CommandsCgroup | None, str]:
    """The sandbox's freezable cgroup, created if needed, or (None, why it cannot be had)."""
    mount, own = _v2_mount(), _own_path()
    if mount is None or own is None:
        return None, "no cgroup v2 hierarchy"
    base = mount / own.lstrip("/")
    if not os.access(base / "cgroup.procs", os.W_OK):
        return None, f"execd's cgroup {own} is not writable (not delegated)"
    # Named after this execd too: another installation's execd in the same cgroup may serve a
    # sandbox of the same name, and must never freeze or thaw ours.
    path = base / f"sandpod-freeze-{sandbox_id}-{os.getpid()}"
    try:
        path.mkdir(exist_ok=True)
    except OSError as exc:
        return None, f"cannot create a cgroup under {own}: {exc.strerror}"
    if not (path / "cgroup.freeze").exists():  # kernels before 5.2
        with contextlib.suppress(OSError):
            path.rmdir()
        return None, "the kernel has no cgroup v2 freezer"
    return CommandsCgroup(path), ""
