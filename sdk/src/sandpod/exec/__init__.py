"""The exec family: run a command to completion or as a stream (see :mod:`sandpod.exec.api`).

Every SDK family is a package of the same shape: ``api`` (the async client, given a
:class:`~sandpod.channel.Channel`), ``types`` (the values it returns), ``sync`` (the blocking
twin) and, where a family needs them, named helpers (here ``args``, ``oneshot``, ``stream``).
This module lists the family's public names.
"""

from sandpod.exec.api import open_exec_stream, run_exec
from sandpod.exec.args import Command
from sandpod.exec.stream import AsyncExecStream
from sandpod.exec.sync import ExecStream
from sandpod.exec.types import ExecResult, ExitStatus, OutputChunk

__all__ = [
    "AsyncExecStream",
    "Command",
    "ExecResult",
    "ExecStream",
    "ExitStatus",
    "OutputChunk",
    "open_exec_stream",
    "run_exec",
]
