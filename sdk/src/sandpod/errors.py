"""Typed exceptions raised by the SDK, one per wire error code (from the contract)."""

from sandpod_contract.errors import (
    BadRequest,
    Busy,
    CommandNotFound,
    ConnectionLost,
    ExecError,
    ExecLost,
    ExecNotFound,
    InternalError,
    InvalidCwd,
    PayloadTooLarge,
    RequestTimeout,
    SandboxError,
    SandboxNotFound,
    SandboxUnavailable,
    SandpodError,
    SpawnFailed,
    StreamClosed,
    UnknownSubject,
    UnsupportedVersion,
)

__all__ = [
    "BadRequest",
    "Busy",
    "CommandFailed",
    "CommandNotFound",
    "ConnectionLost",
    "ExecError",
    "ExecLost",
    "ExecNotFound",
    "InternalError",
    "InvalidCwd",
    "PayloadTooLarge",
    "RequestTimeout",
    "SandboxError",
    "SandboxNotFound",
    "SandboxUnavailable",
    "SandpodError",
    "SpawnFailed",
    "StreamClosed",
    "UnknownSubject",
    "UnsupportedVersion",
]


class CommandFailed(ExecError):
    """Raised by ``exec(..., check=True)`` when the command did not exit 0 (client-side only)."""

    code = "exec.command_failed"
    summary = "the command exited unsuccessfully"
