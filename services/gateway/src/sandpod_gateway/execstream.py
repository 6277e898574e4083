"""A streaming exec seen from the gateway: the client side of the ``exec.start`` protocol.

``ExecStream.open`` subscribes to a fresh inbox and sends ``exec.start`` (so a bad command or a
missing sandbox fails before any HTTP body is sent); iterating yields chunks and finally the exit
frame, in ``seq`` order. Frames are acknowledged as they are consumed, so execd never has more
than its window of bytes in flight towards a slow HTTP client: the command blocks instead of
the gateway buffering. ``keepalive()`` re-acks periodically so execd does not abandon a command
whose client is merely slow; ``close()`` cancels a command whose client went away.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

from sandpod_bus import Inbound, Subscription
from sandpod_contract.codec import decode_map, unpack
from sandpod_contract.errors import ExecLost, SandpodError
from sandpod_contract.messages.exec import (
    ExecExit,
    ExecRef,
    ExecResume,
    ExecStart,
    ExecStarted,
    ExecStatus,
    OutputChunk,
    StdinWrite,
    StreamAck,
)
from sandpod_gateway.upstream import Target

__all__ = ["ExecStream"]

FRAME_QUEUE = 1024  # frames; execd's window bounds the bytes behind them
CONTROL_TIMEOUT = 10.0
DRAIN_TIMEOUT = 5.0  # a cancelled command's last frames, acknowledged unread on close


class ExecStream:
    def __init__(self, target: Target, sub: Subscription, queue: asyncio.Queue[bytes]) -> None:
        self.target = target
        self._sub = sub
        self._queue = queue
        self.exec_id = ""
        self.window = 1
        self.abandon_after = 60.0
        self.exit: ExecExit | None = None
        self._expected = 1
        self._acked = 0
        self._unacked = 0

    @classmethod
    async def open(cls, target: Target, **params: Any) -> ExecStream:
        """Start the command. Raises the typed error execd answers (command not found, ...)."""
        queue: asyncio.Queue[bytes] = asyncio.Queue(FRAME_QUEUE)

        async def on_frame(msg: Inbound) -> None:
            await queue.put(msg.data)

        inbox = target.upstream.bus.new_inbox()
        sub = await target.upstream.bus.subscribe(inbox, on_frame, pending_msgs=FRAME_QUEUE)
        stream = cls(target, sub, queue)
        params.setdefault("exec_id", f"gw-{uuid.uuid4().hex[:16]}")
        try:
            started = await target.call(
                "exec", "start", ExecStart(deliver=inbox, **params), ExecStarted
            )
        except BaseException:
            await sub.stop()
            raise
        stream.exec_id, stream.window = started.exec_id, started.window
        stream.abandon_after = started.abandon_after or stream.abandon_after
        return stream

    async def frames(self) -> AsyncIterator[OutputChunk | ExecExit]:
        """Chunks in order, then the exit frame (then the iterator ends)."""
        while self.exit is None:
            try:
                raw = await asyncio.wait_for(self._queue.get(), self.abandon_after)
            except TimeoutError:
                await self._check_alive()
                continue
            frame = self._decode(raw)
            if frame is None or frame.seq < self._expected:
                continue  # unknown kind, or a duplicate after a resume
            if frame.seq > self._expected:  # lost frames (slow-consumer drop): ask again
                await self._resume()
                continue
            self._expected += 1
            if isinstance(frame, ExecExit):
                self.exit = frame
                await self._ack(frame.seq, force=True)
            else:
                yield frame
                self._unacked += len(frame.data)
                await self._ack(frame.seq)
                continue
            yield frame

    def _decode(self, raw: bytes) -> OutputChunk | ExecExit | None:
        data = unpack(raw)
        kind = data.get("kind") if isinstance(data, dict) else None
        if kind == "chunk":
            return decode_map(OutputChunk, data)
        if kind == "exit":
            return decode_map(ExecExit, data)
        return None

    async def _ack(self, seq: int, force: bool = False) -> None:
        self._acked = seq
        if force or self._unacked >= max(self.window // 4, 1):
            self._unacked = 0
            await self.target.publish("exec", "ack", StreamAck(exec_id=self.exec_id, seq=seq))

    async def _resume(self) -> None:
        req = ExecResume(exec_id=self.exec_id, from_seq=self._expected)
        await self.target.call("exec", "resume", req, ExecStatus, CONTROL_TIMEOUT)

    async def _check_alive(self) -> None:
        try:
            await self.target.call(
                "exec", "status", ExecRef(exec_id=self.exec_id), ExecStatus, CONTROL_TIMEOUT
            )
        except SandpodError as exc:
            raise ExecLost(f"exec {self.exec_id} is gone ({exc.code})") from exc

    async def keepalive(self) -> None:
        """Re-ack what was consumed, often enough that execd never abandons a live client."""
        while self.exit is None:
            await asyncio.sleep(max(self.abandon_after / 4, 0.05))
            with contextlib.suppress(SandpodError):
                await self.target.publish(
                    "exec", "ack", StreamAck(exec_id=self.exec_id, seq=self._acked)
                )

    async def stdin(self, data: bytes, eof: bool = False) -> None:
        """Write to stdin; returns once the bytes are in the command's pipe."""
        req = StdinWrite(exec_id=self.exec_id, data=data, eof=eof)
        await self.target.call("exec", "stdin", req, ExecStatus, CONTROL_TIMEOUT)

    async def close(self) -> None:
        """Unsubscribe; a command still running (its client left) is cancelled, and what it
        still sends is acknowledged unread until its exit frame, so execd frees the frames it
        retains for us at once instead of holding a full window until it gives up on us."""
        if self.exit is None and self.exec_id:
            try:
                await self.target.call(
                    "exec", "cancel", ExecRef(exec_id=self.exec_id), ExecStatus, CONTROL_TIMEOUT
                )
            except SandpodError:
                pass
            else:
                with contextlib.suppress(SandpodError, TimeoutError):
                    await asyncio.wait_for(self._discard_until_exit(), DRAIN_TIMEOUT)
        await self._sub.stop()
        while not self._queue.empty():  # drop what is queued now, not when we are collected
            self._queue.get_nowait()

    async def _discard_until_exit(self) -> None:
        """Ack every frame (the highest seq releases all below it) until the exit frame."""
        last = self._acked
        while True:
            raw = await self._queue.get()
            frame = self._decode(raw)
            if frame is None or frame.seq <= last:
                continue
            last = frame.seq
            if isinstance(frame, ExecExit) or self._queue.empty():
                await self.target.publish("exec", "ack", StreamAck(exec_id=self.exec_id, seq=last))
            if isinstance(frame, ExecExit):
                return
