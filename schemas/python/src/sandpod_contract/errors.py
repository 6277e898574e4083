"""The error model shared by every Sandpod component.

An error crosses the wire exactly once, as ``{"code", "message", "retryable", "details"}`` inside a
reply envelope (see ``codec``). Each stable ``code`` maps to one exception class here, so every
service raises and every SDK catches the same types. Nothing decides anything by matching message
text: callers branch on the class (or ``code``) and ``retryable``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

__all__ = [
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
    "ProcIdInUse",
    "ProcNotFound",
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
    "error_catalogue",
    "error_from_wire",
]


_BY_CODE: dict[str, type[SandpodError]] = {}


class SandpodError(Exception):
    """Root of every Sandpod error.

    Attributes:
        code: stable machine-readable code, e.g. ``exec.not_found``.
        retryable: whether the same request may succeed if sent again later.
        details: structured, JSON/msgpack-safe fields (never secrets).
    """

    code: ClassVar[str] = "internal"
    retryable: ClassVar[bool] = False
    summary: ClassVar[str] = "unexpected internal error"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Every contract class that names a code is on the wire; client-side subclasses
        # (e.g. the SDK's CommandFailed) are not part of the catalogue.
        if "code" in cls.__dict__ and cls.__module__ == __name__:
            if cls.code in _BY_CODE and _BY_CODE[cls.code] is not cls:
                raise TypeError(f"error code {cls.code!r} defined twice")
            _BY_CODE[cls.code] = cls

    def __init__(self, message: str | None = None, **details: Any) -> None:
        self.message = message or self.summary
        # None-valued details carry nothing: keep the wire form free of nils.
        self.details: dict[str, Any] = {k: v for k, v in details.items() if v is not None}
        super().__init__(self.message)

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"

    def to_wire(self) -> dict[str, Any]:
        """Return the wire form of this error (the ``error`` field of a reply)."""
        return {
            "code": self.code,
            "message": self.message,
            "retryable": self.retryable,
            "details": dict(self.details),
        }


class InternalError(SandpodError):
    code = "internal"
    retryable = True
    summary = "unexpected internal error; retry, and report it if it persists"


# -- bad requests: the caller sent something the receiver cannot accept ---------------------------


class BadRequest(SandpodError):
    """``details.reason`` is always set (``error_spec.BAD_REQUEST_REASONS``; ``invalid_value``
    unless the raiser says otherwise), so a client can branch on why without reading the text."""

    code = "bad_request"
    summary = "malformed request"

    def __init__(self, message: str | None = None, **details: Any) -> None:
        super().__init__(message, **details)
        if self.code == "bad_request":  # the subclasses' codes say why already
            self.details.setdefault("reason", "invalid_value")


class PayloadTooLarge(BadRequest):
    code = "bad_request.too_large"
    summary = "payload exceeds the receiver's limit; send less or stream it in chunks"


class UnsupportedVersion(BadRequest):
    code = "bad_request.unsupported_version"
    summary = "message schema version is newer than the receiver understands; upgrade the receiver"


class UnknownSubject(BadRequest):
    code = "bad_request.unknown_subject"
    summary = "no operation is defined on this subject"


# -- transport-level conditions seen by clients ----------------------------------------------------


class ConnectionLost(SandpodError):
    code = "connection.lost"
    retryable = True
    summary = "the connection to NATS is closed or was lost; check the NATS URL and retry"


class RequestTimeout(SandpodError):
    code = "timeout"
    retryable = True
    summary = "no reply within the deadline"


class Busy(SandpodError):
    code = "busy"
    retryable = True
    summary = "the receiver is at its concurrency limit; retry shortly"


# -- sandbox family --------------------------------------------------------------------------------


class SandboxError(SandpodError):
    code = "sandbox.error"
    summary = "sandbox error"


class SandboxNotFound(SandboxError):
    code = "sandbox.not_found"
    summary = "no execd answers for this sandbox; check the sandbox id and that it is running"


class SandboxUnavailable(SandboxError):
    code = "sandbox.unavailable"
    retryable = True
    summary = "the sandbox's execd stopped answering mid-request"


class SandboxPaused(SandboxError):
    code = "sandbox.paused"
    retryable = True
    summary = "the sandbox is paused (its processes are frozen); resume it, then start commands"


class SandboxJailRefused(SandboxError):
    code = "sandbox.jail_refused"
    summary = (
        "this node runs sandboxes only inside jails, and the sandbox has no safe jail file "
        "(lifecycle creates it); create the sandbox through the Sandbox API"
    )


# -- exec family -----------------------------------------------------------------------------------


class ExecError(SandpodError):
    code = "exec.error"
    summary = "exec error"


class ExecNotFound(ExecError):
    code = "exec.not_found"
    summary = "execd does not know this exec id (finished long ago, or execd restarted)"


class ExecLost(ExecError):
    code = "exec.lost"
    retryable = True
    summary = "the command's execd restarted or lost it before it finished; its outcome is unknown"


class SpawnFailed(ExecError):
    code = "exec.spawn_failed"
    summary = "the command could not be started"


class CommandNotFound(SpawnFailed):
    code = "exec.command_not_found"
    summary = "executable not found on PATH"


class InvalidCwd(SpawnFailed):
    code = "exec.invalid_cwd"
    summary = "working directory does not exist or is not a directory"


class ExecIdInUse(ExecError):
    code = "exec.id_in_use"
    summary = "this exec id is running or finished recently; choose a fresh id"


class StreamClosed(ExecError):
    code = "exec.stream_closed"
    summary = "the stream is closed (stdin already at EOF, or the command has exited)"


# -- fs family -------------------------------------------------------------------------------------


class FsError(SandpodError):
    code = "fs.error"
    summary = "file operation failed"


class FsNotFound(FsError):
    code = "fs.not_found"
    summary = "no such file or directory"


class FsAlreadyExists(FsError):
    code = "fs.already_exists"
    summary = "the path already exists"


class FsIsADirectory(FsError):
    code = "fs.is_a_directory"
    summary = "the path is a directory"


class FsNotADirectory(FsError):
    code = "fs.not_a_directory"
    summary = "a path component is not a directory"


class FsPermissionDenied(FsError):
    code = "fs.permission_denied"
    summary = "permission denied"


class FsTooLarge(FsError):
    code = "fs.too_large"
    summary = "the file is larger than this operation allows; read it in ranges or stream it"


class FsInvalidPath(FsError):
    code = "fs.invalid_path"
    summary = "the path is not acceptable (NUL bytes, too long, or escapes the allowed root)"


class FsNotEmpty(FsError):
    code = "fs.not_empty"
    summary = "the directory is not empty; remove it recursively"


class FsNoSpace(FsError):
    code = "fs.no_space"
    retryable = True
    summary = "no space left on the device"


class FsUploadNotFound(FsError):
    code = "fs.upload_not_found"
    summary = "no such upload (committed, aborted, or dropped after going idle); start it again"


# -- proc family -----------------------------------------------------------------------------------


class ProcError(SandpodError):
    code = "proc.error"
    summary = "background process error"


class ProcNotFound(ProcError):
    code = "proc.not_found"
    summary = "no background process with this id"


class ProcIdInUse(ProcError):
    code = "proc.id_in_use"
    summary = "a background process with this id exists; choose another id or remove it"


# -- session family --------------------------------------------------------------------------------


class SessionError(SandpodError):
    code = "session.error"
    summary = "session error"


class SessionNotFound(SessionError):
    code = "session.not_found"
    summary = "no session with this id"


class SessionAlreadyExists(SessionError):
    code = "session.already_exists"
    summary = "a session with this id exists"


class SessionDead(SessionError):
    code = "session.dead"
    summary = "the session's shell has exited; delete and recreate the session"


# -- pty family ------------------------------------------------------------------------------------


class PtyError(SandpodError):
    code = "pty.error"
    summary = "pty error"


class PtyNotFound(PtyError):
    code = "pty.not_found"
    summary = "no pty with this id"


class PtyClosed(PtyError):
    code = "pty.closed"
    summary = "the pty's process has exited"


class PtyIdInUse(PtyError):
    code = "pty.id_in_use"
    summary = "a pty with this id exists; choose another id or close it"


# -- watch family ----------------------------------------------------------------------------------


class WatchError(SandpodError):
    code = "watch.error"
    summary = "watch error"


class WatchNotFound(WatchError):
    code = "watch.not_found"
    summary = "no watch with this id"


class WatchLimit(WatchError):
    code = "watch.limit"
    retryable = True
    summary = "too many watches (or the kernel's inotify limit was reached)"


# -- git family ------------------------------------------------------------------------------------


class GitError(SandpodError):
    code = "git.error"
    summary = "git command failed"


class GitAuthFailed(GitError):
    code = "git.auth_failed"
    summary = "authentication to the git remote failed; check the credentials"


class GitNotFound(GitError):
    code = "git.not_found"
    summary = "repository, branch or ref not found"


class GitNetwork(GitError):
    code = "git.network"
    retryable = True
    summary = "the git remote could not be reached"


class GitTimeout(GitError):
    code = "git.timeout"
    retryable = True
    summary = "the git operation exceeded its timeout"


# -- image family: OCI references, registry pulls, the node's layer store (sandpod_image) ------


class ImageError(SandpodError):
    code = "image.error"
    retryable = True
    summary = "the image could not be fetched or stored; retry, and check the registry and disk"


class ImageNotFound(ImageError):
    code = "image.not_found"
    retryable = False
    summary = (
        "no such image (repository, tag, digest or platform); check the reference, "
        "or pull it first (sandpod image pull)"
    )


class ImageAuthFailed(ImageError):
    code = "image.auth_failed"
    retryable = False
    summary = (
        "the registry refused the credentials (or asked for some and none were given); "
        "log in to it in the Docker config.json file (--auth-file, $DOCKER_CONFIG)"
    )


class ImageDigestMismatch(ImageError):
    code = "image.digest_mismatch"
    retryable = False
    summary = (
        "content does not match its digest (tampered registry, proxy or file); nothing was kept"
    )


class ImageUnsupported(ImageError):
    code = "image.unsupported"
    retryable = False
    summary = "the image uses a format, media type or reference form Sandpod does not support"


class ImageLayerRefused(ImageError):
    code = "image.layer_refused"
    retryable = False
    summary = (
        "a layer is corrupt or holds an entry that is not allowed (a path escaping the layer, "
        "a link trick, an entry over the size limit); the image is refused"
    )


class ImageInUse(ImageError):
    code = "image.in_use"
    retryable = False
    summary = "a sandbox uses this image; delete the sandbox first"


# -- claim family: warm pools and claims (the pool service) -------------------------------------


class ClaimError(SandpodError):
    code = "claim.error"
    summary = "the claim could not be served"


class PoolNotFound(ClaimError):
    code = "claim.pool_not_found"
    summary = "no SandboxWarmPool by that name in the namespace; create it (sandpod pool create)"


class ClaimTimeout(ClaimError):
    code = "claim.timeout"
    retryable = True
    summary = "the claimed sandbox was not ready in time; the claim stays and may still bind"


class ClaimFailed(ClaimError):
    code = "claim.failed"
    summary = "the claim's sandbox failed to start; see the claim's conditions for the reason"


# -- template family: template builds (the lifecycle's builder, the SDK's and CLI's build) -------


class TemplateError(SandpodError):
    code = "template.error"
    summary = "the template could not be built"


class BuildFailed(TemplateError):
    code = "template.build_failed"
    summary = "a build step failed; details name the step, and the log's tail says why"


class BuildUnsupported(TemplateError):
    code = "template.build_unsupported"
    summary = "the build uses something this platform cannot build (details name it)"


# -- snapshot family: snapshots of sandboxes (the lifecycle) ------------------------------------


class SnapshotError(SandpodError):
    code = "snapshot.error"
    summary = "the snapshot could not be taken or restored"


class SnapshotFailed(SnapshotError):
    code = "snapshot.failed"
    summary = "the snapshot failed; its conditions (and details) say why, and whether to retry"


class SnapshotInUse(SnapshotError):
    code = "snapshot.in_use"
    summary = "a sandbox or template restores from this snapshot; delete them first"


class SnapshotQuotaExceeded(SnapshotError):
    code = "snapshot.quota_exceeded"
    summary = (
        "the tenant's snapshots are at their quota (count or stored bytes); delete some "
        "(sandpod snapshot rm) or ask the operator to raise SANDPOD_SNAPSHOT_QUOTA_*"
    )


class SnapshotUnsupported(SnapshotError):
    code = "snapshot.unsupported"
    summary = "this runtime or sandbox cannot be snapshotted (details say why)"


# -- blob family: content-addressed blobs (snapshots) in an object store (sandpod_blobs) --------


class BlobError(SandpodError):
    code = "blob.error"
    summary = "the blob store refused the operation"


class BlobNotFound(BlobError):
    code = "blob.not_found"
    summary = "no blob with this digest in the store"


class BlobCorrupt(BlobError):
    code = "blob.corrupt"
    summary = (
        "the stored bytes do not match their digest (size or sha256): the object was altered "
        "in the store; nothing was written, and the blob must be stored again from its source"
    )


class BlobInvalidDigest(BlobError):
    code = "blob.invalid_digest"
    summary = "not a blob digest: expected sha256:<64 lowercase hex digits>"


class BlobAuthFailed(BlobError):
    code = "blob.auth_failed"
    summary = (
        "the object store refused the credentials (wrong key or secret, or no access to the "
        "bucket); check the store's access key settings"
    )


class BlobUnavailable(BlobError):
    code = "blob.unavailable"
    retryable = True
    summary = "the object store could not be reached or stopped mid-transfer; retry"


# -- store family: the resource store (JetStream KV embedded, Kubernetes CRDs in clusters) --------


class StoreError(SandpodError):
    code = "store.error"
    retryable = True
    summary = "the resource store failed; retry"


class ResourceNotFound(StoreError):
    code = "store.not_found"
    retryable = False
    summary = "no such resource"


class ResourceExists(StoreError):
    code = "store.already_exists"
    retryable = False
    summary = "a resource with this name exists"


class ResourceConflict(StoreError):
    code = "store.conflict"
    retryable = True
    summary = "the resource changed since it was read (resourceVersion); re-read and retry"


class ResourceInvalid(StoreError):
    code = "store.invalid"
    retryable = False
    summary = "the resource does not satisfy its schema"


class ResourceExpired(StoreError):
    code = "store.expired"
    retryable = False
    summary = (
        "the revision to watch from is older than the store keeps (compacted); "
        "list again and watch from the list's revision"
    )


class InsufficientStorage(StoreError):
    code = "store.insufficient_storage"
    retryable = False
    summary = (
        "JetStream cannot reserve the storage a stream or bucket needs (details: stream, "
        "reserve_bytes and the account's figures); free disk space on the NATS server, raise "
        "its jetstream max_file_store (or the account's limit), or make the stream smaller"
    )


class VolumeInUse(StoreError):
    code = "store.in_use"
    retryable = True
    summary = (
        "the SandboxVolume is mounted by another sandbox (details name the holders); "
        "delete or wait for them, or mount it read-only"
    )


class VolumeQuotaExceeded(StoreError):
    code = "store.quota_exceeded"
    retryable = False
    summary = (
        "the tenant's SandboxVolumes would exceed a quota (details: quota, limit, setting); "
        "delete some or ask the operator to raise the setting"
    )


def _family_fallback(code: str) -> type[SandpodError]:
    """Map an unknown code to the closest known one: its longest known dot-prefix
    (``exec.spawn_failed.x`` -> ``exec.spawn_failed``, ``bad_request.x`` -> ``bad_request``),
    else ``<first segment>.error`` (``exec.x`` -> ``exec.error``), else ``internal``."""
    parts = code.split(".")
    for end in range(len(parts) - 1, 0, -1):
        if (prefix := ".".join(parts[:end])) in _BY_CODE:
            return _BY_CODE[prefix]
    return _BY_CODE.get(f"{parts[0]}.error", InternalError)


def error_from_wire(wire: Mapping[str, Any]) -> SandpodError:
    """Build the exception for a decoded wire error.

    Unknown codes (from a newer peer) map to their family's base class, keeping the code, so old
    clients still branch correctly on family and ``retryable``.
    """
    code = str(wire.get("code", "internal"))
    message = str(wire.get("message", ""))
    details = wire.get("details") or {}
    if not isinstance(details, Mapping):
        details = {}
    cls = _BY_CODE.get(code) or _family_fallback(code)
    err = cls(message or None)
    # Set, not passed as keywords: a detail may be named like a parameter ("message").
    err.details = {str(k): v for k, v in details.items()}
    if cls.code != code:
        # A newer peer's code: keep it verbatim on the instance.
        err.code = code  # type: ignore[misc]
    retryable = wire.get("retryable")
    if isinstance(retryable, bool) and retryable != cls.retryable:
        err.retryable = retryable  # type: ignore[misc]
    return err


def error_catalogue() -> list[dict[str, Any]]:
    """Every known error code with its class, retryability and meaning (for docs and vectors)."""
    return [
        {"code": cls.code, "retryable": cls.retryable, "summary": cls.summary}
        for cls in _BY_CODE.values()
    ]
