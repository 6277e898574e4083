"""A streaming exec: sequenced, windowed, resumable output frames (``exec.start`` domain logic).

Data flow: two pumps read the command's stdout and stderr, but only while the bytes in flight
(published, not yet acknowledged) are below the window; each piece becomes an ``OutputChunk``
frame with the next ``seq``, kept in ``retained`` until the client acks it, and published through
the injected ``publish`` callable. A pump reserves its read size from the window before reading,
so published-but-unacked plus being-read bytes never exceed the window. When the client is slow
or away the pumps stop reading, the pipe fills and the command blocks on write: nothing is
dropped and memory stays below the window. When the command has exited and both pipes are
drained, an ``ExecExit`` frame ends the stream; it too is retained until acked (or until the
client was silent for ``abandon_after``). When execd stops, ``shut_down`` keeps a running
command's stream going (in-flight work, within the service's grace period) but no longer waits
on delivery alone: see its docstring.
A client that missed frames asks ``resume(from_seq)`` and gets every retained frame again.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import signal
import time
from collections.abc import Awaitable, Callable

import structlog

from sandpod_contract.codec import encode
from sandpod_contract.errors import BadRequest, ConnectionLost, StreamClosed
from sandpod_contract.messages.exec import ExecExit, ExecStatus, OutputChunk, StreamName
from sandpod_execd.oneshot import status_fields
from sandpod_execd.process import PipeReader, Process

__all__ = ["Publish", "StreamState", "StreamingExec"]

log = structlog.get_logger("sandpod.execd.stream")

Publish = Callable[[str, bytes], Awaitable[None]]


class StreamState(enum.Enum):
    RUNNING = "running"  # command running or pipes still draining
    EXITED = "exited"  # exit frame published; waiting for its ack
    DONE = "done"  # exit acked or abandoned: forget it


class StreamingExec:
    """One streaming exec. ``run()`` drives it to the end; the other methods are client verbs."""

    def __init__(
        self,
        *,
        exec_id: str,
        proc: Process,
        deliver: str,
        publish: Publish,
        window: int,
        max_chunk: int,
        timeout: float | None,
        abandon_after: float,
        pipe_grace: float,
        initial_stdin: bytes | None = None,
        keep_stdin_open: bool = False,
    ) -> None:
        self.exec_id = exec_id
        self.proc = proc
        self.deliver = deliver
        self._publish = publish
        self.window = window
        self._max_chunk = max_chunk
        self._timeout = timeout
        self._abandon_after = abandon_after
        self._pipe_grace = pipe_grace
        self.state = StreamState.RUNNING
        self.next_seq = 1
        self.acked_seq = 0
        self._retained: collections.deque[tuple[int, bytes, int]] = collections.deque()
        self._in_flight = 0  # published, not yet acked
        self._reserved = 0  # being read by a pump right now
        self._starved = 0  # pumps waiting for window credit
        self._initial_stdin = initial_stdin
        self._keep_stdin_open = keep_stdin_open
        self.abandon_after = abandon_after
        self._credit = asyncio.Event()
        self._credit.set()
        self._heard = time.monotonic()
        self._acked_exit = asyncio.Event()
        self._stdin_lock = asyncio.Lock()
        self._sizes = {"stdout": 0, "stderr": 0}
        self.timed_out = self.cancelled = self.abandoned = False
        self._given_up = False  # the client was silent too long: stop draining pipes for it
        self._stopping = False  # execd is shutting down: publish the exit, wait for no ack

    # -- driving -------------------------------------------------------------------------------

    async def run(self) -> None:
        """Pump output, enforce timeout and abandonment, publish the exit, wait for its ack."""
        pumps = [
            asyncio.create_task(self._pump(self.proc.stdout, "stdout"), name="pump:stdout"),
            asyncio.create_task(self._pump(self.proc.stderr, "stderr"), name="pump:stderr"),
        ]
        watchdog = asyncio.create_task(self._watchdog(), name="watchdog")
        # Initial stdin is fed concurrently with the pumps: a command that echoes it back
        # (cat) must be able to write while we are still writing to it.
        feeder = asyncio.create_task(self._feed_initial_stdin(), name="stdin")
        try:
            await self.proc.wait()
            await self._finish_pumps(pumps)
            await self._publish_exit()
            if not self._stopping:
                await self._acked_exit.wait()
        finally:
            for task in (*pumps, watchdog, feeder):
                task.cancel()
            await asyncio.gather(*pumps, watchdog, feeder, return_exceptions=True)
            if self.proc.running:
                self.proc.kill_tree()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(self.proc.wait())
            self.proc.close_pipes()
            self.state = StreamState.DONE

    async def _finish_pumps(self, pumps: list[asyncio.Task[None]]) -> None:
        """After exit: read the pipes to EOF while the client keeps acking.

        Stops early when the client went silent, or when no pump is waiting for window credit
        yet they see no EOF for ``pipe_grace`` (a grandchild holds the pipe open; its later output
        is not ours).
        """
        pending: set[asyncio.Task[None]] = set(pumps)
        while pending and not self._given_up:
            _, pending = await asyncio.wait(pending, timeout=self._pipe_grace)
            if pending and self._starved == 0:
                return  # no pump waits for the client: they wait for a pipe nobody closes

    async def _feed_initial_stdin(self) -> None:
        stdin = self.proc.stdin
        if stdin is None:
            return
        if self._initial_stdin:
            try:
                await self.write_stdin(self._initial_stdin, eof=not self._keep_stdin_open)
            except StreamClosed:
                return
        elif not self._keep_stdin_open:
            stdin.close()

    def _update_credit(self) -> None:
        if self._in_flight + self._reserved < self.window:
            self._credit.set()
        else:
            self._credit.clear()

    async def _pump(self, reader: PipeReader, stream: StreamName) -> None:
        while True:
            if not self._credit.is_set():
                self._starved += 1
                try:
                    await self._credit.wait()
                finally:
                    self._starved -= 1
            room = min(self._max_chunk, self.window - self._in_flight - self._reserved)
            if room <= 0:
                self._update_credit()
                continue
            self._reserved += room
            self._update_credit()
            try:
                data = await reader.read(room)
            finally:
                self._reserved -= room
                self._update_credit()
            if not data:
                return
            self._sizes[stream] += len(data)
            frame = OutputChunk(exec_id=self.exec_id, seq=self.next_seq, stream=stream, data=data)
            await self._emit(encode(frame), len(data))

    async def _emit(self, payload: bytes, nbytes: int) -> None:
        seq = self.next_seq
        self.next_seq += 1
        self._retained.append((seq, payload, nbytes))
        self._in_flight += nbytes
        self._update_credit()
        try:
            await self._publish(self.deliver, payload)
        except ConnectionLost:
            log.info("frame_publish_failed", exec_id=self.exec_id, seq=seq)  # resume re-sends it

    async def _publish_exit(self) -> None:
        exit_code, sig = status_fields(
            self.proc.returncode if self.proc.returncode is not None else -9
        )
        frame = ExecExit(
            exec_id=self.exec_id,
            seq=self.next_seq,
            exit_code=exit_code,
            signal=sig,
            timed_out=self.timed_out,
            cancelled=self.cancelled,
            abandoned=self.abandoned,
            duration=time.monotonic() - self.proc.started,
            stdout_size=self._sizes["stdout"],
            stderr_size=self._sizes["stderr"],
        )
        self.state = StreamState.EXITED
        await self._emit(encode(frame), 0)

    async def _watchdog(self) -> None:
        """Kill on timeout; kill (or, after exit, forget) when the client is silent too long."""
        deadline = self.proc.started + self._timeout if self._timeout else None
        while True:
            now = time.monotonic()
            silent_until = self._heard + self._abandon_after
            wake = min(silent_until, deadline) if deadline and self.proc.running else silent_until
            await asyncio.sleep(max(wake - now, 0.01))
            now = time.monotonic()
            if deadline and self.proc.running and now >= deadline:
                self.timed_out = True
                log.info("exec_timed_out", exec_id=self.exec_id)
                self.proc.kill_tree()
                deadline = None
            if now >= self._heard + self._abandon_after:
                if self.state is not StreamState.RUNNING:
                    self._acked_exit.set()  # nobody is listening: let it go
                    return
                # Still running, or dead with pumps waiting for credit the client never gives:
                # stop draining either way, so the stream ends instead of waiting forever.
                self._given_up = True
                if self.proc.running:
                    self.abandoned = True
                    log.warning("exec_abandoned", exec_id=self.exec_id, silent=self._abandon_after)
                    self.proc.kill_tree()
                self._heard = now  # give the exit frame its own abandon period

    def shut_down(self) -> None:
        """execd is stopping: end this stream as soon as only delivery is left.

        A command still running is in-flight work: its output is still pumped (the service's
        grace period bounds it), and once it exits the exit frame is published but its ack not
        waited for. A command that has already exited leaves only delivery, to a client that
        may be gone for good (a bare iteration left early cancels and unsubscribes, and never
        acks): its pipes are no longer drained for credit nobody may give, the exit frame goes
        out and the stream ends, instead of holding shutdown for the whole grace period.
        """
        self._stopping = True
        if not self.proc.running:
            self._given_up = True
        if self.state is StreamState.EXITED:
            self._acked_exit.set()

    # -- client verbs --------------------------------------------------------------------------

    @property
    def released(self) -> bool:
        """The exit frame was acked (or the silent client given up on): from then on the client
        verbs find no stream, the same at once as after ``run()`` returns (README, step 5)."""
        return self._acked_exit.is_set()

    def touch(self) -> None:
        self._heard = time.monotonic()

    def ack(self, seq: int) -> None:
        """Release every retained frame up to ``seq`` and refill the window."""
        self.touch()
        if seq <= self.acked_seq:
            return
        self.acked_seq = min(seq, self.next_seq - 1)
        while self._retained and self._retained[0][0] <= self.acked_seq:
            _, _, nbytes = self._retained.popleft()
            self._in_flight -= nbytes
        self._update_credit()
        if self.state is StreamState.EXITED and not self._retained:
            self._acked_exit.set()

    async def resume(self, from_seq: int, deliver: str | None) -> None:
        """Re-publish retained frames with ``seq >= from_seq`` (to a new subject if given).

        Raises:
            BadRequest: ``from_seq`` was already acknowledged and released.
        """
        self.touch()
        if deliver:
            self.deliver = deliver
        if from_seq <= self.acked_seq:
            raise BadRequest(
                f"frames up to {self.acked_seq} were acknowledged and released; "
                f"resume from {self.acked_seq + 1} or later",
                acked_seq=self.acked_seq,
            )
        for seq, payload, _ in list(self._retained):
            if seq >= from_seq:
                with contextlib.suppress(ConnectionLost):
                    await self._publish(self.deliver, payload)

    async def write_stdin(self, data: bytes, eof: bool) -> None:
        """Write to stdin (returns once in the pipe), then close it if ``eof``.

        Raises:
            StreamClosed: stdin was not opened, or is already closed, or the command exited.
        """
        self.touch()
        async with self._stdin_lock:
            stdin = self.proc.stdin
            if stdin is None or stdin.closed:
                raise StreamClosed("stdin is closed (already at EOF, or never opened)")
            try:
                if data:
                    await stdin.write(data)
            except (BrokenPipeError, ConnectionResetError) as exc:
                stdin.close()
                raise StreamClosed("the command closed its stdin or exited") from exc
            if eof:
                stdin.close()

    def send_signal(self, sig: int) -> None:
        self.touch()
        if self.proc.running:
            self.proc.signal_group(sig)

    def cancel(self) -> None:
        self.touch()
        if self.proc.running:
            self.cancelled = True
            self.proc.kill_tree()

    def status(self) -> ExecStatus:
        """Where the exec stands: ``exited`` (with how) as soon as the process has exited.

        The stream's own state lags behind: after the exit it may still drain pipes, or hold
        frames (the exit frame among them) for a client whose window is full, until acked or
        abandoned. Whoever asks ``exec.status`` wants to know about the command, not delivery.
        """
        code = self.proc.returncode
        exited = code is not None or self.state is not StreamState.RUNNING
        exit_code, sig = status_fields(code) if code is not None else (None, None)
        return ExecStatus(
            exec_id=self.exec_id,
            state="exited" if exited else "running",
            pid=self.proc.pid,
            next_seq=self.next_seq,
            acked_seq=self.acked_seq,
            exit_code=exit_code,
            signal=sig,
        )


def validate_signal(sig: int) -> int:
    """Return ``sig`` if this host knows it, else raise BadRequest."""
    try:
        signal.Signals(sig)
    except ValueError as exc:
        raise BadRequest(f"unknown signal {sig}", signal=sig) from exc
    return sig
