"""Typed exceptions raised by the SDK: one per wire error code (from the contract), plus the
client-side :class:`CommandFailed`. Catch a family base (``FsError``, ``ExecError``) or a precise
class; every one has ``code``, ``message``, ``details`` and ``retryable``.

``ProcExited`` and ``ProcWaitTimeout`` (client-side, never on the wire) live with the proc types
and are imported on first use: importing them here eagerly pulled the proc family's messages
into every caller, ``sandpod exec`` included."""

from typing import TYPE_CHECKING, Any

from sandpod_contract.errors import (
    BadRequest,
    Busy,
    ClaimError,
    ClaimFailed,
    ClaimTimeout,
    CommandNotFound,
    ConnectionLost,
    ExecError,
    ExecIdInUse,
    ExecLost,
    ExecNotFound,
    FsAlreadyExists,
    FsError,
    FsInvalidPath,
    FsIsADirectory,
    FsNoSpace,
    FsNotADirectory,
    FsNotEmpty,
    FsNotFound,
    FsPermissionDenied,
    FsTooLarge,
    FsUploadNotFound,
    GitAuthFailed,
    GitError,
    GitNetwork,
    GitNotFound,
    GitTimeout,
    InternalError,
    InvalidCwd,
    PayloadTooLarge,
    PoolNotFound,
    ProcError,
    ProcIdInUse,
    ProcNotFound,
    PtyClosed,
    PtyError,
    PtyIdInUse,
    PtyNotFound,
    RequestTimeout,
    ResourceConflict,
    ResourceExists,
    ResourceExpired,
    ResourceInvalid,
    ResourceNotFound,
    SandboxError,
    SandboxJailRefused,
    SandboxNotFound,
    SandboxPaused,
    SandboxUnavailable,
    SandpodError,
    SessionAlreadyExists,
    SessionDead,
    SessionError,
    SessionNotFound,
    SpawnFailed,
    StoreError,
    StreamClosed,
    UnknownSubject,
    UnsupportedVersion,
    WatchError,
    WatchLimit,
    WatchNotFound,
)

if TYPE_CHECKING:
    from sandpod.proc_types import ProcExited, ProcWaitTimeout

_FROM_PROC_TYPES = frozenset({"ProcExited", "ProcWaitTimeout"})

__all__ = [
    "BadRequest",
    "Busy",
    "ClaimError",
    "ClaimFailed",
    "ClaimTimeout",
    "CommandFailed",
    "CommandNotFound",
    "ConnectionLost",
    "ExecError",
    "ExecIdInUse",
    "ExecLost",
    "ExecNotFound",
    "FsAlreadyExists",
    "FsError",
    "FsInvalidPath",
    "FsIsADirectory",
    "FsNoSpace",
    "FsNotADirectory",
    "FsNotEmpty",
    "FsNotFound",
    "FsPermissionDenied",
    "FsTooLarge",
    "FsUploadNotFound",
    "GitAuthFailed",
    "GitError",
    "GitNetwork",
    "GitNotFound",
    "GitTimeout",
    "InternalError",
    "InvalidCwd",
    "PayloadTooLarge",
    "PoolNotFound",
    "ProcError",
    "ProcExited",
    "ProcIdInUse",
    "ProcNotFound",
    "ProcWaitTimeout",
    "PtyClosed",
    "PtyError",
    "PtyIdInUse",
    "PtyNotFound",
    "RequestTimeout",
    "ResourceConflict",
    "ResourceExists",
    "ResourceExpired",
    "ResourceInvalid",
    "ResourceNotFound",
    "SandboxError",
    "SandboxJailRefused",
    "SandboxNotFound",
    "SandboxPaused",
    "SandboxUnavailable",
    "SandpodError",
    "SessionAlreadyExists",
    "SessionDead",
    "SessionError",
    "SessionNotFound",
    "SpawnFailed",
    "StoreError",
    "StreamClosed",
    "UnknownSubject",
    "UnsupportedVersion",
    "WatchError",
    "WatchLimit",
    "WatchNotFound",
]


class CommandFailed(ExecError):
    """Raised by ``exec(..., check=True)`` when the command did not exit 0 (client-side only)."""

    code = "exec.command_failed"
    summary = "the command exited unsuccessfully"


def __getattr__(name: str) -> Any:
    """``ProcExited``/``ProcWaitTimeout`` from :mod:`sandpod.proc_types`, on first access."""
    if name not in _FROM_PROC_TYPES:
        raise AttributeError(f"module 'sandpod.errors' has no attribute {name!r}")
    from sandpod import proc_types  # lazy: see the module docstring

    value = getattr(proc_types, name)
    globals()[name] = value
    return value
