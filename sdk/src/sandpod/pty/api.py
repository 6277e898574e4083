"""The async client of pseudo-terminals (``sbx.pty``); the blocking twins are in ``sync``.

``await sbx.pty.open()`` starts the sandbox's login shell (or a command) on a terminal and returns
an :class:`AsyncPty` viewer. Output is pulled: each viewer keeps its own cursor and long-polls
``pty.read`` for what comes after it, so several viewers (in one process or many) see the same
bytes, and ``sbx.pty.connect(pty_id)`` re-attaches from cursor 0 to replay what execd still keeps
(its replay buffer, 1 MiB by default). A viewer further behind than the buffer gets
``PtyOutput.skipped > 0`` and continues from the oldest kept byte; the program itself never
waits for viewers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self, TypeVar

from sandpod.channel import CONTROL_TIMEOUT
from sandpod.pty.types import PtyExit, PtyInfo, PtyOutput, _info
from sandpod_contract.codec import Message
from sandpod_contract.errors import BadRequest, PtyClosed, PtyNotFound
from sandpod_contract.messages import pty as wire
from sandpod_contract.messages.common import Empty

if TYPE_CHECKING:
    from sandpod.channel import Channel

__all__ = ["AsyncPty", "AsyncPtys"]

M = TypeVar("M", bound=Message)
LONG_POLL = 25.0  # seconds a read waits for output; the request deadline adds READ_SLACK
READ_SLACK = 10.0
INPUT_CHUNK = 32 * 1024  # well under any execd request limit (sys.info max_request_bytes)


def _build(cls: type[M], **fields: Any) -> M:
    """Build a request, turning a refused value into the typed error execd would send."""
    try:
        return cls(**fields)
    except (ValueError, TypeError) as exc:
        raise BadRequest(f"{cls.TYPE}: {exc}") from exc


def _raise_if_cancelled() -> None:
    """Re-raise a cancellation that Python 3.11's ``wait_for`` swallowed because the reply
    arrived at the same moment (it returns the reply then); else a cancelled viewer loop would
    park one more long poll."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class AsyncPtys:
    """``sbx.pty``: open, re-attach to, list and close pseudo-terminals."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel

    async def _call(self, verb: str, msg: Message, reply: type[M], timeout: float) -> M:
        return await self._channel.call("pty", verb, msg, reply, timeout)

    async def open(
        self,
        command: str | Sequence[str] | None = None,
        *,
        cols: int = 80,
        rows: int = 24,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        pty_id: str | None = None,
        buffer_bytes: int | None = None,
        abandon_after: float | None = None,
    ) -> AsyncPty:
        """Start a program on a new terminal and return a viewer on it (cursor 0).

        Args:
            command: a shell string, an argv sequence, or ``None`` for the sandbox's
                interactive login shell.
            cols, rows: window size (1..4096).
            cwd: working directory (default: the workspace).
            env: variables added to the sandbox's environment (``TERM`` is ``xterm-256color``
                unless given here).
            pty_id: your own id (``[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}``), e.g. to re-attach
                from another process; default: a random one.
            buffer_bytes: replay buffer size (execd clamps it to 256 KiB..4 MiB; default 1 MiB).
            abandon_after: kill the terminal's tree when no request names it for this many
                seconds (reads count: an attached viewer keeps it alive). Default: never.

        Returns:
            An :class:`AsyncPty`; ``async with`` it to close the terminal at the end.

        Raises:
            PtyIdInUse: ``pty_id`` names an existing terminal.
            CommandNotFound, InvalidCwd, SpawnFailed: the program could not start.
            Busy: the sandbox has its maximum number of terminals running.
            BadRequest: invalid arguments.
        """
        argv: tuple[str, ...] | None = None
        shell: str | None = None
        if isinstance(command, str):
            shell = command
        elif command is not None:
            argv = tuple(command)
        req = _build(
            wire.PtyOpen,
            pty_id=pty_id,
            argv=argv,
            shell=shell,
            cwd=cwd,
            env=dict(env) if env else None,
            cols=cols,
            rows=rows,
            buffer_bytes=buffer_bytes,
            abandon_after=abandon_after,
        )
        info = _info(await self._call("open", req, wire.PtyInfo, CONTROL_TIMEOUT))
        return AsyncPty(self, info, owned=True)

    async def connect(self, pty_id: str, *, cursor: int | None = 0) -> AsyncPty:
        """A new viewer on an existing terminal, reading from ``cursor`` (0: replay what is
        kept; ``None``: only output from now on). Closing this viewer does not close the
        terminal. Raises PtyNotFound."""
        info = await self.get(pty_id)
        term = AsyncPty(self, info, owned=False)
        term.cursor = info.end_cursor if cursor is None else cursor
        return term

    async def get(self, pty_id: str) -> PtyInfo:
        """Where terminal ``pty_id`` stands. Raises PtyNotFound."""
        req = _build(wire.PtyRef, pty_id=pty_id)
        return _info(await self._call("get", req, wire.PtyInfo, CONTROL_TIMEOUT))

    async def list(self) -> list[PtyInfo]:
        """Every terminal execd keeps for this sandbox (running, or exited and not yet
        forgotten), oldest first."""
        reply = await self._call("list", Empty(), wire.PtyList, CONTROL_TIMEOUT)
        return [_info(p) for p in reply.ptys]

    async def close(self, pty_id: str) -> PtyInfo:
        """Kill terminal ``pty_id``'s whole process tree and forget it; returns its final state.
        Raises PtyNotFound."""
        req = _build(wire.PtyRef, pty_id=pty_id)
        return _info(await self._call("close", req, wire.PtyInfo, CONTROL_TIMEOUT + 5))


class AsyncPty:
    """One viewer on a terminal: write keystrokes, read output after its own ``cursor``."""

    def __init__(self, ptys: AsyncPtys, info: PtyInfo, *, owned: bool) -> None:
        self._ptys = ptys
        self.id = info.pty_id
        self.pid = info.pid
        self.cursor = 0  # next byte this viewer reads
        self.exit: PtyExit | None = None  # set once this viewer read to the end
        self._owned = owned

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._owned:  # close (kill) what we opened; already closed is fine
            with contextlib.suppress(PtyNotFound):
                await self.close()

    async def write(self, data: bytes | str, *, timeout: float | None = 60.0) -> None:
        """Type ``data`` (``"\\r"`` is Enter, ``"\\x03"`` Ctrl-C); returns once it is in the
        terminal. Large data goes in 32 KiB pieces, each waiting for the previous one.

        Raises:
            PtyClosed: the program has exited. PtyNotFound: the terminal is gone.
            RequestTimeout: the program did not take the input within ``timeout`` seconds.
        """
        payload = data.encode() if isinstance(data, str) else bytes(data)
        deadline = timeout if timeout is not None else 10 * 365 * 86400.0
        for i in range(0, len(payload), INPUT_CHUNK):
            req = wire.PtyInput(pty_id=self.id, data=payload[i : i + INPUT_CHUNK])
            await self._ptys._call("input", req, wire.PtyWritten, deadline)

    async def read(
        self, *, wait: float = LONG_POLL, max_bytes: int | None = None, cursor: int | None = None
    ) -> PtyOutput:
        """Output after this viewer's cursor (or ``cursor``), waiting up to ``wait`` seconds
        (0..60) for some; advances the cursor. Raises PtyNotFound, BadRequest."""
        req = _build(
            wire.PtyRead,
            pty_id=self.id,
            cursor=self.cursor if cursor is None else cursor,
            max_bytes=max_bytes,
            wait=wait,
        )
        got = await self._ptys._call("read", req, wire.PtyOutput, wait + READ_SLACK)
        _raise_if_cancelled()  # before moving the cursor: the bytes stay readable
        self.cursor = got.next_cursor
        done = PtyExit(got.exit_code, got.signal) if got.exited else None
        if done is not None:
            self.exit = done
        return PtyOutput(got.data, got.cursor, got.next_cursor, got.skipped, done)

    def __aiter__(self) -> AsyncIterator[PtyOutput]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[PtyOutput]:
        while self.exit is None:
            out = await self.read()
            if out.data or out.skipped:
                yield out

    async def expect(self, pattern: bytes | str, *, timeout: float = 30.0) -> bytes:
        """Read until ``pattern`` appears; returns everything read up to and including it
        (output after it stays unread: the cursor stops right after the match).

        Raises:
            TimeoutError: it did not appear within ``timeout`` seconds.
            PtyClosed: the program ended first (``details['output']`` has what was read).
        """
        needle = pattern.encode() if isinstance(pattern, str) else pattern
        seen = bytearray()
        end = time.monotonic() + timeout
        while True:
            hit = seen.find(needle)
            if hit >= 0:
                extra = len(seen) - (hit + len(needle))
                if extra:  # leave what follows the match unread, the end included
                    self.cursor -= extra
                    self.exit = None
                return bytes(seen[: hit + len(needle)])
            if self.exit is not None:
                raise PtyClosed(
                    f"pty {self.id!r} ended before {needle!r} appeared",
                    pty_id=self.id,
                    output=bytes(seen[-4096:]),
                )
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{needle!r} did not appear on pty {self.id!r} in {timeout}s")
            seen += (await self.read(wait=min(left, LONG_POLL))).data

    async def wait(self, timeout: float | None = None) -> PtyExit:
        """Read (and discard) this viewer's output until the program ended; its exit status.
        Raises TimeoutError after ``timeout`` seconds."""
        end = None if timeout is None else time.monotonic() + timeout
        while self.exit is None:
            left = LONG_POLL if end is None else min(end - time.monotonic(), LONG_POLL)
            if left <= 0:
                raise TimeoutError(f"pty {self.id!r} still running after {timeout}s")
            await self.read(wait=left)
        return self.exit

    async def resize(self, cols: int, rows: int) -> PtyInfo:
        """Set the window size (1..4096); the program gets SIGWINCH."""
        req = _build(wire.PtyResize, pty_id=self.id, cols=cols, rows=rows)
        return _info(await self._ptys._call("resize", req, wire.PtyInfo, CONTROL_TIMEOUT))

    async def signal(self, sig: int) -> PtyInfo:
        """Send ``sig`` to the foreground job (what Ctrl-C would interrupt)."""
        req = _build(wire.PtySignal, pty_id=self.id, signal=int(sig))
        return _info(await self._ptys._call("signal", req, wire.PtyInfo, CONTROL_TIMEOUT))

    async def info(self) -> PtyInfo:
        return await self._ptys.get(self.id)

    async def close(self) -> PtyInfo:
        """Kill the terminal's whole tree and forget it (for every viewer)."""
        return await self._ptys.close(self.id)
