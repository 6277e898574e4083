"""Background processes of one sandbox: spawning, draining, killing, remembering (no NATS).

Data flow: ``ProcTable.start`` spawns the command (in its own session, with a tree token in its
environment, see :mod:`~sandpod_execd.proctree`) and returns a :class:`BackgroundProc` whose
``run()`` the caller hands to the supervisor. ``run()`` reads stdout and stderr continuously
into one bounded :class:`~sandpod_execd.proclog.OutputLog` (so the process never blocks on a full
pipe, whether or not anyone reads), enforces the optional timeout, records the exit, and keeps
reading until every writer closed the pipes (a daemon the process left behind still shows its
output); then the log is closed (``eof``). ``kill`` ends the whole tree; ``discard`` forgets a
record and kills whatever the process left running.

Bounds (:class:`ProcLimits`): at most ``max_records`` kept records per sandbox (the oldest exited
ones are forgotten first; when all are running, ``start`` is refused with ``busy``), each log at
most ``max_log`` bytes, and the logs of all kept records together at most ``log_budget`` bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shlex
import signal
import time
from collections.abc import Iterator, Mapping
from typing import Literal

import structlog

from sandpod_contract.errors import Busy, ProcIdInUse, ProcNotFound
from sandpod_execd import proctree
from sandpod_execd.process import Command, PipeReader, Process, spawn
from sandpod_execd.proclog import OutputLog, StreamName

__all__ = ["BackgroundProc", "ProcLimits", "ProcState", "ProcTable", "display"]

log = structlog.get_logger("sandpod.execd.proc")

MiB = 1024 * 1024
READ_SIZE = 64 * 1024
COMMAND_DISPLAY = 1024  # characters of the command line shown in listings


@dataclasses.dataclass(frozen=True, slots=True)
class ProcLimits:
    """Bounds of the ``proc`` family, per sandbox (defaults documented in schemas/docs/proc.md)."""

    max_records: int = 256  # kept records, running and exited
    default_log: int = 2 * MiB  # output kept per process when proc.start does not say
    max_log: int = 64 * MiB  # largest log_limit granted
    min_log: int = 4096  # smallest log_limit granted
    log_budget: int = 512 * MiB  # sum of the log limits of all kept records
    default_grace: float = 5.0  # proc.kill: seconds between the signal and SIGKILL
    shutdown_grace: float = 2.0  # execd stopping: SIGTERM, then SIGKILL after this


ProcState = Literal["running", "exited"]


class BackgroundProc:
    """One background process: its tree, its log, its exit. ``run()`` drives it."""

    def __init__(
        self,
        *,
        proc_id: str,
        proc: Process,
        token: str,
        command: str,
        cwd: str,
        tags: Mapping[str, str] | None,
        log_limit: int,
        timeout: float | None,
        stdin: bytes | None,
    ) -> None:
        self.proc_id = proc_id
        self.proc = proc
        self.token = token
        self.command = command
        self.cwd = cwd
        self.tags = dict(tags) if tags else None
        self.log = OutputLog(log_limit)
        self.log_limit = log_limit
        self.started_at = time.time()
        self._ended_at: float | None = None
        self.killed = False
        self.timed_out = False
        self.sizes = {"stdout": 0, "stderr": 0}
        self._timeout = timeout
        self._stdin = stdin
        self._stop = asyncio.Event()  # discard(): stop reading, close the pipes
        self._done = asyncio.Event()  # run() finished: pipes closed, log closed

    @property
    def state(self) -> ProcState:
        return "running" if self.proc.running else "exited"

    @property
    def ended_at(self) -> float | None:
        """Wall clock of the exit (as first observed: the reap and this differ by microseconds)."""
        if self._ended_at is None and not self.proc.running:
            self._ended_at = time.time()
        return self._ended_at

    @property
    def finished(self) -> bool:
        """Exited, and the log is closed (nothing holds the output pipes any more)."""
        return self._done.is_set()

    def matches(self, tags: Mapping[str, str] | None, state: str | None) -> bool:
        if state is not None and self.state != state:
            return False
        mine = self.tags or {}
        return all(mine.get(k) == v for k, v in (tags or {}).items())

    # -- driving -------------------------------------------------------------------------------

    async def run(self) -> None:
        """Drain output, enforce the timeout, record the exit; ends when the pipes close."""
        pumps = asyncio.ensure_future(self._pumps())
        helpers = [asyncio.ensure_future(self._watch_timeout())]
        if self._stdin is not None:
            helpers.append(asyncio.ensure_future(self._feed(self._stdin)))
        stop = asyncio.ensure_future(self._stopped())
        try:
            await self.proc.wait()
            self._ended_at = self._ended_at or time.time()
            log.info("proc_exited", proc_id=self.proc_id, returncode=self.proc.returncode)
            await asyncio.wait([pumps, stop], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (pumps, stop, *helpers):
                task.cancel()
            await asyncio.gather(pumps, stop, *helpers, return_exceptions=True)
            if self.proc.running:  # cancelled (execd stopping) or discarded while running
                self.killed = True
                await asyncio.shield(self._kill_now())
            self.proc.close_pipes()
            self.log.close()
            self._done.set()

    async def _pumps(self) -> None:
        await asyncio.gather(
            self._pump(self.proc.stdout, "stdout"), self._pump(self.proc.stderr, "stderr")
        )

    async def _stopped(self) -> None:
        await self._stop.wait()

    async def _pump(self, reader: PipeReader, stream: StreamName) -> None:
        while data := await reader.read(READ_SIZE):
            self.sizes[stream] += len(data)
            self.log.append(stream, data)

    async def _feed(self, data: bytes) -> None:
        stdin = self.proc.stdin
        if stdin is None:  # started without a pipe: nothing to feed
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            await stdin.write(data)
        stdin.close()

    async def _watch_timeout(self) -> None:
        if self._timeout is None:
            return
        try:
            await asyncio.wait_for(self.proc.wait(), self._timeout)
        except TimeoutError:
            self.timed_out = True
            log.info("proc_timed_out", proc_id=self.proc_id, timeout=self._timeout)
            await self._kill_now()

    async def _kill_now(self) -> None:
        await proctree.end_tree(self.proc, self.proc.pid, self.token, signal.SIGKILL, 0)

    # -- client verbs --------------------------------------------------------------------------

    async def kill(self, sig: int, grace: float) -> None:
        """Send ``sig`` to the whole tree, SIGKILL survivors after ``grace``; wait for the exit."""
        if self.proc.running:
            self.killed = True
        await proctree.end_tree(self.proc, self.proc.pid, self.token, sig, grace)
        await self.proc.wait()

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the process group (no-op once the process exited)."""
        if self.proc.running:
            self.proc.signal_group(sig)

    async def wait(self, timeout: float) -> None:
        """Return when the process exited or ``timeout`` seconds passed."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.proc.wait(), timeout)

    def discard(self) -> None:
        """Stop tracking: SIGKILL the tree (anything it left running too), close the pipes."""
        if self.proc.running:
            self.killed = True
        pids = proctree.members(self.proc, self.proc.pid, self.token)
        if self.proc.running:
            self.proc.signal_group(signal.SIGKILL)
        proctree.signal_pids(pids, signal.SIGKILL)
        self._stop.set()

    def forget(self) -> None:
        """Stop tracking a tree already ended (execd's shutdown), without scanning for it."""
        self._stop.set()

    async def closed(self) -> None:
        """Wait until ``run()`` released everything."""
        await self._done.wait()


class ProcTable:
    """The background processes of one sandbox, oldest first, within :class:`ProcLimits`."""

    def __init__(self, limits: ProcLimits) -> None:
        self.limits = limits
        self._procs: dict[str, BackgroundProc] = {}

    def __iter__(self) -> Iterator[BackgroundProc]:
        return iter(list(self._procs.values()))

    def __len__(self) -> int:
        return len(self._procs)

    def get(self, proc_id: str) -> BackgroundProc:
        bp = self._procs.get(proc_id)
        if bp is None:
            raise ProcNotFound(f"no background process {proc_id!r}", proc_id=proc_id)
        return bp

    def log_limit(self, asked: int | None) -> int:
        lim = self.limits
        return max(lim.min_log, min(asked or lim.default_log, lim.max_log))

    def start(
        self,
        cmd: Command,
        *,
        proc_id: str,
        token: str,
        display: str,
        cwd: str,
        tags: Mapping[str, str] | None,
        log_limit: int,
        timeout: float | None,
        stdin: bytes | None,
    ) -> BackgroundProc:
        """Admit and spawn (synchronously, so two starts of one id cannot interleave).

        Raises:
            ProcIdInUse: a kept record has this id.
            Busy: every kept record is running and the table (or the log budget) is full.
            SpawnFailed, CommandNotFound, InvalidCwd: the command could not start.
        """
        if proc_id in self._procs:
            raise ProcIdInUse(
                f"background process {proc_id!r} exists; remove it or choose another id",
                proc_id=proc_id,
            )
        self._make_room(log_limit)
        proc = spawn(cmd)
        bp = BackgroundProc(
            proc_id=proc_id,
            proc=proc,
            token=token,
            command=display[:COMMAND_DISPLAY],
            cwd=cwd,
            tags=tags,
            log_limit=log_limit,
            timeout=timeout,
            stdin=stdin,
        )
        self._procs[proc_id] = bp
        log.info("proc_started", proc_id=proc_id, pid=proc.pid)
        return bp

    def _make_room(self, log_limit: int) -> None:
        lim = self.limits

        def full() -> bool:
            used = sum(bp.log_limit for bp in self._procs.values())
            return len(self._procs) >= lim.max_records or used + log_limit > lim.log_budget

        while full():
            # Forget finished records first, then exited ones still holding leftovers.
            victims = [bp for bp in self._procs.values() if bp.finished] or [
                bp for bp in self._procs.values() if bp.state == "exited"
            ]
            if not victims:
                raise Busy(
                    f"{len(self._procs)} background processes running (limit "
                    f"{lim.max_records}, logs {lim.log_budget // MiB} MiB): kill or remove some",
                    limit=lim.max_records,
                )
            self.remove(victims[0].proc_id)

    def remove(self, proc_id: str, *, ended: bool = False) -> BackgroundProc:
        """Forget ``proc_id`` (killing its tree, unless the caller ``ended`` it already);
        ``closed()`` on the result waits for cleanup."""
        bp = self.get(proc_id)
        del self._procs[proc_id]
        if ended:
            bp.forget()
        else:
            bp.discard()
        return bp

    def list(self, tags: Mapping[str, str] | None, state: str | None) -> list[BackgroundProc]:
        return [bp for bp in self._procs.values() if bp.matches(tags, state)]


def display(argv: tuple[str, ...] | None, shell: str | None) -> str:
    """The command as a human would type it."""
    return shell if shell is not None else shlex.join(argv or ())
