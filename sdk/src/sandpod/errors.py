"""Typed exceptions raised by the SDK: one per wire error code (from the contract), plus the
client-side ones (:class:`CommandFailed`, :class:`ArgvExpected`, :class:`ProcExited`,
:class:`ProcWaitTimeout`). Catch a family base (``FsError``, ``ExecError``) or a precise class;
every one has ``code``, ``message``, ``details`` and ``retryable``."""

from sandpod_client.archive import ArchiveFailed, ArchiveUnsupported
from sandpod_contract.errors import (
    BadRequest,
    BlobAuthFailed,
    BlobCorrupt,
    BlobError,
    BlobInvalidDigest,
    BlobNotFound,
    BlobUnavailable,
    BuildFailed,
    BuildUnsupported,
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
    ImageAuthFailed,
    ImageDigestMismatch,
    ImageError,
    ImageInUse,
    ImageLayerRefused,
    ImageNotFound,
    ImageUnsupported,
    InsufficientStorage,
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
    SnapshotError,
    SnapshotFailed,
    SnapshotInUse,
    SnapshotQuotaExceeded,
    SnapshotUnsupported,
    SpawnFailed,
    StoreError,
    StreamClosed,
    TemplateError,
    UnknownSubject,
    UnsupportedVersion,
    VolumeInUse,
    VolumeQuotaExceeded,
    WatchError,
    WatchLimit,
    WatchNotFound,
)

__all__ = [
    "ArchiveFailed",
    "ArchiveUnsupported",
    "ArgvExpected",
    "BadRequest",
    "BlobAuthFailed",
    "BlobCorrupt",
    "BlobError",
    "BlobInvalidDigest",
    "BlobNotFound",
    "BlobUnavailable",
    "BuildFailed",
    "BuildUnsupported",
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
    "ImageAuthFailed",
    "ImageDigestMismatch",
    "ImageError",
    "ImageInUse",
    "ImageLayerRefused",
    "ImageNotFound",
    "ImageUnsupported",
    "InsufficientStorage",
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
    "SnapshotError",
    "SnapshotFailed",
    "SnapshotInUse",
    "SnapshotQuotaExceeded",
    "SnapshotUnsupported",
    "SpawnFailed",
    "StoreError",
    "StreamClosed",
    "TemplateError",
    "UnknownSubject",
    "UnsupportedVersion",
    "VolumeInUse",
    "VolumeQuotaExceeded",
    "WatchError",
    "WatchLimit",
    "WatchNotFound",
]


class CommandFailed(ExecError):
    """Raised by ``exec(..., check=True)`` when the command did not exit 0 (client-side only)."""

    code = "exec.command_failed"
    summary = "the command exited unsuccessfully"


class ProcExited(ProcError):
    """The process exited (its log ended) before what was awaited happened (client-side)."""

    code = "proc.exited"
    summary = "the process exited before the awaited log line or port appeared"


class ProcWaitTimeout(ProcError):
    """A wait on a background process ran out of time (client-side)."""

    code = "proc.wait_timeout"
    retryable = True
    summary = "the awaited condition did not happen within the timeout"


class ArgvExpected(InvalidCwd, BadRequest):
    """``exec("ls", "-l")``: two positionals are ``(cwd, command)``, and these look like one argv.

    Raised before anything is sent when the command is an option (``"-l"`` is no shell command),
    and instead of a bare ``InvalidCwd`` when the "cwd" that execd could not find looks like a
    program name. The message shows the argv form (client-side only). It is both an
    ``InvalidCwd`` (what execd would have said, so existing handlers still catch it) and a
    ``BadRequest`` (the call, not the sandbox, is wrong).
    """

    code = "exec.argv_expected"
    summary = "exec(cwd, command) got what looks like a program and its arguments"
