"""The ``proc`` family: background processes in the sandbox (``sbx.proc``).

Same shape as every SDK family: ``api`` (the async client, given a
:class:`~sandpod.channel.Channel`), ``types`` (the values it returns), ``sync`` (the blocking
twins) and, where a family needs one, a named helper (here ``handle``, one process's handle).
This module lists the family's public names.
"""

from sandpod.proc.api import AsyncProcesses
from sandpod.proc.handle import AsyncProc
from sandpod.proc.sync import Proc, Processes
from sandpod.proc.types import (
    LogChunk,
    LogMatch,
    LogRead,
    ProcessInfo,
    ProcExited,
    ProcOutput,
    ProcWaitTimeout,
    Stream,
)

__all__ = [
    "AsyncProc",
    "AsyncProcesses",
    "LogChunk",
    "LogMatch",
    "LogRead",
    "Proc",
    "ProcExited",
    "ProcOutput",
    "ProcWaitTimeout",
    "ProcessInfo",
    "Processes",
    "Stream",
]
