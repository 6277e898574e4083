"""A handle on one background process: :class:`AsyncProc` (blocking twin: ``sync.Proc``).

``sbx.proc.start(...)`` and ``sbx.proc.get(id)`` return them; every method is the matching
``sbx.proc`` call with the id filled in, and remembers the last :class:`ProcessInfo` seen.
"""

from __future__ import annotations

import re
import signal as _signal
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Literal

from sandpod.proc.types import LogChunk, LogMatch, LogRead, ProcessInfo, ProcOutput, Stream

if TYPE_CHECKING:
    from sandpod.proc.api import AsyncProcesses

__all__ = ["AsyncProc"]


class AsyncProc:
    """A handle on one background process (``id``, ``pid``, last known ``info``)."""

    def __init__(self, procs: AsyncProcesses, info: ProcessInfo) -> None:
        self._procs = procs
        self.info = info

    @property
    def id(self) -> str:
        return self.info.proc_id

    @property
    def pid(self) -> int:
        return self.info.pid

    def __repr__(self) -> str:
        return f"<AsyncProc {self.id!r} pid={self.pid} {self.info.state}>"

    async def _keep(self, info: ProcessInfo) -> ProcessInfo:
        self.info = info
        return info

    async def status(self) -> ProcessInfo:
        """Where the process stands now. Raises ProcNotFound once removed."""
        return await self._keep(await self._procs.status(self.id))

    async def wait(self, timeout: float | None = None) -> ProcessInfo:
        """Wait for the exit; raises ProcWaitTimeout after ``timeout`` seconds."""
        return await self._keep(await self._procs.wait(self.id, timeout))

    async def kill(self, signal: int = _signal.SIGTERM, grace: float = 5.0) -> ProcessInfo:
        """End the whole tree: ``signal``, then SIGKILL after ``grace`` s; returns once gone."""
        return await self._keep(await self._procs.kill(self.id, signal, grace))

    async def signal(self, sig: int) -> ProcessInfo:
        """Send ``sig`` to the process group; nothing else happens."""
        return await self._keep(await self._procs.signal(self.id, sig))

    async def remove(self) -> ProcessInfo:
        """SIGKILL the tree if anything still runs, then forget the record and its log."""
        return await self._keep(await self._procs.remove(self.id))

    async def logs(
        self,
        cursor: int = 0,
        *,
        wait: float = 0.0,
        max_bytes: int | None = None,
        stream: Stream | None = None,
    ) -> LogRead:
        """One read of the output after ``cursor`` (see :meth:`AsyncProcesses.logs`)."""
        return await self._procs.logs(
            self.id, cursor, wait=wait, max_bytes=max_bytes, stream=stream
        )

    def follow(self, cursor: int = 0, *, stream: Stream | None = None) -> AsyncIterator[LogChunk]:
        """Output from ``cursor`` as it comes, until the process exited and all was read."""
        return self._procs.follow(self.id, cursor, stream=stream)

    async def output(self, *, cursor: int = 0) -> ProcOutput:
        """All output kept from ``cursor`` up to now, per stream."""
        return await self._procs.output(self.id, cursor=cursor)

    async def wait_for_log(
        self,
        pattern: str | re.Pattern[str],
        timeout: float | None = 30.0,
        *,
        stream: Stream | None = None,
        cursor: int = 0,
    ) -> LogMatch:
        """Wait for output matching ``pattern`` (see :meth:`AsyncProcesses.wait_for_log`)."""
        return await self._procs.wait_for_log(
            self.id, pattern, timeout, stream=stream, cursor=cursor
        )

    async def wait_for_port(
        self,
        port: int,
        *,
        kind: Literal["tcp", "http"] = "tcp",
        path: str = "/",
        timeout: float | None = 30.0,
    ) -> None:
        """Wait for ``port`` to accept; ProcExited if this process exits first."""
        await self._procs.wait_for_port(
            port, proc_id=self.id, kind=kind, path=path, timeout=timeout
        )
