"""Pause for runtimes that cannot freeze a sandbox from outside: execd stops its own commands.

A Pod's cgroup cannot be frozen through the Kubernetes API, but execd is the parent of every
command it starts, so it can stop them itself (``sys.freeze``) and continue them (``sys.thaw``).

Who is frozen: every process whose environment carries this sandbox's ``SANDPOD_SANDBOX_ID``
(execd gives it to every command, and children inherit it -- so commands that ``setsid`` and
were re-parented away from execd are found too), every descendant of those, and, when this execd
serves only this sandbox (a Pod), every other descendant of execd (a command that scrubbed its
environment). Never execd itself nor any of its ancestors: on a test host execd runs beside
everything else, and nothing outside its commands' trees may stop.

How -- ``signals``: SIGSTOP each member, then scan again, until a scan finds no member that is
not stopped (a process that forked between a scan and its SIGSTOP has its child caught by the
next scan), within a deadline; thaw sends SIGCONT to every member. Stopping is observable by the
processes (a parent's ``waitpid(WUNTRACED)``, SIGCHLD, state ``T`` in ``/proc``), and a process
a user had stopped on purpose is continued by thaw; the Sandbox's ``Paused`` condition says so.
A cgroup v2 freezer (invisible to the processes) needs execd's commands in a cgroup of their own
that execd may write; Pods do not delegate one today, so ``signals`` is the mechanism in use.

While frozen, the router refuses verbs that would start a process (:data:`STARTS`) with
``sandbox.paused`` rather than letting them hang on a stopped tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

from sandpod_contract.errors import RequestTimeout
from sandpod_contract.messages.system import FreezeState
from sandpod_execd.proctree import Snapshot, snapshot

__all__ = ["STARTS", "Freezer"]

SANDBOX_ENV = "SANDPOD_SANDBOX_ID"
POLL = 0.005  # seconds between scans while waiting for SIGSTOP to take effect
SIGNALS_DETAIL = "SIGSTOP to each process: the processes can observe it; thaw sends SIGCONT"
STARTS = frozenset({
    ("exec", "run"), ("exec", "start"), ("proc", "start"), ("session", "create"),
    ("session", "run"), ("pty", "open"), ("git", "clone"), ("git", "checkout"),
    ("git", "status"), ("git", "diff"),
})  # fmt: skip


def _ancestors(pid: int, snap: Snapshot) -> set[int]:
    parent = {child: p for p, kids in snap.children.items() for child in kids}
    found = {pid}
    while (pid := parent.get(pid, 0)) > 0:
        found.add(pid)
    return found


def _state(pid: int) -> str | None:
    """The one-letter state of ``pid`` (``T``: stopped), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return raw[raw.rfind(b")") + 2 :].split()[0].decode()


class Freezer:
    """The freeze state of one sandbox served by this execd."""

    def __init__(self, sandbox_id: str, *, sole: bool) -> None:
        """``sole``: this execd serves only this sandbox (all its descendants belong to it)."""
        self.sandbox_id = sandbox_id
        self.sole = sole
        self.frozen = False
        self.mechanism = ""
        self._stopped: set[int] = set()
        self._lock = asyncio.Lock()

    def members(self) -> set[int]:
        """The live processes of the sandbox's commands (see the module docstring)."""
        me = os.getpid()
        snap = snapshot(self.sandbox_id, SANDBOX_ENV)
        roots = set(snap.tagged)
        if self.sole:
            roots |= snap.subtree(me)
        found = set(roots)
        for root in roots:
            found |= snap.subtree(root)
        return found - _ancestors(me, snap)

    def state(self, detail: str = "") -> FreezeState:
        return FreezeState(sandbox_id=self.sandbox_id, frozen=self.frozen,
                           mechanism=self.mechanism, processes=len(self._stopped),
                           detail=detail)  # fmt: skip

    async def freeze(self, timeout: float) -> FreezeState:
        """Stop every member; returns once each one is stopped (idempotent).

        Raises:
            RequestTimeout: some process would not stop within ``timeout`` seconds (one in
                uninterruptible sleep); everything stopped so far is continued again.
        """
        async with self._lock:
            self.frozen, self.mechanism = True, "signals"  # refuse new commands from now on
            deadline = time.monotonic() + timeout
            while True:
                members = await asyncio.to_thread(self.members)
                running = {p for p in members if _state(p) not in ("T", "t", None)}
                if not running:
                    break
                if time.monotonic() >= deadline:
                    await self._continue(members)
                    self.frozen = False
                    raise RequestTimeout(
                        f"{len(running)} process(es) of {self.sandbox_id} did not stop within "
                        f"{timeout:g}s", pids=sorted(running)[:20],
                    )  # fmt: skip
                for pid in running:  # again, too, if someone continued it meanwhile
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGSTOP)
                self._stopped |= running
                await asyncio.sleep(POLL)  # SIGSTOP takes effect asynchronously
            self._stopped = {p for p in self._stopped if _state(p) is not None}
            return self.state(SIGNALS_DETAIL)

    async def thaw(self) -> FreezeState:
        """Continue every process the freeze stopped (and any member still stopped)."""
        async with self._lock:
            if self.frozen:
                members = await asyncio.to_thread(self.members)
                await self._continue(members | self._stopped)
            self.frozen = False
            state = self.state()
            self._stopped = set()
            return state

    async def _continue(self, pids: set[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGCONT)
