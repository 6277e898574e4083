"""One pseudo-terminal and its program, knowing nothing about NATS (``pty`` domain logic).

The program runs on the slave side of a pty (``os.openpty``) as the leader of a new session with
the terminal as its controlling terminal, so job control, Ctrl-C and ``tty`` work as in a real
terminal. execd keeps only the master side:

- **output**: ``loop.add_reader`` on the master moves every byte into a :class:`ByteLog` (the
  replay buffer) as soon as the kernel has it. Nothing waits for viewers, so the program never
  blocks because a viewer is slow; each viewer reads the log by its own cursor, and one further
  behind than the buffer is told how many bytes it missed (``skipped``).
- **input**: :meth:`Terminal.write` queues bytes in arrival order and writes them without
  blocking (``add_writer`` while the terminal's input queue is full); each caller's future
  resolves once its bytes are in the terminal. Pending input is bounded.
- **exit**: a pidfd says when the program exits. Its status is read without reaping it, so its
  pid (which is also its session and group id) cannot be reused while execd hangs the terminal
  up: output is drained to EOF (EIO once no process holds the slave), for at most ``grace``
  seconds; processes of the session still holding the terminal then get SIGHUP, as from a real
  hangup; then the program is reaped, the master closed, and only then the log closed, so a
  viewer sees ``exited`` after the last byte.

This is the ``process`` runtime: **no isolation**; the program runs on the host as execd's user.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import errno
import os
import signal
import subprocess
import time
from collections.abc import Iterator

import structlog

from sandpod_contract.errors import Busy, PtyClosed, PtyIdInUse, PtyNotFound
from sandpod_execd.cursorlog import ByteLog
from sandpod_execd.oneshot import status_fields
from sandpod_execd.process import kill_cgroup
from sandpod_execd.ptyspawn import TerminalSpec, session_tree, set_size, spawn_on_pty

__all__ = ["MAX_PENDING_INPUT", "Terminal", "TerminalSet", "foreground_group"]

log = structlog.get_logger("sandpod.execd.pty")

READ_SIZE = 64 * 1024
READS_PER_WAKEUP = 16  # then yield to the loop: a flood of output cannot starve other work
MAX_PENDING_INPUT = 4 * 1024 * 1024  # queued, not yet written input bytes per terminal


@dataclasses.dataclass(slots=True)
class _Write:
    view: memoryview  # what is left to write
    future: asyncio.Future[int]
    size: int  # the whole write, for the reply


class Terminal:
    """A running (or finished) terminal. :meth:`run` drives it to the end; the rest are verbs."""

    def __init__(self, spec: TerminalSpec, popen: subprocess.Popen[bytes], master: int) -> None:
        self.spec = spec
        self.pid = popen.pid
        self.cols, self.rows = spec.cols, spec.rows
        self.log = ByteLog(spec.buffer_bytes)
        self.started_at = time.time()
        self.last_seen = time.monotonic()  # last request naming this terminal (abandon_after)
        self.exited_at: float | None = None  # monotonic
        self.returncode: int | None = None
        self.abandoned = False
        self._popen = popen
        self._master: int | None = master
        self._loop = asyncio.get_running_loop()
        self._exited = self._loop.create_future()
        self._eof = asyncio.Event()
        self._done = asyncio.Event()
        self._reaped = False
        self._writes: collections.deque[_Write] = collections.deque()
        self._pending_input = 0
        self._writing = False
        self._loop.add_reader(master, self._on_readable)
        self._watch_exit()

    @classmethod
    def open(cls, spec: TerminalSpec) -> Terminal:
        """Start ``spec``'s program on a new pty; must be called on the event loop.

        Raises:
            InvalidCwd: the cwd is missing or not a directory.
            CommandNotFound: the program does not exist.
            SpawnFailed: any other reason it could not start.
        """
        popen, master = spawn_on_pty(spec)
        return cls(spec, popen, master)

    # -- state ---------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.returncode is None

    def status(self) -> tuple[int | None, int | None]:
        """``(exit_code, signal)`` once exited, else ``(None, None)``."""
        if self.returncode is None:
            return None, None
        return status_fields(self.returncode)

    def touch(self) -> None:
        self.last_seen = time.monotonic()

    # -- output --------------------------------------------------------------------------------

    def _on_readable(self) -> None:
        for _ in range(READS_PER_WAKEUP):
            if self._master is None:
                return
            try:
                data = os.read(self._master, READ_SIZE)
            except BlockingIOError:
                return
            except OSError as exc:  # EIO: no process holds the slave any more
                if exc.errno != errno.EIO:
                    log.warning("pty_read_failed", pty_id=self.spec.pty_id, errno=exc.errno)
                self._at_eof()
                return
            if not data:
                self._at_eof()
                return
            self.log.append(data)

    def _at_eof(self) -> None:
        if self._master is not None and not self._eof.is_set():
            self._loop.remove_reader(self._master)
        self._eof.set()

    # -- input ---------------------------------------------------------------------------------

    def write(self, data: bytes) -> asyncio.Future[int]:
        """Queue ``data`` behind earlier input; the future gives its length once it is written.

        Raises:
            PtyClosed: the program has exited (the future fails so if it exits meanwhile).
            Busy: more than ``MAX_PENDING_INPUT`` bytes are already waiting to be written.
        """
        if not self.running or self._master is None:
            raise PtyClosed(self._closed_message(), pty_id=self.spec.pty_id)
        if self._pending_input + len(data) > MAX_PENDING_INPUT:
            raise Busy(
                f"pty {self.spec.pty_id!r} has {self._pending_input} input bytes waiting; "
                "wait for earlier input to be written",
                limit=MAX_PENDING_INPUT,
            )
        fut: asyncio.Future[int] = self._loop.create_future()
        self._writes.append(_Write(memoryview(data), fut, len(data)))
        self._pending_input += len(data)
        self._flush()
        return fut

    def _flush(self) -> None:
        while self._writes and self._master is not None:
            head = self._writes[0]
            if head.future.cancelled() and len(head.view) == head.size:
                self._writes.popleft()  # withdrawn before any of its bytes went in
                self._pending_input -= head.size
                continue
            try:
                k = os.write(self._master, head.view) if head.view else 0
            except BlockingIOError:
                break
            except OSError as exc:
                self._fail_writes(
                    PtyClosed(f"terminal write failed: {exc.strerror}", pty_id=self.spec.pty_id)
                )
                return
            self._pending_input -= k
            head.view = head.view[k:]
            if not head.view:
                self._writes.popleft()
                if not head.future.done():
                    head.future.set_result(head.size)
        want = bool(self._writes)
        if self._master is not None and want != self._writing:
            if want:
                self._loop.add_writer(self._master, self._flush)
            else:
                self._loop.remove_writer(self._master)
            self._writing = want

    def _fail_writes(self, exc: Exception) -> None:
        if self._writing and self._master is not None:
            self._loop.remove_writer(self._master)
        self._writing = False
        while self._writes:
            fut = self._writes.popleft().future
            if not fut.done():
                fut.set_exception(exc)
        self._pending_input = 0

    def _closed_message(self) -> str:
        exit_code, sig = self.status()
        how = f"exited with {exit_code}" if sig is None else f"was killed by signal {sig}"
        return f"pty {self.spec.pty_id!r} {how}; its output can still be read"

    # -- control -------------------------------------------------------------------------------

    def resize(self, cols: int, rows: int) -> None:
        """Set the window size; the kernel sends SIGWINCH to the foreground job. No-op once the
        terminal is closed."""
        if self._master is not None:
            with contextlib.suppress(OSError):
                set_size(self._master, cols, rows)
        self.cols, self.rows = cols, rows

    def send_signal(self, sig: int) -> None:
        """Signal the terminal's foreground process group (else the program's). No-op after
        the program exited."""
        if not self.running:
            return
        pgrp = foreground_group(self._master)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if pgrp is None:  # not its terminal yet (nor its own group): the program itself
                os.kill(self.pid, sig)
            else:
                os.killpg(pgrp, sig)

    def kill(self) -> None:
        """SIGKILL the whole tree: descendants, group and session (while the program is not
        reaped), and every process carrying this terminal's token (also after)."""
        stray = session_tree(self.pid, self.spec.token, by_ids=not self._reaped)
        if not self._reaped:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, signal.SIGKILL)
        for pid in stray:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if self.spec.cgroup is not None:  # jail: everything the terminal started, escaped or not
            kill_cgroup(self.spec.cgroup)

    # -- lifecycle -----------------------------------------------------------------------------

    def _watch_exit(self) -> None:
        try:
            pidfd = os.pidfd_open(self.pid)
        except OSError:  # very old kernel: poll instead
            self._loop.call_later(0.01, self._poll_exit)
            return

        def on_exit() -> None:
            self._loop.remove_reader(pidfd)
            os.close(pidfd)
            self._peek_exit()

        self._loop.add_reader(pidfd, on_exit)

    def _poll_exit(self) -> None:
        if not self._peek_exit():
            self._loop.call_later(0.01, self._poll_exit)

    def _peek_exit(self) -> bool:
        """Read the exit status without reaping (WNOWAIT): the pid stays ours until we reap."""
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = None
        if info is None:
            return False
        code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        self.returncode = code
        self.exited_at = time.monotonic()
        self._fail_writes(PtyClosed(self._closed_message(), pty_id=self.spec.pty_id))
        if not self._exited.done():
            self._exited.set_result(code)
        return True

    async def run(self, grace: float) -> None:
        """Drive the terminal to its end: exit (or abandonment), drain, hang up, close."""
        try:
            await self._wait_exit()
            await self._drain(grace)
        finally:
            if self.running:  # cancelled at shutdown: do not leave the tree behind
                self.kill()
            self._finish()

    async def _wait_exit(self) -> None:
        limit = self.spec.abandon_after
        while True:
            timeout = None if limit is None else self.last_seen + limit - time.monotonic()
            if timeout is None or timeout > 0:
                done, _ = await asyncio.wait({self._exited}, timeout=timeout)
                if done:
                    return
                continue
            self.abandoned = True
            log.info("pty_abandoned", pty_id=self.spec.pty_id, abandon_after=limit)
            self.kill()
            await self._exited
            return

    async def _drain(self, grace: float) -> None:
        """Read to EOF; hang up whoever still holds the terminal after ``grace`` seconds."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._eof.wait(), grace)
        if not self._eof.is_set():
            for pid in session_tree(self.pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGHUP)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._eof.wait(), grace)

    def _finish(self) -> None:
        if self._master is not None:
            self._on_readable()  # whatever is left
            self._at_eof()
            self._fail_writes(PtyClosed(self._closed_message(), pty_id=self.spec.pty_id))
            os.close(self._master)
            self._master = None
        if not self._reaped:
            self._reaped = True
            with contextlib.suppress(ChildProcessError, subprocess.TimeoutExpired):
                self._popen.wait(timeout=1)
        self.log.close()
        self._done.set()
        log.info(
            "pty_ended",
            pty_id=self.spec.pty_id,
            returncode=self.returncode,
            abandoned=self.abandoned,
            output_bytes=self.log.total,
        )

    async def wait_ended(self, timeout: float) -> bool:
        """Wait until :meth:`run` finished (output closed); whether it did within ``timeout``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._done.wait(), timeout)
        return self._done.is_set()


