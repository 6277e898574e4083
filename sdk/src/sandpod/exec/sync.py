"""Blocking twin of a streaming exec (:class:`~sandpod.exec.stream.AsyncExecStream`).

Each method runs its async twin on the SDK's private loop thread (:mod:`sandpod._loop`).
"""

from __future__ import annotations

from collections.abc import Iterator
from types import TracebackType
from typing import Self

from sandpod._loop import run
from sandpod._twins import iterate
from sandpod.exec.stream import AsyncExecStream
from sandpod.exec.types import ExitStatus, OutputChunk

__all__ = ["ExecStream"]


class ExecStream:
    """Blocking twin of :class:`AsyncExecStream`: iterate for chunks, then :meth:`wait`."""

    def __init__(self, inner: AsyncExecStream) -> None:
        self._inner = inner

    @property
    def exec_id(self) -> str:
        return self._inner.exec_id

    @property
    def pid(self) -> int | None:
        return self._inner.pid

    @property
    def exit(self) -> ExitStatus | None:
        return self._inner.exit

    def start(self) -> Self:
        run(self._inner.start())
        return self

    def close(self) -> None:
        run(self._inner.close())

    def __enter__(self) -> Self:
        run(self._inner.__aenter__())
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __iter__(self) -> Iterator[OutputChunk]:
        """The chunks until the exit. Outside ``with``, leaving the loop early (``break``, an
        exception, the iterator collected) closes the stream and cancels a running command."""
        return iterate(aiter(self._inner))

    def __next__(self) -> OutputChunk:
        try:
            return run(self._inner.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def wait(self) -> ExitStatus:
        return run(self._inner.wait())

    def write(self, data: bytes | str) -> None:
        run(self._inner.write(data))

    def close_stdin(self) -> None:
        run(self._inner.close_stdin())

    def signal(self, sig: int) -> None:
        run(self._inner.signal(sig))

    def cancel(self) -> None:
        run(self._inner.cancel())
