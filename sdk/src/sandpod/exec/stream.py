"""The streaming exec: :class:`AsyncExecStream`, a running command whose output is iterated.

The protocol (ordering, resume, acks, keepalive, liveness probes, watched stdin, cancel) is the
protocol client's :class:`sandpod_client.ExecStream`, shared with the gateway; this module is
the SDK's shape of it: call forms (``exec_stream(cwd, command)``), :class:`OutputChunk` and
:class:`ExitStatus` results, ``async with`` / ``async for`` ownership of the remote command.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Self

from sandpod._iteration import items_then
from sandpod.exec.args import Command, split_command
from sandpod.exec.types import ExitStatus, OutputChunk
from sandpod_client import ExecStream
from sandpod_client.stream import STDIN_CHUNK
from sandpod_contract.errors import StreamClosed
from sandpod_contract.messages.exec import ExecExit

if TYPE_CHECKING:
    from sandpod.channel import Channel

__all__ = ["STDIN_CHUNK", "AsyncExecStream"]


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
        self._stream = ExecStream(
            sandbox,
            argv=argv,
            shell=shell,
            cwd=cwd,
            env=env,
            stdin=stdin.encode() if isinstance(stdin, str) else stdin,
            stdin_open=stdin_open,
            timeout=timeout,
            window=window,
            abandon_after=abandon_after,
            probe_interval=probe_interval,
        )
        self._exit: ExitStatus | None = None
        self._closed = False
        self._managed = False  # inside ``async with``: the block, not an iteration, closes it

    @property
    def exec_id(self) -> str:
        return self._stream.exec_id

    @property
    def pid(self) -> int | None:
        """The command's pid in the sandbox, once started."""
        return self._stream.pid

    @property
    def exit(self) -> ExitStatus | None:
        """The exit status once the stream ended, else ``None``."""
        return self._exit

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> Self:
        """Start the command (implicit on first iteration or ``async with``)."""
        await self._stream.start()
        return self

    async def close(self) -> None:
        """Stop listening; if the command still runs, cancel it. Idempotent."""
        self._closed = True
        await self._stream.close()

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

    # -- output --------------------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[OutputChunk]:
        """The chunks until the exit; a generator, so leaving the loop early runs its cleanup
        (at once on ``aclose``, else when the loop collects the abandoned generator)."""
        return items_then(self.__anext__, self._iteration_ended)

    async def __anext__(self) -> OutputChunk:
        if self._exit is not None or self._closed:
            raise StopAsyncIteration
        frame = await self._stream.next_frame()
        if isinstance(frame, ExecExit):
            self._exit = _exit_status(frame)
            raise StopAsyncIteration
        return OutputChunk(stream=frame.stream, data=frame.data, seq=frame.seq)

    async def wait(self) -> ExitStatus:
        """Consume (and discard) remaining output, then return the exit status.

        Raises:
            StreamClosed: the stream was closed before its command exited.
        """
        async for _ in self:
            pass
        if self._exit is None:
            raise StreamClosed(f"stream {self.exec_id} was closed before it exited")
        return self._exit

    # -- control -------------------------------------------------------------------------------

    async def write(self, data: bytes | str) -> None:
        """Write to stdin (needs ``stdin_open=True``); returns once execd put it in the pipe.

        Raises:
            StreamClosed: the command exited or closed its stdin.
            SandboxUnavailable, ExecLost: execd died or was replaced during the write.
        """
        await self._stream.write(data.encode() if isinstance(data, str) else data)

    async def close_stdin(self) -> None:
        """Send EOF on stdin."""
        await self._stream.stdin(b"", eof=True)

    async def _feed_all(self, data: bytes) -> None:
        await self.write(data)
        await self.close_stdin()

    async def signal(self, sig: int) -> None:
        """Send signal ``sig`` to the command's process group."""
        await self._stream.signal(sig)

    async def cancel(self) -> None:
        """Kill the command's whole tree; the stream then ends with ``cancelled=True``."""
        await self._stream.cancel()


def _exit_status(frame: ExecExit) -> ExitStatus:
    return ExitStatus(
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