class TerminalSet:
    """The terminals of one sandbox, oldest first, at most ``limit`` of them.

    An exited terminal is kept ``keep_exited`` seconds (so viewers can read its last output and
    exit status), or until closed, or until a new terminal needs its place.
    """

    def __init__(self, limit: int, keep_exited: float) -> None:
        self.limit = limit
        self.keep_exited = keep_exited
        self._terminals: dict[str, Terminal] = {}

    def __iter__(self) -> Iterator[Terminal]:
        self._expire()
        return iter(list(self._terminals.values()))

    def get(self, pty_id: str) -> Terminal:
        """The terminal ``pty_id``, touched (it counts as activity for ``abandon_after``).

        Raises:
            PtyNotFound: no such terminal (never opened, closed, or forgotten after exit).
        """
        self._expire()
        term = self._terminals.get(pty_id)
        if term is None:
            raise PtyNotFound(f"no pty {pty_id!r} in this sandbox", pty_id=pty_id)
        term.touch()
        return term

    def admit(self, pty_id: str) -> None:
        """Make room for a new terminal ``pty_id``.

        Raises:
            PtyIdInUse: a terminal with this id exists.
            Busy: ``limit`` terminals are running.
        """
        self._expire()
        if pty_id in self._terminals:
            raise PtyIdInUse(
                f"pty id {pty_id!r} is in use; choose another or close it", pty_id=pty_id
            )
        if len(self._terminals) < self.limit:
            return
        exited = [t for t in self._terminals.values() if not t.running]
        if not exited:
            raise Busy(
                f"{self.limit} ptys are running (limit {self.limit}); close one", limit=self.limit
            )
        del self._terminals[min(exited, key=lambda t: t.exited_at or 0.0).spec.pty_id]

    def add(self, term: Terminal) -> None:
        self._terminals[term.spec.pty_id] = term

    def pop(self, pty_id: str) -> Terminal:
        """Forget ``pty_id`` and return it. Raises PtyNotFound."""
        term = self.get(pty_id)
        del self._terminals[pty_id]
        return term

    def _expire(self) -> None:
        now = time.monotonic()
        for pty_id, term in list(self._terminals.items()):
            if term.exited_at is not None and now - term.exited_at > self.keep_exited:
                del self._terminals[pty_id]


def foreground_group(master: int | None) -> int | None:
    """The terminal's foreground process group, or None while it has none.

    Until the program has made the pty its controlling terminal (``setsid --ctty`` runs just
    after the fork), ``tcgetpgrp`` answers 0 and the program is still in execd's own process
    group: ``killpg(0, sig)`` or ``killpg(pid, sig)`` would then signal execd's group (the
    supervisor, a test runner, CI's make) or nobody. The caller signals the program's pid then.
    """
    if master is None:
        return None
    try:
        pgrp = os.tcgetpgrp(master)
    except OSError:
        return None
    if pgrp <= 1 or pgrp == os.getpgrp():
        return None
    return pgrp
