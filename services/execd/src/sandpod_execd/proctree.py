"""Finding and ending a whole process tree, including processes that escaped it.

A background process or a session shell can start children that call ``setsid`` (leaving the
process group) and whose parent then exits (so they are re-parented to init and no longer
descendants by parent pid). To still find them, execd gives every tree it starts a unique token
in the environment (``SANDPOD_TREE_ID``), which children inherit. A tree's members are then:
the descendants of its leader by parent pid, the members of its process group (while the leader
lives, so the group id cannot have been reused), and every process whose environment carries
the token (read from ``/proc/<pid>/environ``; a process that scrubs its environment *and* leaves
both the group and its parent chain is the one case this misses).

In the local runtime each command also has its own cgroup (``Process.cgroup``); its members
belong to the tree as well, and the final SIGKILL goes to the whole cgroup.

``end_tree`` sends a signal to every member, waits up to a grace period, then SIGKILLs whatever
is left, re-scanning (until a scan finds nobody new) so that children forked meanwhile die too.
``end_leftovers`` does the same for what many exited leaders left running, one scan per pass for
all of them (execd's shutdown: hundreds of kept records, one tree each).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Collection, Iterable

from sandpod_execd.process import Process, kill_cgroup

__all__ = [
    "COMMAND_TOKEN_ENV",
    "TOKEN_ENV",
    "Snapshot",
    "alive",
    "children",
    "end_leftovers",
    "end_tree",
    "kill_members",
    "kill_tagged",
    "members",
    "signal_pids",
    "snapshot",
]

TOKEN_ENV = "SANDPOD_TREE_ID"  # noqa: S105 - a variable name, not a secret
# A session shell's commands carry their own token besides the shell's (see ``shell.py``).
COMMAND_TOKEN_ENV = "SANDPOD_COMMAND_TREE_ID"  # noqa: S105 - a variable name, not a secret
POLL = 0.02  # seconds between liveness checks while waiting for a tree to die
KILL_PASSES = 16  # scans that may each find children forked just before the previous kill


@dataclasses.dataclass(frozen=True, slots=True)
class Snapshot:
    """One pass over ``/proc``: who is whose child, each process's group, who carries a token."""

    children: dict[int, list[int]]
    pgid: dict[int, int]
    tagged: frozenset[int]

    def subtree(self, root: int) -> set[int]:
        """``root``'s live descendants by parent pid (``root`` excluded)."""
        found: set[int] = set()
        stack = [root]
        while stack:
            for child in self.children.get(stack.pop(), []):
                if child not in found:
                    found.add(child)
                    stack.append(child)
        return found


def _stat(pid: str) -> tuple[int, int, str] | None:
    """(ppid, pgid, state) of ``pid`` or ``None`` if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # the command name may contain spaces and parentheses: parse after the last ')'
    fields = raw[raw.rfind(b")") + 2 :].split()
    return int(fields[1]), int(fields[2]), fields[0].decode()


def _carries(pid: str, needles: frozenset[bytes]) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return not needles.isdisjoint(f.read().split(b"\0"))
    except OSError:  # gone, or not ours to read
        return False


def snapshot(
    token: str | None = None, env: str = TOKEN_ENV, *, tokens: Collection[str] = ()
) -> Snapshot:
    """Scan ``/proc`` once; ``token`` (or any of ``tokens``) also collects the processes whose
    environment carries ``<env>=<token>`` (other than this one)."""
    needle = frozenset(f"{env}={t}".encode() for t in (*tokens, *([token] if token else [])))
    children: dict[int, list[int]] = {}
    pgid: dict[int, int] = {}
    tagged: set[int] = set()
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        stat = _stat(entry.name)
        if stat is None or stat[2] in ("Z", "X"):
            continue
        pid = int(entry.name)
        children.setdefault(stat[0], []).append(pid)
        pgid[pid] = stat[1]
        if needle and pid != me and _carries(entry.name, needle):
            tagged.add(pid)
    return Snapshot(children, pgid, frozenset(tagged))


def _cgroup_pids(leader: Process | None) -> set[int]:
    if leader is None or leader.cgroup is None:
        return set()
    try:
        with open(f"{leader.cgroup}/cgroup.procs", "rb") as f:
            return {int(p) for p in f.read().split()}
    except OSError:
        return set()


def members(leader: Process | None, pid: int, token: str, snap: Snapshot | None = None) -> set[int]:
    """Every live process of the tree led by ``pid`` (see the module docstring)."""
    snap = snap or snapshot(token)
    found = set(snap.tagged) | _cgroup_pids(leader)
    if leader is not None and leader.running:
        found.add(pid)
        found |= {p for p, g in snap.pgid.items() if g == pid}
    for root in [pid, *found]:
        found |= snap.subtree(root)
    found.discard(os.getpid())
    return found


def children(pid: int) -> set[int]:
    """``pid``'s direct children: one read of ``/proc/<pid>/task/<pid>/children`` when the
    kernel offers it (cheap enough to call per command), else a full scan."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            return {int(p) for p in f.read().split()}
    except OSError:
        return set(snapshot().children.get(pid, []))


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    stat = _stat(str(pid))
    return stat is not None and stat[2] not in ("Z", "X")


