"""The streaming exec: :class:`AsyncExecStream`, a running command whose output is iterated.

Data flow: :meth:`~AsyncExecStream.start` subscribes a private inbox and sends ``exec.start``
naming it; execd publishes numbered output frames there, then an exit frame. ``_on_frame`` keeps
them in order (a duplicate after a resume is dropped; a gap, frames lost across a reconnect, asks
``exec.resume`` to resend from the first missing one) and queues them for the iteration, which
hands out :class:`OutputChunk` s, acks what it consumed with ``exec.ack`` once a quarter of the
window is unacked (execd's flow control) and records the exit. A keepalive task acks
periodically so execd does not abandon a slow reader, and a reader left waiting for a frame
probes execd with ``exec.resume`` so that a dead execd is a typed error, not a hang. Stdin goes
the other way as ``exec.stdin`` requests, each watched with ``exec.status`` probes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Self

from sandpod._iteration import items_then
from sandpod._watch import watch
from sandpod.exec.args import CONTROL_TIMEOUT, NO_DEADLINE, Command, exec_status, split_command
from sandpod.exec.types import ExitStatus, OutputChunk
from sandpod_bus import Inbound, Subscription
from sandpod_contract.codec import decode_map, unpack
from sandpod_contract.errors import (
    ConnectionLost,
    ExecLost,
    ExecNotFound,
    RequestTimeout,
    SandboxNotFound,
    SandboxUnavailable,
    SandpodError,
    StreamClosed,
)
from sandpod_contract.messages.exec import (
    ExecExit,
    ExecRef,
    ExecResume,
    ExecSignal,
    ExecStart,
    ExecStarted,
    ExecStatus,
    StdinWrite,
    StreamAck,
)
from sandpod_contract.messages.exec import (
    OutputChunk as WireChunk,
)

if TYPE_CHECKING:
    from sandpod.channel import Channel

__all__ = ["AsyncExecStream"]

log = logging.getLogger("sandpod")

STDIN_CHUNK = 256 * 1024


class AsyncExecStream:
    """A running streaming exec: async-iterate for output, then :meth:`wait` for the exit.

    Who owns the remote command: ``async with`` keeps it (and the keepalives that stop execd
    from abandoning it) until the block ends. Without ``async with``, the iteration owns it:
    leaving an ``async for`` early (``break``, an exception, the iterator collected) closes the
    stream, which cancels a command still running, so nothing keeps acking a stream nobody reads.
    """

    def __init__(
        self,
        sandbox: Channel,
        cwd: str | None,
        command: Command,
        *,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        stdin_open: bool = False,
        timeout: float | None = None,
        window: int | None = None,
        abandon_after: float | None = None,
        probe_interval: float = 1.0,
    ) -> None:
        argv, shell = split_command(command)
        self._sbx = sandbox
        self._bus = sandbox.bus
        self._exec_id = uuid.uuid4().hex
        self._inbox = self._bus.new_inbox()
        self._request = ExecStart(
            deliver=self._inbox,
            exec_id=self._exec_id,
            argv=argv,
            shell=shell,
            cwd=cwd,
            env=dict(env) if env else None,
            stdin=stdin.encode() if isinstance(stdin, str) else stdin,
            stdin_open=stdin_open,
            timeout=timeout,
            window=window,
            abandon_after=abandon_after,
        )
        self._abandon_after = abandon_after or 60.0
        self._probe_interval = probe_interval
        # Bounded by the protocol: execd never has more than `window` unacked bytes in flight.
        self._frames: asyncio.Queue[WireChunk | ExecExit | SandpodError] = asyncio.Queue()
        self._expected = 1
        self._consumed = 0  # highest seq handed to the user
        self._unacked_bytes = 0
        self._resume_asked_for = 0
        self._window = 0
        self._sub: Subscription | None = None
        self._keepalive: asyncio.Task[None] | None = None
        self._exit: ExitStatus | None = None
        self._started = False
        self._closed = False
        self._managed = False  # inside ``async with``: the block, not an iteration, closes it
        self.pid: int | None = None

    @property
    def exec_id(self) -> str:
        return self._exec_id

    @property
    def exit(self) -> ExitStatus | None:
        """The exit status once the stream ended, else ``None``."""
        return self._exit

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> Self:
        """Start the command (implicit on first iteration or ``async with``)."""
        if self._started:
            return self
        self._started = True
        self._sub = await self._bus.subscribe(
            self._inbox, self._on_frame, pending_msgs=1 << 20, pending_bytes=256 * 1024 * 1024
        )
        try:
            started = await self._sbx.call(
                "exec", "start", self._request, ExecStarted, CONTROL_TIMEOUT
            )
        except BaseException:
            await self._sub.stop()
            raise
        self.pid = started.pid
        self._window = started.window
        if started.abandon_after:
            self._abandon_after = started.abandon_after
        self._keepalive = asyncio.create_task(self._keep_alive(), name=f"keepalive:{self._exec_id}")
        return self

    async def close(self) -> None:
        """Stop listening; if the command still runs, cancel it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._keepalive is not None:
            self._keepalive.cancel()
            await asyncio.gather(self._keepalive, return_exceptions=True)
        if self._started and self._exit is None:
            with contextlib.suppress(SandpodError):
                await self.cancel()
        if self._sub is not None:
            await self._sub.stop()

    async def __aenter__(self) -> Self:
        self._managed = True
        return await self.start()

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _iteration_ended(self) -> None:
        """An iteration stopped (finished, broken out of, failed, collected): without a context
        manager to do it later, close now, cancelling a command that still runs."""
        if not self._managed:
            await self.close()

    # -- frames --------------------------------------------------------------------------------

    async def _on_frame(self, msg: Inbound) -> None:
        try:
            raw = unpack(msg.data)
            kind = raw.get("kind") if isinstance(raw, dict) else None
            frame: WireChunk | ExecExit = (
                decode_map(ExecExit, raw) if kind == "exit" else decode_map(WireChunk, raw)
            )
        except SandpodError as exc:
            log.warning("dropping malformed frame on %s: %s", msg.subject, exc)
            return
        if frame.exec_id != self._exec_id or frame.seq < self._expected:
            return  # a duplicate after a resume
        if frame.seq > self._expected:
            # Frames were lost (e.g. across a reconnect): ask for them again, once per gap.
            if self._resume_asked_for != self._expected:
                with contextlib.suppress(SandpodError):
                    await self._ask_resume()
            return
        self._expected += 1
        self._frames.put_nowait(frame)

    async def _ask_resume(self) -> ExecStatus:
        self._resume_asked_for = self._expected
        req = ExecResume(exec_id=self._exec_id, from_seq=self._expected, deliver=self._inbox)
        return await self._sbx.call("exec", "resume", req, ExecStatus, CONTROL_TIMEOUT)

    async def _probe(self) -> ExecStatus:
        try:
            return await self._ask_resume()
        except ExecNotFound as exc:
            if self._exit is None:
                raise ExecLost(f"execd no longer knows stream {self._exec_id}") from exc
            raise

    async def _keep_alive(self) -> None:
        """Tell execd we are alive (even while the user is slow) so it does not abandon us."""
        interval = max(self._abandon_after / 4, 0.05)
        while True:
            await asyncio.sleep(interval)
            with contextlib.suppress(SandpodError):
                await self._ack(force=True)

    async def _ack(self, force: bool = False) -> None:
        if not force and self._unacked_bytes < max(self._window // 4, 1):
            return
        self._unacked_bytes = 0
        msg = StreamAck(exec_id=self._exec_id, seq=self._consumed)
        await self._sbx.publish("exec", "ack", msg)

    async def _next_frame(self) -> WireChunk | ExecExit:
        missed = 0
        while True:
            try:
                item = await asyncio.wait_for(self._frames.get(), self._probe_interval)
            except TimeoutError:
                try:
                    await self._probe()
                    missed = 0
                except SandboxNotFound as exc:
                    raise SandboxUnavailable("execd stopped answering during the stream") from exc
                except RequestTimeout as exc:
                    missed += 1
                    if missed >= 3:
                        raise SandboxUnavailable("execd did not answer 3 liveness probes") from exc
                except ConnectionLost:
                    missed += 1
                    if missed >= 30:
                        raise
                continue
            if isinstance(item, SandpodError):
                raise item
            return item

    def __aiter__(self) -> AsyncIterator[OutputChunk]:
        """The chunks until the exit; a generator, so leaving the loop early runs its cleanup
        (at once on ``aclose``, else when the loop collects the abandoned generator)."""
        return items_then(self.__anext__, self._iteration_ended)

    async def __anext__(self) -> OutputChunk:
        if self._exit is not None or self._closed:
            raise StopAsyncIteration
        await self.start()
        frame = await self._next_frame()
        self._consumed = frame.seq
        if isinstance(frame, ExecExit):
            self._exit = ExitStatus(
                exec_id=frame.exec_id,
                exit_code=frame.exit_code,
                signal=frame.signal,
                timed_out=frame.timed_out,
                cancelled=frame.cancelled,
                abandoned=frame.abandoned,
                duration=frame.duration,
                stdout_size=frame.stdout_size,
                stderr_size=frame.stderr_size,
            )
            with contextlib.suppress(SandpodError):
                await self._ack(force=True)
            if self._keepalive is not None:
                self._keepalive.cancel()
            raise StopAsyncIteration
        self._unacked_bytes += len(frame.data)
        await self._ack()
        return OutputChunk(stream=frame.stream, data=frame.data, seq=frame.seq)

    async def wait(self) -> ExitStatus:
        """Consume (and discard) remaining output, then return the exit status."""
        async for _ in self:
            pass
        assert self._exit is not None
        return self._exit

    # -- control -------------------------------------------------------------------------------

    async def write(self, data: bytes | str) -> None:
        """Write to stdin (needs ``stdin_open=True``); returns once execd put it in the pipe."""
        await self.start()
        payload = data.encode() if isinstance(data, str) else data
        for i in range(0, max(len(payload), 1), STDIN_CHUNK):
            await self._stdin(payload[i : i + STDIN_CHUNK], eof=False)

    async def close_stdin(self) -> None:
        """Send EOF on stdin."""
        await self.start()
        await self._stdin(b"", eof=True)

    async def _feed_all(self, data: bytes) -> None:
        await self.write(data)
        await self.close_stdin()

    async def _stdin(self, data: bytes, eof: bool) -> None:
        """One ``exec.stdin`` request. It has no deadline (a command may leave its stdin full
        for as long as it likes), so execd's liveness is probed meanwhile: a dead execd is a
        typed error, not a write that hangs forever.

        Raises:
            StreamClosed: the command exited or closed its stdin.
            SandboxUnavailable, ExecLost: execd died or was replaced during the write.
        """
        req = StdinWrite(exec_id=self._exec_id, data=data, eof=eof)
        try:
            await watch(
                self._sbx.call("exec", "stdin", req, ExecStatus, NO_DEADLINE),
                lambda: exec_status(self._sbx, self._exec_id),
                what=f"a stdin write to exec {self._exec_id}",
                interval=self._probe_interval,
                exit_means_lost=False,
            )
        except ExecNotFound as exc:
            raise StreamClosed("the command has already exited") from exc

    async def signal(self, sig: int) -> None:
        """Send signal ``sig`` to the command's process group."""
        await self.start()
        req = ExecSignal(exec_id=self._exec_id, signal=int(sig))
        with contextlib.suppress(ExecNotFound):
            await self._sbx.call("exec", "signal", req, ExecStatus, CONTROL_TIMEOUT)

    async def cancel(self) -> None:
        """Kill the command's whole tree; the stream then ends with ``cancelled=True``."""
        await self.start()
        req = ExecRef(exec_id=self._exec_id)
        with contextlib.suppress(ExecNotFound):
            await self._sbx.call("exec", "cancel", req, ExecStatus, CONTROL_TIMEOUT)
