"""The operation catalogue: every data-plane verb with its request and reply message types.

This table is the single source for execd's router, the generated docs in ``schemas/`` and the
test vectors. An operation whose ``reply`` is ``None`` is publish-only (no reply is sent).
"""

from __future__ import annotations

import dataclasses

from sandpod_contract.codec import Message
from sandpod_contract.messages.common import Empty
from sandpod_contract.messages.exec import (
    ExecExit,
    ExecFetch,
    ExecRef,
    ExecRequest,
    ExecResult,
    ExecResume,
    ExecSignal,
    ExecStart,
    ExecStarted,
    ExecStatus,
    OutputChunk,
    OutputPart,
    StdinWrite,
    StreamAck,
)
from sandpod_contract.messages.system import Info, Pong

__all__ = ["DATA_PLANE", "FRAMES", "PROTOCOL_VERSION", "Operation", "operation"]

PROTOCOL_VERSION = 1


@dataclasses.dataclass(frozen=True, slots=True)
class Operation:
    """One data-plane verb: ``<prefix>.sbx.<id>.<family>.<verb>``."""

    family: str
    verb: str
    request: type[Message]
    reply: type[Message] | None
    doc: str


DATA_PLANE: tuple[Operation, ...] = (
    Operation("sys", "ping", Empty, Pong, "liveness; answers without touching any command"),
    Operation("sys", "info", Empty, Info, "runtime, isolation and limits of this execd"),
    Operation("exec", "run", ExecRequest, ExecResult, "run a command to completion"),
    Operation("exec", "fetch", ExecFetch, OutputPart, "read one-shot output that did not fit"),
    Operation("exec", "start", ExecStart, ExecStarted, "start a streaming exec (frames follow)"),
    Operation("exec", "ack", StreamAck, None, "acknowledge consumed frames (publish only)"),
    Operation("exec", "stdin", StdinWrite, ExecStatus, "write/close a streaming exec's stdin"),
    Operation("exec", "signal", ExecSignal, ExecStatus, "signal the command's process group"),
    Operation("exec", "cancel", ExecRef, ExecStatus, "kill the command (SIGKILL to the group)"),
    Operation("exec", "resume", ExecResume, ExecStatus, "re-send retained frames from a seq"),
    Operation("exec", "status", ExecRef, ExecStatus, "is this exec known, running, exited"),
)

# Frames published by execd to a stream's ``deliver`` subject, told apart by their ``kind`` field.
FRAMES: tuple[type[Message], ...] = (OutputChunk, ExecExit)

_BY_KEY = {(op.family, op.verb): op for op in DATA_PLANE}


def operation(family: str, verb: str) -> Operation | None:
    """The operation for ``family.verb``, or ``None`` if there is none."""
    return _BY_KEY.get((family, verb))
