"""Run a command to completion and capture its output (the ``exec.run`` domain logic).

Output is captured per stream up to ``max_output`` bytes; beyond that the pipe is still drained (so
the command never blocks on a full pipe) and only counted, and the result says it was truncated.
On timeout the whole tree is killed and the outcome says ``timed_out``. Once the command exits,
pipes held open by a grandchild are read for at most ``pipe_grace`` seconds more.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import time

from sandpod_execd.process import PipeReader, Process

__all__ = ["Capture", "Outcome", "run_to_completion", "status_fields"]

READ_SIZE = 256 * 1024


class Capture:
    """Bytes captured from one stream, up to a cap; counts what it had to drop."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.parts: list[bytes] = []
        self.kept = 0
        self.seen = 0

    def add(self, data: bytes) -> None:
        self.seen += len(data)
        room = self.cap - self.kept
        if room > 0:
            piece = data[:room]
            self.parts.append(piece)
            self.kept += len(piece)

    @property
    def truncated(self) -> bool:
        return self.seen > self.kept

    def value(self) -> bytes:
        if len(self.parts) > 1:
            self.parts = [b"".join(self.parts)]
        return self.parts[0] if self.parts else b""


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome:
    returncode: int
    timed_out: bool
    duration: float
    stdout: Capture
    stderr: Capture


def status_fields(returncode: int) -> tuple[int | None, int | None]:
    """(exit_code, signal) from a raw return code (negative = killed by signal)."""
    if returncode < 0:
        return None, -returncode
    return returncode, None


class _Collector:
    """Reads stdout and stderr from the loop's reader callbacks into their captures.

    No task per stream: a one-shot exec of a short command is dominated by per-request overhead,
    and two tasks plus the waits around them cost more than the command (measured with
    ``bench/exec_latency.py``). ``eof`` completes once every pipe reached end of file.
    """

    def __init__(self, pipes: list[tuple[PipeReader, Capture]]) -> None:
        self._loop = asyncio.get_running_loop()
        self._open: set[int] = set()
        self.eof: asyncio.Future[None] = self._loop.create_future()
        for reader, capture in pipes:
            self._open.add(reader.fd)
            self._loop.add_reader(reader.fd, self._readable, reader.fd, capture)
        if not self._open:
            self.eof.set_result(None)

    def _readable(self, fd: int, capture: Capture) -> None:
        try:
            data = os.read(fd, READ_SIZE)
        except BlockingIOError:
            return
        except OSError:  # the pipe broke: nothing more will come
            data = b""
        if data:
            capture.add(data)
            return
        self._loop.remove_reader(fd)
        self._open.discard(fd)
        if not self._open and not self.eof.done():
            self.eof.set_result(None)

    def stop(self) -> None:
        """Stop reading (pipes still open are abandoned to the caller, who closes them)."""
        for fd in self._open:
            self._loop.remove_reader(fd)
        self._open.clear()


async def _feed(proc: Process, data: bytes) -> None:
    if proc.stdin is None:  # started without a pipe: nothing to feed
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        await proc.stdin.write(data)
    proc.stdin.close()


async def run_to_completion(
    proc: Process,
    *,
    stdin: bytes | None,
    timeout: float | None,
    max_output: int,
    pipe_grace: float,
) -> Outcome:
    """Feed ``stdin``, capture output, enforce ``timeout``; always reaps and closes pipes."""
    loop = asyncio.get_running_loop()
    out, err = Capture(max_output), Capture(max_output)
    collector = _Collector([(proc.stdout, out), (proc.stderr, err)])
    feeder = None
    if proc.stdin is not None:
        feeder = asyncio.create_task(_feed(proc, stdin or b""), name=f"exec:{proc.pid}:in")
    timed_out = False

    def expire() -> None:
        nonlocal timed_out
        timed_out = True
        proc.kill_tree()

    timer = loop.call_later(timeout, expire) if timeout is not None else None
    try:
        await proc.wait()
        if timer is not None:
            timer.cancel()
        # Read what is left; a grandchild holding the pipes open gets pipe_grace seconds.
        if not collector.eof.done():
            await asyncio.wait({collector.eof}, timeout=pipe_grace)
            if not collector.eof.done() and timed_out:
                proc.kill_tree()
    finally:
        if timer is not None:
            timer.cancel()
        collector.stop()
        if feeder is not None:
            feeder.cancel()
            await asyncio.gather(feeder, return_exceptions=True)
        if proc.running:  # cancelled while running (execd stopping): leave nothing behind
            proc.kill_tree()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(proc.wait())
        proc.close_pipes()
    returncode = proc.returncode if proc.returncode is not None else -signal.SIGKILL
    return Outcome(
        returncode=returncode,
        timed_out=timed_out,
        duration=time.monotonic() - proc.started,
        stdout=out,
        stderr=err,
    )
