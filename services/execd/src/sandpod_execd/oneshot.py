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


async def _drain(reader: PipeReader, capture: Capture) -> None:
    while data := await reader.read(READ_SIZE):
        capture.add(data)


async def _feed(proc: Process, data: bytes) -> None:
    assert proc.stdin is not None
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
    out, err = Capture(max_output), Capture(max_output)
    io_tasks = [
        asyncio.create_task(_drain(proc.stdout, out), name=f"exec:{proc.pid}:stdout"),
        asyncio.create_task(_drain(proc.stderr, err), name=f"exec:{proc.pid}:stderr"),
    ]
    if proc.stdin is not None:
        io_tasks.append(asyncio.create_task(_feed(proc, stdin or b""), name=f"exec:{proc.pid}:in"))
    timed_out = False
    try:
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            timed_out = True
            proc.kill_tree()
            await proc.wait()
        # Read what is left; a grandchild holding the pipes open gets pipe_grace seconds.
        _, pending = await asyncio.wait(io_tasks, timeout=pipe_grace)
        if pending and timed_out:
            proc.kill_tree()
    finally:
        for task in io_tasks:
            task.cancel()
        await asyncio.gather(*io_tasks, return_exceptions=True)
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
