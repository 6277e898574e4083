"""Shell sessions of one sandbox: ordering, output capture, limits (no NATS).

Data flow: ``SessionTable.create`` spawns ``bash`` (own process session, tree token in its
environment, a private 0700 directory for command files) and returns a :class:`Session` whose
shell ``pump()`` the caller hands to the supervisor. A command takes a :class:`Ticket`
synchronously when its request arrives (``enqueue``), so commands of one session run in arrival
order; the ticket's turn comes when the previous command finished. The command's output files
are then read: what fits goes in the reply, the rest stays on disk for ``session.fetch`` until
fetched to the end, ``result_ttl`` passed, or more than ``max_retained`` newer results exist.

Bounds (:class:`SessionLimits`): sessions per sandbox, commands queued per session, retained
results per session; captured output per stream is capped by ``max_output``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import signal
import time
from collections.abc import Iterator
from typing import Literal

import structlog

from sandpod_contract.errors import (
    BadRequest,
    Busy,
    SessionAlreadyExists,
    SessionDead,
    SessionNotFound,
)
from sandpod_execd import proctree
from sandpod_execd.files.rooted import Root
from sandpod_execd.process import Command, spawn
from sandpod_execd.sessiondir import SessionDir
from sandpod_execd.shell import Outcome, Shell

__all__ = ["Captured", "Place", "Session", "SessionLimits", "SessionTable", "Ticket"]

log = structlog.get_logger("sandpod.execd.session")

StreamName = Literal["stdout", "stderr"]


@dataclasses.dataclass(frozen=True, slots=True)
class SessionLimits:
    """Bounds of the ``session`` family, per sandbox (documented in schemas/docs/session.md)."""

    max_sessions: int = 64
    max_queue: int = 64  # commands waiting behind the running one, per session
    max_retained: int = 8  # finished commands whose output waits for session.fetch
    start_timeout: float = 10.0  # seconds a new shell gets to answer its first command


@dataclasses.dataclass(frozen=True, slots=True)
class Place:
    """Where a session lives: its temp directory (``tmp``, as the shell sees it, resolved by
    execd in ``root``: a jailed sandbox's own root, never a host path string below it), the
    owner of its files (the sandbox's uid/gid when jailed) and its start directory."""

    root: Root
    tmp: str
    owner: tuple[int, int] | None
    cwd: str


@dataclasses.dataclass(slots=True)
class Ticket:
    """A command's place in its session's queue."""

    command_id: str
    turn: asyncio.Future[None]
    cancelled: bool = False


@dataclasses.dataclass(slots=True)
class _Retained:
    files: dict[str, str]  # stream -> file name in the session directory
    sizes: dict[str, int]
    unfetched: set[str]
    expires: float


@dataclasses.dataclass(frozen=True, slots=True)
class Captured:
    """A finished command's output: the head that fits in the reply, and the full sizes."""

    stdout: bytes
    stderr: bytes
    stdout_size: int  # bytes captured (at most max_output)
    stderr_size: int
    stdout_truncated: bool  # the command wrote more than max_output
    stderr_truncated: bool


class Session:
    """One shell session: its queue of commands and the output it still holds."""

    def __init__(self, session_id: str, shell: Shell, limits: SessionLimits, ttl: float) -> None:
        self.session_id = session_id
        self.shell = shell
        self.created_at = time.time()
        self.commands = 0
        self.running: Ticket | None = None
        self._queue: collections.deque[Ticket] = collections.deque()
        self._limits = limits
        self._ttl = ttl
        self._retained: collections.OrderedDict[str, _Retained] = collections.OrderedDict()
        self._dir = shell.workdir

    @property
    def state(self) -> Literal["idle", "busy", "dead"]:
        if not self.shell.alive:
            return "dead"
        return "busy" if self.running is not None else "idle"

    @property
    def queued(self) -> int:
        return len(self._queue)

    def dead_error(self) -> SessionDead:
        code = self.shell.proc.returncode
        how = (
            f"was killed by signal {-code}"
            if code is not None and code < 0
            else f"exited with {code}"
        )
        return SessionDead(
            f"the shell of session {self.session_id!r} {how}; delete or recreate it",
            session_id=self.session_id,
        )

    # -- ordering ------------------------------------------------------------------------------

    def enqueue(self, command_id: str) -> Ticket:
        """Take a place in line (synchronously, in arrival order).

        Raises:
            SessionDead: the shell exited.
            Busy: ``max_queue`` commands already wait.
            BadRequest: a command with this id is queued or running.
        """
        if not self.shell.alive:
            raise self.dead_error()
        if len(self._queue) >= self._limits.max_queue:
            raise Busy(
                f"{len(self._queue)} commands queued in session {self.session_id!r}",
                limit=self._limits.max_queue,
            )
        taken = [t.command_id for t in self._queue] + (
            [self.running.command_id] if self.running else []
        )
        if command_id in taken:
            raise BadRequest(
                f"command {command_id!r} is already queued or running", command_id=command_id
            )
        ticket = Ticket(command_id, asyncio.get_running_loop().create_future())
        self._queue.append(ticket)
        self._next()
        return ticket

    def dequeue(self, ticket: Ticket) -> None:
        """Give up a place (the request could not be served, or it was cancelled)."""
        with contextlib.suppress(ValueError):
            self._queue.remove(ticket)
        if self.running is ticket:
            self.running = None
        if not ticket.turn.done():
            ticket.turn.cancel()
        self._next()

    def _next(self) -> None:
        if self.running is None and self._queue:
            self.running = self._queue.popleft()
            self.running.turn.set_result(None)

    def cancel(self, command_id: str) -> bool:
        """End a queued or running command; False if there is none with this id."""
        for ticket in self._queue:
            if ticket.command_id == command_id:
                ticket.cancelled = True
                self.dequeue(ticket)
                return True
        if self.running is not None and self.running.command_id == command_id:
            self.running.cancelled = True
            self.shell.interrupt()
            return True
        return False

    async def run(
        self, ticket: Ticket, command: str, stdin: bytes | None, timeout: float | None
    ) -> Outcome | None:
        """Wait for the ticket's turn and run the command; ``None`` if cancelled while queued."""
        try:
            try:
                await ticket.turn
            except asyncio.CancelledError:
                if ticket.cancelled:
                    return None
                raise
            if not self.shell.alive:
                raise self.dead_error()
            self.commands += 1
            return await self.shell.run(command, stdin, timeout)
        finally:
            self.dequeue(ticket)

    # -- output --------------------------------------------------------------------------------

    def capture(self, command_id: str, outcome: Outcome, max_output: int, budget: int) -> Captured:
        """Read the command's output files; keep what does not fit in ``budget`` for fetch."""
        files = {"stdout": outcome.stdout, "stderr": outcome.stderr}
        written = {s: self._dir.size(name) for s, name in files.items()}
        sizes = {s: min(n, max_output) for s, n in written.items()}
        head = _split(budget, sizes["stdout"], sizes["stderr"])
        data = {s: self._dir.read(files[s], 0, head[s]) for s in files}
        unfetched = {s for s in files if len(data[s]) < sizes[s]}
        if unfetched:
            self._retain(
                command_id, _Retained(files, sizes, unfetched, time.monotonic() + self._ttl)
            )
        else:
            self._dir.unlink(*files.values())
        return Captured(
            stdout=data["stdout"],
            stderr=data["stderr"],
            stdout_size=sizes["stdout"],
            stderr_size=sizes["stderr"],
            stdout_truncated=written["stdout"] > max_output,
            stderr_truncated=written["stderr"] > max_output,
        )

    def _retain(self, command_id: str, kept: _Retained) -> None:
        self._retained[command_id] = kept
        while len(self._retained) > self._limits.max_retained:
            _, old = self._retained.popitem(last=False)
            self._dir.unlink(*old.files.values())

    def fetch(
        self, command_id: str, stream: StreamName, offset: int, max_bytes: int
    ) -> tuple[bytes, bool]:
        """``(data, eof)`` of a retained result from ``offset``; KeyError if not retained."""
        self.expire()
        kept = self._retained[command_id]
        data = self._dir.read(
            kept.files[stream], offset, min(max_bytes, max(kept.sizes[stream] - offset, 0))
        )
        eof = offset + len(data) >= kept.sizes[stream]
        if eof:
            kept.unfetched.discard(stream)
            if not kept.unfetched:
                del self._retained[command_id]
                self._dir.unlink(*kept.files.values())
        return data, eof

    def expire(self) -> None:
        now = time.monotonic()
        for command_id in [c for c, k in self._retained.items() if k.expires <= now]:
            self._dir.unlink(*self._retained.pop(command_id).files.values())

    def discard(self) -> None:
        """Forget a dead session now: SIGKILL what its shell left running, remove its files."""
        pids = proctree.members(self.shell.proc, self.shell.proc.pid, self.shell.token)
        proctree.signal_pids(pids, signal.SIGKILL)
        self._retained.clear()
        self._dir.remove()

    async def close(self) -> None:
        """Kill the shell and its processes, cancel queued commands, remove its files."""
        for ticket in list(self._queue):
            ticket.cancelled = True
            self.dequeue(ticket)
        if self.running is not None:
            self.running.cancelled = True
        self.shell.interrupt()
        await self.shell.kill()
        self._retained.clear()
        self._dir.remove()


class SessionTable:
    """The sessions of one sandbox, oldest first."""

    def __init__(self, limits: SessionLimits, ttl: float) -> None:
        self.limits = limits
        self._ttl = ttl
        self._sessions: dict[str, Session] = {}

    def __iter__(self) -> Iterator[Session]:
        return iter(list(self._sessions.values()))

    def get(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise SessionNotFound(f"no session {session_id!r}", session_id=session_id)
        return session

    def admit(self, session_id: str) -> Session | None:
        """Check a new session may be created; returns the dead one it replaces, if any.

        Raises:
            SessionAlreadyExists: a live session has this id.
            Busy: ``max_sessions`` live sessions exist.
        """
        old = self._sessions.get(session_id)
        if old is not None and old.shell.alive:
            raise SessionAlreadyExists(
                f"session {session_id!r} exists; delete it first", session_id=session_id
            )
        # Dead sessions stay listed until deleted or recreated; past the bound, the oldest go.
        dead = [s for s in self._sessions.values() if not s.shell.alive]
        while dead and len(self._sessions) >= 2 * self.limits.max_sessions:
            self._sessions.pop(dead.pop(0).session_id).discard()
        live = len(self._sessions) - len(dead)
        if live >= self.limits.max_sessions:
            raise Busy(
                f"{live} sessions open (limit {self.limits.max_sessions})",
                limit=self.limits.max_sessions,
            )
        return old

    def spawn(self, session_id: str, cmd: Command, token: str, place: Place) -> Session:
        """Start the shell for ``session_id`` (after :meth:`admit`) in the directory ``place``."""
        workdir = SessionDir(place.root, place.tmp, place.owner)
        try:
            proc = spawn(cmd)
        except BaseException:
            workdir.remove()
            raise
        shell = Shell(proc, token, workdir, place.cwd)
        session = Session(session_id, shell, self.limits, self._ttl)
        self._sessions[session_id] = session
        log.info("session_started", session_id=session_id, pid=proc.pid)
        return session

    def remove(self, session_id: str) -> Session:
        session = self.get(session_id)
        del self._sessions[session_id]
        return session


def _split(budget: int, out: int, err: int) -> dict[str, int]:
    """Share ``budget`` between the streams: half each, a stream's unused half to the other."""
    half = budget // 2
    a = min(out, max(half, budget - err))
    return {"stdout": a, "stderr": min(err, budget - a)}
