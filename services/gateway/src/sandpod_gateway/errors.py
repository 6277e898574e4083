"""Errors at the HTTP boundary: the wire's typed errors become ``{code, message, retryable}``.

Every failure a client sees is a JSON body with the contract's stable ``code`` (or one of the few
gateway-only codes below, which follow the same family rules: an unknown ``auth.*`` code maps to
``auth.error``), its ``message`` and ``retryable``, and an HTTP status chosen by the code's
family. Handlers raise contract exceptions; only this module decides statuses.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from sandpod_contract.errors import (
    BadRequest,
    Busy,
    SandboxNotFound,
    SandboxUnavailable,
    SandpodError,
)

__all__ = [
    "AuthError",
    "Forbidden",
    "HeadersTooLarge",
    "JsonTooDeep",
    "LinkExpired",
    "LinkInvalid",
    "MethodNotAllowed",
    "NotConfigured",
    "PortUnreachable",
    "QuotaExceeded",
    "RangeNotSatisfiable",
    "RateLimited",
    "RouteNotFound",
    "Unauthenticated",
    "error_body",
    "error_response",
    "http_status",
    "no_http_response",
    "port_unreachable",
    "sandbox_not_found",
]


class AuthError(SandpodError):
    """Gateway-only family: the request's credentials (never crosses NATS)."""

    code = "auth.error"
    summary = "authentication error"


class Unauthenticated(AuthError):
    code = "auth.unauthenticated"
    summary = "missing, unknown or revoked API key"


class Forbidden(AuthError):
    code = "auth.forbidden"
    summary = "this API key may not do that"


class LinkExpired(AuthError):
    code = "auth.link_expired"
    summary = "the preview link has expired: ask its owner for a fresh one"


class LinkInvalid(AuthError):
    code = "auth.link_invalid"
    summary = "the preview link is not valid for this sandbox and port (forged or altered)"


class PortUnreachable(SandboxUnavailable):
    """Nothing accepts connections on the sandbox's port (no server yet, or it exited)."""

    code = "sandbox.port_unreachable"
    summary = "nothing listens on that port of the sandbox"
    retryable = True


class RateLimited(Busy):
    code = "busy.rate_limited"
    summary = "too many requests for this API key; retry after the advertised delay"


class QuotaExceeded(Busy):
    """A tenant quota is full; ``details``: ``quota``, ``limit``, ``setting`` (what raises it)."""

    code = "busy.quota_exceeded"
    summary = "a quota of this tenant is full"

    def __init__(self, quota: str, limit: int, setting: str, tenant: str, hint: str = "") -> None:
        how = hint or f"close some first, or ask the operator to raise {setting}"
        super().__init__(
            f"tenant {tenant!r} is at its {quota} quota ({limit}): {how}",
            quota=quota,
            limit=limit,
            setting=setting,
        )


class NotConfigured(Busy):
    code = "busy.not_configured"
    summary = "this endpoint is not configured on this gateway; ask the administrator"


class RouteNotFound(BadRequest):
    code = "bad_request.unknown_route"
    summary = "no such endpoint"


class MethodNotAllowed(BadRequest):
    code = "bad_request.method_not_allowed"
    summary = "method not allowed on this endpoint"


class HeadersTooLarge(BadRequest):
    code = "bad_request.headers_too_large"
    summary = "request headers are too large"


class JsonTooDeep(BadRequest):
    code = "bad_request.json_too_deep"
    summary = "the JSON document is nested too deeply; flatten it"

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"JSON nested deeper than {limit} levels: send a flatter document", limit=limit
        )


class RangeNotSatisfiable(BadRequest):
    code = "bad_request.range_not_satisfiable"
    summary = "the requested byte range is outside the file"


# Most specific first: the first matching prefix decides.
_STATUS: tuple[tuple[str, int], ...] = (
    ("auth.unauthenticated", 401),
    ("auth.forbidden", 403),
    ("auth.link_expired", 401),
    ("auth.link_invalid", 403),
    ("auth.", 401),
    ("busy.rate_limited", 429),
    ("busy.quota_exceeded", 429),
    ("busy", 503),
    ("bad_request.too_large", 413),
    ("bad_request.unknown_route", 404),
    ("bad_request.method_not_allowed", 405),
    ("bad_request.headers_too_large", 431),
    ("bad_request.range_not_satisfiable", 416),
    ("bad_request", 400),
    ("timeout", 504),
    ("connection.lost", 503),
    ("sandbox.not_found", 404),
    ("sandbox.unavailable", 503),
    ("sandbox.port_unreachable", 502),
    ("store.not_found", 404),
    ("store.already_exists", 409),
    ("store.conflict", 409),
    ("store.in_use", 409),
    ("store.quota_exceeded", 429),
    ("store.invalid", 422),
    ("store.", 503),
    ("exec.not_found", 404),
    ("exec.id_in_use", 409),
    ("exec.stream_closed", 409),
    ("exec.lost", 502),
    ("exec.", 422),
    ("fs.not_found", 404),
    ("fs.upload_not_found", 404),
    ("fs.already_exists", 409),
    ("fs.not_empty", 409),
    ("fs.permission_denied", 403),
    ("fs.too_large", 413),
    ("fs.no_space", 507),
    ("fs.", 422),
    ("proc.not_found", 404),
    ("proc.id_in_use", 409),
    ("pty.not_found", 404),
    ("pty.id_in_use", 409),
    ("pty.closed", 410),
    ("watch.not_found", 404),
    ("watch.limit", 429),
    ("session.not_found", 404),
    ("git.", 422),
    ("claim.pool_not_found", 404),
    ("claim.timeout", 504),
    ("claim.failed", 422),
    ("claim.", 422),
    ("snapshot.in_use", 409),
    ("snapshot.quota_exceeded", 429),
    ("snapshot.unsupported", 501),
    ("snapshot.", 422),
    ("blob.unavailable", 503),
    ("internal", 500),
)


def http_status(code: str) -> int:
    """The HTTP status for a wire error code (unknown families: 500, or 422 for x.y codes)."""
    for prefix, status in _STATUS:
        if code == prefix or (prefix.endswith(".") and code.startswith(prefix)):
            return status
        if "." not in prefix and code.startswith(prefix + "."):
            return status
    return 422 if "." in code else 500


def error_body(err: SandpodError) -> dict[str, Any]:
    body: dict[str, Any] = {"code": err.code, "message": err.message, "retryable": err.retryable}
    if err.details:
        body["details"] = err.details
    return body


def error_response(err: SandpodError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(err), status_code=http_status(err.code), headers=headers)


def port_unreachable(port: int, exc: BaseException) -> PortUnreachable:
    """Connecting to ``port`` of a sandbox failed with ``exc``."""
    return PortUnreachable(
        f"nothing accepts connections on port {port} of the sandbox "
        f"({type(exc).__name__}): start a server listening on 0.0.0.0:{port} "
        "(or the sandbox's address) first",
        port=port,
    )


def no_http_response(port: int, reason: object) -> PortUnreachable:
    """``port`` of a sandbox took the request and closed without an HTTP response."""
    return PortUnreachable(
        f"port {port} of the sandbox closed the connection without an HTTP response ({reason})",
        port=port,
    )


def sandbox_not_found(name: str) -> SandboxNotFound:
    """The one answer for a sandbox that is missing, or belongs to another tenant (same bytes)."""
    return SandboxNotFound(f"sandbox {name!r} not found")
