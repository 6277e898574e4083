"""Blocking twins of the ``proc`` family (:class:`~sandpod.proc.api.AsyncProcesses`,
:class:`~sandpod.proc.handle.AsyncProc`).

Each method runs its async twin on the SDK's private loop thread (:mod:`sandpod._loop`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from sandpod._loop import run
from sandpod._twins import iterate, twin
from sandpod.proc.api import AsyncProcesses
from sandpod.proc.handle import AsyncProc
from sandpod.proc.types import LogChunk, ProcessInfo, Stream

__all__ = ["Proc", "Processes"]


class Processes:
    """Blocking twin of :class:`AsyncProcesses` (each method runs it on the SDK loop)."""

    def __init__(self, inner: AsyncProcesses) -> None:
        self._inner = inner

    def start(
        self,
        cwd_or_command: str | Sequence[str],
        command: str | Sequence[str] | None = None,
        /,
        *,
        proc_id: str | None = None,
        tags: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        timeout: float | None = None,
        log_limit: int | None = None,
    ) -> Proc:
        """Start a background process (see :meth:`AsyncProcesses.start`)."""
        inner = self._inner.start(
            cwd_or_command,
            command,
            proc_id=proc_id,
            tags=tags,
            env=env,
            stdin=stdin,
            timeout=timeout,
            log_limit=log_limit,
        )
        return Proc(run(inner))

    def get(self, proc_id: str) -> Proc:
        """A handle on a kept process. Raises ProcNotFound."""
        return Proc(run(self._inner.get(proc_id)))

    def follow(
        self, proc_id: str, cursor: int = 0, *, stream: Stream | None = None
    ) -> Iterator[LogChunk]:
        """Yield output as it comes until the process ended (see :meth:`AsyncProcesses.follow`)."""
        return iterate(self._inner.follow(proc_id, cursor, stream=stream))

    list = twin(AsyncProcesses.list)
    status = twin(AsyncProcesses.status)
    wait = twin(AsyncProcesses.wait)
    kill = twin(AsyncProcesses.kill)
    signal = twin(AsyncProcesses.signal)
    remove = twin(AsyncProcesses.remove)
    logs = twin(AsyncProcesses.logs)
    output = twin(AsyncProcesses.output)
    wait_for_log = twin(AsyncProcesses.wait_for_log)
    wait_for_port = twin(AsyncProcesses.wait_for_port)


class Proc:
    """Blocking twin of :class:`AsyncProc`."""

    def __init__(self, inner: AsyncProc) -> None:
        self._inner = inner

    @property
    def id(self) -> str:
        return self._inner.id

    @property
    def pid(self) -> int:
        return self._inner.pid

    @property
    def info(self) -> ProcessInfo:
        return self._inner.info

    def __repr__(self) -> str:
        return repr(self._inner).replace("AsyncProc", "Proc", 1)

    def follow(self, cursor: int = 0, *, stream: Stream | None = None) -> Iterator[LogChunk]:
        """Output from ``cursor`` as it comes, until the process exited and all was read."""
        return iterate(self._inner.follow(cursor, stream=stream))

    status = twin(AsyncProc.status)
    wait = twin(AsyncProc.wait)
    kill = twin(AsyncProc.kill)
    signal = twin(AsyncProc.signal)
    remove = twin(AsyncProc.remove)
    logs = twin(AsyncProc.logs)
    output = twin(AsyncProc.output)
    wait_for_log = twin(AsyncProc.wait_for_log)
    wait_for_port = twin(AsyncProc.wait_for_port)
