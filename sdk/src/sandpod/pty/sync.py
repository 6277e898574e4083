"""Blocking twins of the ``pty`` family (:class:`~sandpod.pty.api.AsyncPtys`, ``AsyncPty``).

Each method runs its async twin on the SDK's private loop thread (:mod:`sandpod._loop`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Self

from sandpod._loop import run
from sandpod.pty.api import LONG_POLL, AsyncPty, AsyncPtys
from sandpod.pty.types import PtyExit, PtyInfo, PtyOutput

__all__ = ["Pty", "Ptys"]


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
