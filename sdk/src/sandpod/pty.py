"""SDK surface for pseudo-terminals (``sbx.pty``): async and blocking twins.

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
import dataclasses
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self, TypeVar

from sandpod._loop import run
from sandpod.exec_args import CONTROL_TIMEOUT
from sandpod_contract.codec import Message
from sandpod_contract.errors import BadRequest, PtyClosed, PtyNotFound
from sandpod_contract.messages import pty as wire
from sandpod_contract.messages.common import Empty

if TYPE_CHECKING:
    from sandpod.aio import AsyncSandbox

__all__ = ["AsyncPty", "AsyncPtys", "Pty", "PtyExit", "PtyInfo", "PtyOutput", "Ptys"]

M = TypeVar("M", bound=Message)
LONG_POLL = 25.0  # seconds a read waits for output; the request deadline adds READ_SLACK
READ_SLACK = 10.0
INPUT_CHUNK = 32 * 1024  # well under any execd request limit (sys.info max_request_bytes)


@dataclasses.dataclass(frozen=True, slots=True)
class PtyExit:
    """How a terminal's program ended: ``exit_code``, or ``signal`` if a signal killed it."""

    exit_code: int | None
    signal: int | None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclasses.dataclass(frozen=True, slots=True)
class PtyInfo:
    """Where a terminal stands. ``end_cursor`` is how many bytes it printed so far (start a
    viewer there for new output only); ``start_cursor`` is the oldest byte still replayable."""

    pty_id: str
    pid: int
    argv: tuple[str, ...]
    cwd: str
    cols: int
    rows: int
    running: bool
    exit: PtyExit | None  # once exited
    abandoned: bool
    started_at: float
    end_cursor: int
    start_cursor: int
    buffer_bytes: int
    abandon_after: float | None


@dataclasses.dataclass(frozen=True, slots=True)
class PtyOutput:
    """One read: ``data`` starts at ``cursor`` (``skipped`` bytes past the cursor asked for when
    the viewer fell behind the replay buffer). ``exit`` is set once the program ended and this
    viewer has read everything."""

    data: bytes
    cursor: int
    next_cursor: int
    skipped: int
    exit: PtyExit | None

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


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


def _info(msg: wire.PtyInfo) -> PtyInfo:
    done = msg.state == "exited"
    return PtyInfo(
        pty_id=msg.pty_id,
        pid=msg.pid,
        argv=msg.argv,
        cwd=msg.cwd,
        cols=msg.cols,
        rows=msg.rows,
        running=not done,
        exit=PtyExit(msg.exit_code, msg.signal) if done else None,
        abandoned=msg.abandoned,
        started_at=msg.started_at,
        end_cursor=msg.end_cursor,
        start_cursor=msg.start_cursor,
        buffer_bytes=msg.buffer_bytes,
        abandon_after=msg.abandon_after,
    )


class AsyncPtys:
    """``sbx.pty``: open, re-attach to, list and close pseudo-terminals."""

    def __init__(self, sbx: AsyncSandbox) -> None:
        self._sbx = sbx

    async def _call(self, verb: str, msg: Message, reply: type[M], timeout: float) -> M:
        return await self._sbx._call("pty", verb, msg, reply, timeout)

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


class Ptys:
    """Blocking twin of :class:`AsyncPtys` (each method runs it on the SDK loop)."""

    def __init__(self, inner: AsyncPtys) -> None:
        self._inner = inner

    def open(
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
    ) -> Pty:
        """Start a program on a new terminal (see :meth:`AsyncPtys.open`)."""
        return Pty(
            run(
                self._inner.open(
                    command,
                    cols=cols,
                    rows=rows,
                    cwd=cwd,
                    env=env,
                    pty_id=pty_id,
                    buffer_bytes=buffer_bytes,
                    abandon_after=abandon_after,
                )
            )
        )

    def connect(self, pty_id: str, *, cursor: int | None = 0) -> Pty:
        return Pty(run(self._inner.connect(pty_id, cursor=cursor)))

    def get(self, pty_id: str) -> PtyInfo:
        return run(self._inner.get(pty_id))

    def list(self) -> list[PtyInfo]:
        return run(self._inner.list())

    def close(self, pty_id: str) -> PtyInfo:
        return run(self._inner.close(pty_id))


class Pty:
    """Blocking twin of :class:`AsyncPty`; iterate it for :class:`PtyOutput` until the end."""

    def __init__(self, inner: AsyncPty) -> None:
        self._inner = inner

    @property
    def id(self) -> str:
        return self._inner.id

    @property
    def pid(self) -> int:
        return self._inner.pid

    @property
    def cursor(self) -> int:
        return self._inner.cursor

    @property
    def exit(self) -> PtyExit | None:
        return self._inner.exit

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        run(self._inner.__aexit__())

    def __iter__(self) -> Iterator[PtyOutput]:
        while self._inner.exit is None:
            out = self.read()
            if out.data or out.skipped:
                yield out

    def write(self, data: bytes | str, *, timeout: float | None = 60.0) -> None:
        run(self._inner.write(data, timeout=timeout))

    def read(
        self, *, wait: float = LONG_POLL, max_bytes: int | None = None, cursor: int | None = None
    ) -> PtyOutput:
        return run(self._inner.read(wait=wait, max_bytes=max_bytes, cursor=cursor))

    def expect(self, pattern: bytes | str, *, timeout: float = 30.0) -> bytes:
        return run(self._inner.expect(pattern, timeout=timeout))

    def wait(self, timeout: float | None = None) -> PtyExit:
        return run(self._inner.wait(timeout))

    def resize(self, cols: int, rows: int) -> PtyInfo:
        return run(self._inner.resize(cols, rows))

    def signal(self, sig: int) -> PtyInfo:
        return run(self._inner.signal(sig))

    def info(self) -> PtyInfo:
        return run(self._inner.info())

    def close(self) -> PtyInfo:
        return run(self._inner.close())
