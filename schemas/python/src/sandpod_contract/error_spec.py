"""What a client needs beyond an error's code: its ``details`` keys and the transport's errors.

``details`` is a free map on the wire, but a client in another language must know which keys a
code carries to use them without guessing: :data:`DETAILS` lists, per code, the keys every
sender includes (``required``) and the ones it may include (``optional``), each with its wire
type. Keys not listed may appear (a newer peer); ignore them. ``bad_request`` carries a stable
``reason`` from :data:`BAD_REQUEST_REASONS` (never an exception class name) and ``field`` (the
bad field's path) whenever the reason is about one field.

:data:`TRANSPORT` is the one table of NATS-level conditions a client sees without any reply, and
the code it reports for each. ``errors.json`` renders both; ``tests/contract`` checks the error
vectors and the servers' errors against :data:`DETAILS`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

__all__ = [
    "BAD_REQUEST_REASONS",
    "DETAILS",
    "FIELD_REASONS",
    "TRANSPORT",
    "Detail",
    "Details",
    "Transport",
    "missing_details",
]


@dataclasses.dataclass(frozen=True, slots=True)
class Detail:
    """One ``details`` key: its wire type (a JSON Schema type name) and meaning."""

    type: str
    doc: str


@dataclasses.dataclass(frozen=True, slots=True)
class Details:
    """The ``details`` keys of one code."""

    required: Mapping[str, Detail] = dataclasses.field(default_factory=dict)
    optional: Mapping[str, Detail] = dataclasses.field(default_factory=dict)


# bad_request.details.reason: why the request was refused, stable for programs to branch on.
BAD_REQUEST_REASONS: Mapping[str, str] = {
    "invalid_msgpack": "not one msgpack value (empty, truncated, malformed, trailing bytes, "
    "a map key that is not a str, nesting too deep)",
    "invalid_utf8": "a msgpack str that is not valid UTF-8",
    "ext_type": "a msgpack ext value (any ext type, the timestamp -1 included): never sent",
    "not_a_map": "the payload (or a nested message) is not a map",
    "missing_field": "a required field is absent or nil",
    "wrong_type": "a field has the wrong msgpack type (str for bin, float for int, ...)",
    "invalid_value": "a value breaks a rule of the operation (range, pattern, exactly one of "
    "several fields, a signal the host does not know, a reserved key...)",
}
# The reasons that are always about one field: ``field`` is then required.
FIELD_REASONS = frozenset({"missing_field", "wrong_type"})


def _d(type_: str, doc: str) -> Detail:
    return Detail(type_, doc)


_FIELD = _d(
    "string",
    "path of the bad field, e.g. argv[0], env.PATH, spec.replicas ('' never: "
    "absent when no single field is at fault)",
)
_PATH = {"path": _d("string", "the path as the client named it (under /workspace)")}
_LIMIT = _d("integer", "the limit that was reached")
_REF = _d("string", "the image reference as given (python:3.12-slim, oci:/path, ...)")
_STATUS = _d("integer", "the registry's HTTP status")
_DIGEST = _d("string", "the blob's digest (sha256:<hex>)")

DETAILS: Mapping[str, Details] = {
    "bad_request": Details(
        required={"reason": _d("string", "one of BAD_REQUEST_REASONS")},
        optional={
            "field": _FIELD,
            "key": _d("string", "a reserved label/annotation key or env name"),
            "acked_seq": _d("integer", "exec.resume: frames up to this seq were released"),
            "signal": _d("integer", "the signal number the host does not know"),
            "deliver": _d("string", "a deliver subject that is not allowed"),
        },
    ),
    "bad_request.too_large": Details(
        required={"limit": _d("integer", "the largest payload accepted (bytes)")},
        optional={"size": _d("integer", "the payload's size (bytes)")},
    ),
    "bad_request.unsupported_version": Details(
        required={
            "type": _d("string", "the message type"),
            "version": _d("integer", "the version received"),
            "supported": _d("integer", "the newest version the receiver knows"),
        }
    ),
    "bad_request.unknown_subject": Details(optional={"subject": _d("string", "the subject")}),
    "busy": Details(optional={"limit": _LIMIT}),
    "timeout": Details(
        optional={
            "subject": _d("string", "the request's subject"),
            "timeout": _d("number", "seconds"),
        }
    ),
    "sandbox.jail_refused": Details(
        required={
            "sandbox_id": _d("string", "the sandbox"),
            "reason": _d("string", "why the jail file is refused"),
        }
    ),
    "sandbox.not_found": Details(optional={"sandbox_id": _d("string", "the sandbox")}),
    "sandbox.unavailable": Details(optional={"sandbox_id": _d("string", "the sandbox")}),
    "sandbox.paused": Details(optional={"sandbox_id": _d("string", "the sandbox")}),
    "exec.not_found": Details(required={"exec_id": _d("string", "the exec id")}),
    "exec.id_in_use": Details(required={"exec_id": _d("string", "the exec id")}),
    "exec.spawn_failed": Details(
        required={"program": _d("string", "the program (argv[0] or the shell)")},
        optional={"errno": _d("integer", "the OS error number")},
    ),
    "exec.command_not_found": Details(required={"program": _d("string", "the program")}),
    "exec.invalid_cwd": Details(
        required={"cwd": _d("string", "the working directory as the sandbox sees it")}
    ),
    "fs.not_found": Details(required=_PATH),
    "fs.already_exists": Details(required=_PATH),
    "fs.is_a_directory": Details(required=_PATH),
    "fs.not_a_directory": Details(required=_PATH),
    "fs.not_empty": Details(required=_PATH),
    "fs.permission_denied": Details(required=_PATH),
    "fs.invalid_path": Details(
        optional={**_PATH, "limit": _LIMIT, "length": _d("integer", "the path's length")}
    ),
    "fs.too_large": Details(
        required={"limit": _LIMIT},
        optional={**_PATH, "size": _d("integer", "the file's size (bytes)")},
    ),
    "fs.error": Details(optional={**_PATH, "errno": _d("integer", "the OS error number")}),
    "fs.upload_not_found": Details(required={"upload_id": _d("string", "the upload id")}),
    "proc.not_found": Details(required={"proc_id": _d("string", "the process id")}),
    "proc.id_in_use": Details(required={"proc_id": _d("string", "the process id")}),
    "session.not_found": Details(required={"session_id": _d("string", "the session id")}),
    "session.already_exists": Details(required={"session_id": _d("string", "the session id")}),
    "session.dead": Details(optional={"session_id": _d("string", "the session id")}),
    "pty.not_found": Details(required={"pty_id": _d("string", "the pty id")}),
    "pty.id_in_use": Details(required={"pty_id": _d("string", "the pty id")}),
    "pty.closed": Details(required={"pty_id": _d("string", "the pty id")}),
    "watch.not_found": Details(required={"watch_id": _d("string", "the watch id")}),
    "watch.limit": Details(optional={"limit": _LIMIT}),
    "git.timeout": Details(required={"timeout": _d("number", "the timeout (seconds)")}),
    "git.not_found": Details(optional={"ref": _d("string", "the ref"), "url": _d("string", "")}),
    "image.error": Details(optional={"reference": _REF, "status": _STATUS}),
    "image.not_found": Details(
        required={"reference": _REF},
        optional={"platform": _d("string", "the platform asked for, e.g. linux/amd64")},
    ),
    "image.auth_failed": Details(
        required={"registry": _d("string", "the registry host")}, optional={"status": _STATUS}
    ),
    "image.digest_mismatch": Details(
        required={
            "expected": _d("string", "the digest the manifest named (sha256:<hex>)"),
            "actual": _d("string", "the digest of what arrived"),
        },
        optional={"reference": _REF},
    ),
    "image.unsupported": Details(
        optional={
            "reference": _REF,
            "media_type": _d("string", "the media type not supported"),
        }
    ),
    "image.layer_refused": Details(
        required={"reason": _d("string", "why: path_escape, too_large, corrupt, ...")},
        optional={
            "entry": _d("string", "the layer entry's name (absent when the whole stream is bad)"),
            "digest": _d("string", "the layer's digest"),
            "limit": _LIMIT,
        },
    ),
    "image.in_use": Details(
        required={"reference": _REF},
        optional={"holders": _d("array", "the ids of the sandboxes using it")},
    ),
    "claim.pool_not_found": Details(required={"pool": _d("string", "the pool's name")}),
    "claim.timeout": Details(
        required={
            "claim": _d("string", "the claim's name"),
            "reason": _d("string", "the claim's Bound condition reason, e.g. PoolExhausted"),
        }
    ),
    "claim.failed": Details(
        required={
            "claim": _d("string", "the claim's name"),
            "reason": _d("string", "why, e.g. SandboxFailed"),
        }
    ),
    "template.build_failed": Details(
        required={
            "template": _d("string", "the template's name"),
            "step": _d("integer", "the failing step, 1-based"),
        },
        optional={
            "instruction": _d("string", "the step, as build logs show it"),
            "exit_code": _d("integer", "the run step's exit code"),
            "log_tail": _d("string", "the last lines of the step's output"),
        },
    ),
    "template.build_unsupported": Details(
        required={"what": _d("string", "what cannot be built, e.g. an instruction")},
        optional={"line": _d("integer", "its line in the Dockerfile")},
    ),
    "blob.error": Details(
        optional={
            "digest": _DIGEST,
            "status": _d("integer", "the object store's HTTP status"),
            "s3_code": _d("string", "the S3 error code, e.g. NoSuchBucket"),
        }
    ),
    "blob.not_found": Details(required={"digest": _DIGEST}),
    "blob.corrupt": Details(
        required={"digest": _DIGEST},
        optional={
            "actual": _d("string", "the digest of what the store returned"),
            "size": _d("integer", "the size the store returned, in bytes"),
        },
    ),
    "blob.invalid_digest": Details(required={"digest": _d("string", "the string given")}),
    "blob.auth_failed": Details(optional={"status": _d("integer", "HTTP status")}),
    "blob.unavailable": Details(optional={"digest": _DIGEST}),
    "store.not_found": Details(
        optional={"kind": _d("string", "the resource kind"), "name": _d("string", "its name")}
    ),
    "store.already_exists": Details(
        optional={"kind": _d("string", "the resource kind"), "name": _d("string", "its name")}
    ),
    "store.conflict": Details(
        optional={"kind": _d("string", "the resource kind"), "name": _d("string", "its name")}
    ),
    "store.invalid": Details(optional={"field": _FIELD}),
    "store.expired": Details(required={"kind": _d("string", "the resource kind")}),
    "store.quota_exceeded": Details(
        required={
            "quota": _d("string", "volumes (their count) or volume_bytes (their sizes' sum)"),
            "limit": _d("integer", "the quota"),
            "setting": _d("string", "the setting that raises it"),
        }
    ),
    "store.insufficient_storage": Details(
        required={
            "stream": _d("string", "the JetStream stream (KV_<bucket>, OBJ_<bucket> for buckets)"),
            "reserve_bytes": _d("integer", "what it would reserve (0: no limit of its own)"),
        },
        optional={
            "account_reserved_bytes": _d("integer", "what the account's streams reserve already"),
            "account_stored_bytes": _d("integer", "what the account's streams hold"),
            "account_limit_bytes": _d("integer", "the account's storage limit (-1: none)"),
            "account_streams": _d("integer", "how many streams the account has"),
            "setting": _d("string", "the setting that sizes the stream, if one does"),
        },
    ),
    "store.in_use": Details(
        required={"name": _d("string", "the volume")},
        optional={"holders": _d("string", "the sandboxes holding it, comma-separated")},
    ),
}


def missing_details(code: str, details: Mapping[str, object]) -> list[str]:
    """The keys ``code`` requires that ``details`` lacks (``field`` for a field reason too)."""
    spec = DETAILS.get(code, Details())
    missing = [k for k in spec.required if k not in details]
    if code == "bad_request" and details.get("reason") in FIELD_REASONS and "field" not in details:
        missing.append("field")
    return missing


@dataclasses.dataclass(frozen=True, slots=True)
class Transport:
    """A NATS-level condition (no reply from any Sandpod server) and what a client reports."""

    condition: str
    seen: str
    code: str
    doc: str


TRANSPORT: tuple[Transport, ...] = (
    Transport(
        "no responders (a status-503 reply; needs a headers-capable connection)",
        "request on the data plane <prefix>.sbx.<sandbox>.*",
        "sandbox.not_found",
        "no execd serves the sandbox (wrong id, not running yet, deleted)",
    ),
    Transport(
        "no responders, while probing a request already sent (liveness probing)",
        "exec.status / exec.resume probes",
        "sandbox.unavailable",
        "the execd that had the request is gone",
    ),
    Transport(
        "no responders",
        "request on the control plane <prefix>.api.* or the node plane <prefix>.node.*",
        "internal",
        "the lifecycle/pool service (or that node's execd) is not running; retryable",
    ),
    Transport(
        "no reply within the request's deadline",
        "any request",
        "timeout",
        "details.subject, details.timeout; a permission violation on the request subject also "
        "ends here (the server refuses it asynchronously)",
    ),
    Transport(
        "maximum payload exceeded (the message is larger than the server's max_payload)",
        "any request or publish, refused by the client library before sending (or by the "
        "server with -ERR 'Maximum Payload Violation', closing the connection)",
        "bad_request.too_large",
        "details.limit = the server's max_payload (sys.info.max_payload)",
    ),
    Transport(
        "connection closed, draining, or the outbound buffer is full while reconnecting",
        "any request or publish",
        "connection.lost",
        "retry once connected",
    ),
)
