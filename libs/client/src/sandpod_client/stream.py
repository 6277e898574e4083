"""The streaming exec's client side: :class:`ExecStream`, a running command's frames in order.

Data flow: :meth:`~ExecStream.start` subscribes a private inbox and sends ``exec.start`` naming
it (so a bad command or a missing sandbox fails before the caller commits to anything); execd
publishes numbered output frames there, then an exit frame. ``_on_frame`` keeps them in order (a
duplicate after a resume is dropped; a gap, frames lost across a reconnect or to a slow
consumer, asks ``exec.resume`` to resend from the first missing one) and queues them for
:meth:`~ExecStream.next_frame`, which acks what was consumed with ``exec.ack`` once a quarter of
the window is unacked (execd's flow control: a slow reader slows the command, nobody buffers
more than the window). A keepalive task owned by the stream acks periodically so execd does not
abandon a slow reader, and a reader left waiting for a frame probes execd with ``exec.resume``
so that a dead execd is a typed error, not a hang. Stdin goes the other way as ``exec.stdin``
requests, each watched with ``exec.status`` probes. :meth:`~ExecStream.close` cancels a command
still running and acks its last frames unread, so execd frees them at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence

from sandpod_bus import Inbound, Subscription
from sandpod_client.channel import (
    CONTROL_TIMEOUT,
    NO_DEADLINE,
    Link,
    status_probe,
    subscribe_inbox,
)
from sandpod_client.liveness import MAX_MISSED, PROBE_INTERVAL, watch
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
    OutputChunk,
    StdinWrite,
    StreamAck,
)

__all__ = ["STDIN_CHUNK", "ExecStream", "Frame"]

log = logging.getLogger("sandpod.client")

Frame = OutputChunk | ExecExit
STDIN_CHUNK = 256 * 1024
FRAME_QUEUE = 4096  # frames; execd's window bounds the bytes behind them
PENDING_BYTES = 256 * 1024 * 1024  # the inbox subscription's cap (a window is far less)
DRAIN_TIMEOUT = 5.0  # a cancelled command's last frames, acknowledged unread on close
LOST_CONNECTION_PROBES = 30  # probes that may find the connection down before giving up


class ExecStream:
    """One streaming exec: :meth:`start`, then :meth:`next_frame` (or ``frames()``) until the
    exit frame; :meth:`close` always (idempotent; cancels a command still running)."""

    def __init__(
        self,
        ch: Link,
        *,
        argv: Sequence[str] | None = None,
        shell: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        stdin_open: bool = False,
        timeout: float | None = None,
        window: int | None = None,
        abandon_after: float | None = None,
        exec_id: str | None = None,
        probe_interval: float = PROBE_INTERVAL,
    ) -> None:
        self._ch = ch
        self.exec_id = exec_id or uuid.uuid4().hex
        self._params = {
            "argv": tuple(argv) if argv is not None else None,
            "shell": shell,
            "cwd": cwd,
            "env": dict(env) if env else None,
            "stdin": stdin,
            "stdin_open": stdin_open,
            "timeout": timeout,
            "window": window,
            "abandon_after": abandon_after,
        }
        self.abandon_after = abandon_after or 60.0
        self.probe_interval = probe_interval
        self.window = 1
        self.pid: int | None = None
        self.exit: ExecExit | None = None
        self._inbox = ""
        self._frames: asyncio.Queue[Frame] = asyncio.Queue(FRAME_QUEUE)
        self._expected = 1
        self._consumed = 0  # highest seq handed out
        self._unacked_bytes = 0
        self._resume_asked_for = 0
        self._sub: Subscription | None = None
        self._keepalive: asyncio.Task[None] | None = None
        self._started = False
        self._closed = False
        self._close_done = asyncio.Event()  # set once the first ``close`` has finished

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the command (idempotent). Raises the typed error execd answers."""
        if self._started:
            return
        self._started = True
        self._inbox, self._sub = await subscribe_inbox(
            self._ch, self._on_frame, pending_msgs=FRAME_QUEUE, pending_bytes=PENDING_BYTES
        )
        req = ExecStart(deliver=self._inbox, exec_id=self.exec_id, **self._params)  # type: ignore[arg-type]
        try:
            started = await self._ch.call("exec", "start", req, ExecStarted, CONTROL_TIMEOUT)
        except BaseException:
            await self._sub.stop()
            raise
        self.pid = started.pid
        self.window = max(started.window, 1)
        self.abandon_after = started.abandon_after or self.abandon_after
        self._keepalive = asyncio.create_task(self._keep_alive(), name=f"keepalive:{self.exec_id}")

    async def close(self, *, drain: bool = False) -> None:
        """Stop listening; a command still running is cancelled. Idempotent.

        ``drain``: also ack what the cancelled command still sends, unread, until its exit
        frame (bounded by ``DRAIN_TIMEOUT``), so execd frees the frames it retains for us at
        once instead of holding a full window until it gives up on us (a gateway serving many
        clients wants that; a single SDK caller need not wait for it).

        A call made while another is under way returns when that one has finished: a bare
        SDK iteration left early is closed in the task the event loop starts to finalize the
        generator, and this is how its caller waits for that cleanup (the cancel's round trip).
        """
        if self._closed:
            await self._close_done.wait()
            return
        self._closed = True
        try:
            await self._close(drain)
        finally:
            self._close_done.set()

    async def _close(self, drain: bool) -> None:
        await self._stop_keepalive()
        if self._started and self.exit is None and self._sub is not None:
            try:
                await self._ch.call(
                    "exec", "cancel", ExecRef(exec_id=self.exec_id), ExecStatus, CONTROL_TIMEOUT
                )
            except SandpodError:
                pass
            else:
                if drain:
                    await self._drain()
        if self._sub is not None:
            await self._sub.stop()
        while not self._frames.empty():  # drop what is queued now, not when we are collected
            self._frames.get_nowait()

    async def _drain(self) -> None:
        with contextlib.suppress(SandpodError, TimeoutError):
            await asyncio.wait_for(self._discard_until_exit(), DRAIN_TIMEOUT)

    async def _stop_keepalive(self) -> None:
        task, self._keepalive = self._keepalive, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _discard_until_exit(self) -> None:
        """Ack every frame (the highest seq releases all below it) until the exit frame."""
        while True:
            frame = await self._frames.get()
            self._consumed = frame.seq
            if isinstance(frame, ExecExit) or self._frames.empty():
                await self._ack(force=True)
            if isinstance(frame, ExecExit):
                return

    # -- frames --------------------------------------------------------------------------------

    async def _on_frame(self, msg: Inbound) -> None:
        try:
            raw = unpack(msg.data)
            kind = raw.get("kind") if isinstance(raw, dict) else None
            frame: Frame = (
                decode_map(ExecExit, raw) if kind == "exit" else decode_map(OutputChunk, raw)
            )
        except SandpodError as exc:
            log.warning("dropping malformed frame on %s: %s", msg.subject, exc)
            return
        if frame.exec_id != self.exec_id or frame.seq < self._expected:
            return  # a duplicate after a resume
        if frame.seq > self._expected:
            # Frames were lost (a reconnect, a slow consumer): ask for them again, once per gap.
            if self._resume_asked_for != self._expected:
                with contextlib.suppress(SandpodError):
                    await self._ask_resume()
            return
        self._expected += 1
        await self._frames.put(frame)  # full: the subscription waits, execd's window fills

    async def _ask_resume(self) -> ExecStatus:
        self._resume_asked_for = self._expected
        req = ExecResume(exec_id=self.exec_id, from_seq=self._expected, deliver=self._inbox)
        return await self._ch.call("exec", "resume", req, ExecStatus, CONTROL_TIMEOUT)

    async def _probe(self) -> None:
        try:
            await self._ask_resume()
        except ExecNotFound as exc:
            raise ExecLost(f"execd no longer knows stream {self.exec_id}") from exc

    async def _keep_alive(self) -> None:
        """Tell execd we are alive (even while the reader is slow) so it does not abandon us."""
        interval = max(self.abandon_after / 4, 0.05)
        while True:
            await asyncio.sleep(interval)
            with contextlib.suppress(SandpodError):
                await self._ack(force=True)

    async def _ack(self, force: bool = False) -> None:
        if not force and self._unacked_bytes < max(self.window // 4, 1):
            return
        self._unacked_bytes = 0
        await self._ch.publish("exec", "ack", StreamAck(exec_id=self.exec_id, seq=self._consumed))

    async def _wait_frame(self) -> Frame:
        """The next frame in order, probing execd while none comes.

        Raises:
            SandboxUnavailable: execd is gone or did not answer ``MAX_MISSED`` probes.
            ExecLost: another execd answers and does not know the stream.
            ConnectionLost: the connection stayed down for ``LOST_CONNECTION_PROBES`` probes.
        """
        missed = lost = 0
        while True:
            try:
                return await asyncio.wait_for(self._frames.get(), self.probe_interval)
            except TimeoutError:
                pass
            try:
                await self._probe()
                missed = lost = 0
            except SandboxNotFound as exc:
                raise SandboxUnavailable("execd stopped answering during the stream") from exc
            except RequestTimeout as exc:
                missed += 1
                if missed >= MAX_MISSED:
                    raise SandboxUnavailable(
                        f"execd did not answer {MAX_MISSED} liveness probes"
                    ) from exc
            except ConnectionLost:
                lost += 1
                if lost >= LOST_CONNECTION_PROBES:
                    raise

    async def next_frame(self) -> Frame:
        """The next chunk, or the exit frame (after which the stream has ended).

        Raises:
            StreamClosed: the stream already ended or was closed.
            SandboxUnavailable, ExecLost, ConnectionLost: as :meth:`_wait_frame`.
        """
        if self.exit is not None or self._closed:
            raise StreamClosed(f"stream {self.exec_id} has ended")
        await self.start()
        frame = await self._wait_frame()
        self._consumed = frame.seq
        if isinstance(frame, ExecExit):
            self.exit = frame
            await self._stop_keepalive()
            with contextlib.suppress(SandpodError):
                await self._ack(force=True)
            return frame
        self._unacked_bytes += len(frame.data)
        await self._ack()
        return frame

    async def frames(self) -> AsyncIterator[Frame]:
        """The chunks in order, then the exit frame (then the iterator ends)."""
        while self.exit is None:
            yield await self.next_frame()

    # -- control -------------------------------------------------------------------------------

    async def write(self, data: bytes) -> None:
        """Write to stdin in ``STDIN_CHUNK`` requests; returns once execd put it in the pipe."""
        await self.start()
        for i in range(0, max(len(data), 1), STDIN_CHUNK):
            await self.stdin(data[i : i + STDIN_CHUNK], eof=False)

    async def stdin(self, data: bytes, eof: bool = False) -> None:
        """One ``exec.stdin`` request. It has no deadline (a command may leave its stdin full
        for as long as it likes), so execd's liveness is probed meanwhile.

        Raises:
            StreamClosed: the command exited or closed its stdin.
            SandboxUnavailable, ExecLost: execd died or was replaced during the write (also
                when it was gone before a chunk was sent: the exec was started, so it was
                there).
        """
        await self.start()
        req = StdinWrite(exec_id=self.exec_id, data=data, eof=eof)
        try:
            await watch(
                self._ch.call("exec", "stdin", req, ExecStatus, NO_DEADLINE),
                status_probe(self._ch, self.exec_id),
                what=f"a stdin write to exec {self.exec_id}",
                interval=self.probe_interval,
                exit_means_lost=False,
            )
        except ExecNotFound as exc:
            raise StreamClosed("the command has already exited") from exc
        except SandboxNotFound as exc:  # no execd for the next chunk: the one we had is gone
            raise SandboxUnavailable(
                f"execd stopped answering during a stdin write to exec {self.exec_id}"
            ) from exc

    async def signal(self, sig: int) -> None:
        """Send signal ``sig`` to the command's process group (a finished one: nothing)."""
        await self.start()
        req = ExecSignal(exec_id=self.exec_id, signal=int(sig))
        with contextlib.suppress(ExecNotFound):
            await self._ch.call("exec", "signal", req, ExecStatus, CONTROL_TIMEOUT)

    async def cancel(self) -> None:
        """Kill the command's whole tree; the stream then ends with ``cancelled=True``."""
        await self.start()
        with contextlib.suppress(ExecNotFound):
            await self._ch.call(
                "exec", "cancel", ExecRef(exec_id=self.exec_id), ExecStatus, CONTROL_TIMEOUT
            )
