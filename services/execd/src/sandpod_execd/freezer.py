"""Pause for runtimes that cannot freeze a sandbox from outside: execd stops its own commands.

A Pod's cgroup cannot be frozen through the Kubernetes API, but execd is the parent of every
command it starts, so it can stop them itself (``sys.freeze``) and continue them (``sys.thaw``).

Who is frozen: every process whose environment carries this sandbox's ``SANDPOD_SANDBOX_ID``
(execd gives it to every command, and children inherit it -- so commands that ``setsid`` and
were re-parented away from execd are found too), every descendant of those, and, when this execd
serves only this sandbox (a Pod), every other descendant of execd (a command that scrubbed its
environment). Never execd itself nor any of its ancestors: on a test host execd runs beside
everything else, and nothing outside its commands' trees may stop.

How -- ``cgroup`` (preferred; :mod:`sandpod_execd.cgfreeze`): when execd may create a cgroup v2
beside its own, the members move into it and it is frozen; the kernel freezes whatever they fork
too, and the processes cannot tell. Otherwise (a Pod without a delegated cgroup; or
``SANDPOD_EXECD_FREEZER=signals``) -- ``signals``: SIGSTOP each member, then scan again, until a
scan finds no member that is not stopped (a process that forked between a scan and its SIGSTOP
has its child caught by the next scan), within a deadline; thaw sends SIGCONT to every member.
Stopping is observable by the processes (a parent's ``waitpid(WUNTRACED)``, SIGCHLD, state
``T`` in ``/proc``), and a process a user had stopped on purpose is continued by thaw; the
reply's ``detail`` (and the Sandbox's ``Paused`` condition) says so.

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
from sandpod_execd.cgfreeze import CommandsCgroup, open_commands
from sandpod_execd.proctree import Snapshot, snapshot

__all__ = ["MODES", "STARTS", "Freezer"]

MODES = ("auto", "signals")  # auto: the cgroup freezer when execd may use one, else signals

SANDBOX_ENV = "SANDPOD_SANDBOX_ID"
POLL = 0.005  # seconds between scans while waiting for SIGSTOP to take effect
SIGNALS_DETAIL = "SIGSTOP to each process: the processes can observe it; thaw sends SIGCONT"
CGROUP_DETAIL = "cgroup v2 freezer: invisible to the processes"
STARTS = frozenset(
    {
        ("exec", "run"),
        ("exec", "start"),
        ("proc", "start"),
        ("session", "create"),
        ("session", "run"),
        ("pty", "open"),
        ("git", "clone"),
        ("git", "checkout"),
        ("git", "status"),
        ("git", "diff"),
    }
)


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

    def __init__(self, sandbox_id: str, *, sole: bool, mode: str = "auto") -> None:
        """``sole``: this execd serves only this sandbox (all its descendants belong to it);
        ``mode``: one of :data:`MODES`."""
        if mode not in MODES:
            raise ValueError(f"freezer mode must be one of {MODES}, got {mode!r}")
        self.sandbox_id = sandbox_id
        self.sole = sole
        self.mode = mode
        self.frozen = False
        self.mechanism = ""
        self._stopped: set[int] = set()
        self._cgroup: CommandsCgroup | None = None
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
        return FreezeState(
            sandbox_id=self.sandbox_id,
            frozen=self.frozen,
            mechanism=self.mechanism,
            processes=len(self._stopped),
            detail=detail,
        )

    async def freeze(self, timeout: float) -> FreezeState:
        """Freeze every member; returns once each one is frozen (idempotent).

        Raises:
            RequestTimeout: some process would not freeze within ``timeout`` seconds (one in
                uninterruptible sleep); everything frozen so far is continued again.
        """
        async with self._lock:
            deadline = time.monotonic() + timeout
            why = "SANDPOD_EXECD_FREEZER=signals"
            if self.frozen and self.mechanism == "signals":
                why = "already stopped by signals"  # a re-freeze keeps its mechanism
            elif self._cgroup is None and self.mode == "auto":
                self._cgroup, why = await asyncio.to_thread(open_commands, self.sandbox_id)
            self.frozen = True  # refuse new commands from now on
            if self._cgroup is not None:
                self.mechanism = "cgroup"
                await self._freeze_cgroup(self._cgroup, deadline, timeout)
                return self.state(CGROUP_DETAIL)
            self.mechanism = "signals"
            await self._freeze_signals(deadline, timeout)
            return self.state(f"{SIGNALS_DETAIL} (no cgroup freezer: {why})")

    async def _freeze_cgroup(self, cg: CommandsCgroup, deadline: float, timeout: float) -> None:
        await asyncio.to_thread(cg.set_frozen, True)  # what moves in now freezes on arrival
        while True:
            outside = await asyncio.to_thread(lambda: self.members() - cg.pids())
            if not outside and await asyncio.to_thread(cg.frozen):
                break
            if time.monotonic() >= deadline:
                await self._thaw_cgroup(cg)
                raise self._timeout(outside, timeout)
            await asyncio.to_thread(cg.move_in, outside)
            await asyncio.sleep(POLL)  # the kernel reports "frozen" asynchronously
        self._stopped = cg.pids()

    async def _freeze_signals(self, deadline: float, timeout: float) -> None:
        while True:
            members = await asyncio.to_thread(self.members)
            running = {p for p in members if _state(p) not in ("T", "t", None)}
            if not running:
                break
            if time.monotonic() >= deadline:
                await self._continue(members | self._stopped)
                self._stopped = set()
                self.frozen = False
                raise self._timeout(running, timeout)
            for pid in running:  # again, too, if someone continued it meanwhile
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGSTOP)
            self._stopped |= running
            await asyncio.sleep(POLL)  # SIGSTOP takes effect asynchronously
        self._stopped = {p for p in self._stopped if _state(p) is not None}

    def _timeout(self, stuck: set[int], timeout: float) -> RequestTimeout:
        return RequestTimeout(
            f"{len(stuck)} process(es) of {self.sandbox_id} did not freeze within {timeout:g}s",
            pids=sorted(stuck)[:20],
        )

    async def thaw(self) -> FreezeState:
        """Continue every frozen process (and any member still stopped by signals)."""
        async with self._lock:
            if self.frozen and self._cgroup is not None:
                await self._thaw_cgroup(self._cgroup)
            elif self.frozen:
                members = await asyncio.to_thread(self.members)
                await self._continue(members | self._stopped)
            self.frozen = False
            state = self.state()
            self._stopped = set()
            return state

    async def _thaw_cgroup(self, cg: CommandsCgroup) -> None:
        await asyncio.to_thread(cg.release)
        self._cgroup = None
        self.frozen = False

    async def _continue(self, pids: set[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGCONT)
