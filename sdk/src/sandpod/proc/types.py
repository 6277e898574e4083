"""What the ``proc`` family returns (plain, frozen, no wire details); its client-side errors
are in :mod:`sandpod.errors`, re-exported here."""

from __future__ import annotations

import dataclasses
import re
from typing import Literal

from sandpod.errors import ProcExited, ProcWaitTimeout
from sandpod_contract.messages.proc import ProcInfo

__all__ = [
    "LogChunk",
    "LogMatch",
    "LogRead",
    "ProcExited",
    "ProcOutput",
    "ProcWaitTimeout",
    "ProcessInfo",
    "Stream",
]

Stream = Literal["stdout", "stderr"]


@dataclasses.dataclass(frozen=True, slots=True)
class ProcessInfo:
    """Where a background process stands (see ``proc.info`` in ``schemas/``)."""

    proc_id: str
    pid: int
    state: Literal["running", "exited"]
    command: str
    cwd: str
    tags: dict[str, str]
    started_at: float
    ended_at: float | None
    exit_code: int | None
    signal: int | None
    killed: bool
    timed_out: bool
    stdout_size: int
    stderr_size: int
    log_limit: int
    log_start: int  # cursor of the oldest byte still kept
    log_end: int  # cursor of the next byte to come

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @classmethod
    def _from_wire(cls, w: ProcInfo) -> ProcessInfo:
        fields = {f.name: getattr(w, f.name) for f in dataclasses.fields(cls)}
        return cls(**{**fields, "tags": dict(w.tags or {})})


@dataclasses.dataclass(frozen=True, slots=True)
class LogChunk:
    """A piece of output; resume after it from ``end``. ``skipped``: bytes lost just before."""

    stream: Stream
    data: bytes
    offset: int
    skipped: int = 0

    @property
    def end(self) -> int:
        return self.offset + len(self.data)

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


@dataclasses.dataclass(frozen=True, slots=True)
class LogRead:
    """One ``logs`` read: chunks after ``cursor``; ask from ``next_cursor`` next."""

    chunks: list[LogChunk]
    cursor: int
    next_cursor: int
    skipped: int
    eof: bool
    state: Literal["running", "exited"]


@dataclasses.dataclass(frozen=True, slots=True)
class ProcOutput:
    """Everything still kept of a process's output, per stream."""

    stdout_bytes: bytes
    stderr_bytes: bytes
    skipped: int  # bytes dropped by the log's bound before they were read
    next_cursor: int

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", "replace")


@dataclasses.dataclass(frozen=True, slots=True)
class LogMatch:
    """What ``wait_for_log`` found: the match, its line, and where to keep reading (``cursor``)."""

    stream: Stream
    line: str
    match: re.Match[str]
    cursor: int