def signal_pids(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


async def _wait_gone(leader: Process | None, pids: set[int], timeout: float) -> set[int]:
    """Wait up to ``timeout`` for ``pids`` (and the leader) to die; returns the survivors."""
    deadline = time.monotonic() + timeout
    while True:
        left = {p for p in pids if alive(p)}
        if leader is not None and leader.running:
            left.add(leader.pid)
        if not left or time.monotonic() >= deadline:
            return left
        await asyncio.sleep(POLL)


async def end_tree(leader: Process | None, pid: int, token: str, sig: int, grace: float) -> None:
    """Send ``sig`` to the whole tree, then SIGKILL what is alive after ``grace`` seconds.

    The tree is scanned again after the grace period even when everything found at first has
    died: a member may have forked meanwhile (a SIGTERM handler starting a setsid'd child, say).
    Returns once every member found is dead (or after one more second of waiting for SIGKILL
    to take effect, which only a process stuck in the kernel survives).
    """
    pids = members(leader, pid, token)
    # killpg only while the leader is unreaped: afterwards its pid (= group id) may be reused.
    if leader is not None and leader.running:
        leader.signal_group(sig)
    signal_pids(pids, sig)
    left = set(pids)
    if sig != signal.SIGKILL and grace > 0:
        left = await _wait_gone(leader, pids, grace)
    # Survivors of the first scan die whether or not a new scan finds them again (a group
    # member no longer counts once the leader is reaped); the new scans find what was forked.
    # The leader's group goes first: a leader killed after its children could see them die
    # and exit by itself (a shell in `wait` exits 137) before its own SIGKILL landed.
    if leader is not None and leader.running:
        leader.signal_group(signal.SIGKILL)
    signal_pids(left, signal.SIGKILL)
    killed = left | kill_members(leader, pid, token)
    if leader is not None and leader.cgroup is not None:
        kill_cgroup(leader.cgroup)  # jailed: strays re-parented inside the sandbox too
    await _wait_gone(leader, killed, 1.0)


async def end_leftovers(tokens: Collection[str], sig: int, grace: float) -> None:
    """``end_tree`` for the trees of many leaders that have exited: what carries one of their
    ``tokens`` (and its descendants) gets ``sig``, then SIGKILL after ``grace`` seconds, with
    one ``/proc`` scan per pass for all the trees (``end_tree`` scans several times per tree)."""
    if not tokens:
        return
    pids = _leftovers(tokens)
    signal_pids(pids, sig)
    left = pids
    if pids and sig != signal.SIGKILL and grace > 0:
        left = await _wait_gone(None, pids, grace)
    signal_pids(left, signal.SIGKILL)
    killed = set(left)
    for _ in range(KILL_PASSES):
        fresh = _leftovers(tokens) - killed
        if not fresh:
            break
        signal_pids(fresh, signal.SIGKILL)
        killed |= fresh
    await _wait_gone(None, killed, 1.0)


def _leftovers(tokens: Collection[str]) -> set[int]:
    snap = snapshot(tokens=tokens)
    found = set(snap.tagged)
    for root in list(found):
        found |= snap.subtree(root)
    found.discard(os.getpid())
    return found


def kill_members(
    leader: Process | None, pid: int, token: str, passes: int = KILL_PASSES
) -> set[int]:
    """SIGKILL every member, scanning again until a scan finds nobody new (at most ``passes``
    scans); returns the pids signalled. A process with SIGKILL pending cannot fork, so each
    scan only finds children forked before the previous pass's signals landed."""
    killed: set[int] = set()
    for _ in range(passes):
        if leader is not None and leader.running:
            leader.signal_group(signal.SIGKILL)
        fresh = members(leader, pid, token) - killed
        if not fresh:
            break
        signal_pids(fresh, signal.SIGKILL)
        killed |= fresh
    return killed


def kill_tagged(token: str, env: str = TOKEN_ENV, passes: int = KILL_PASSES) -> set[int]:
    """SIGKILL every process carrying ``<env>=<token>``, scanning again until a scan finds
    nobody new (at most ``passes`` scans); returns the pids signalled."""
    killed: set[int] = set()
    for _ in range(passes):
        fresh = set(snapshot(token, env).tagged) - killed
        if not fresh:
            break
        signal_pids(fresh, signal.SIGKILL)
        killed |= fresh
    return killed
