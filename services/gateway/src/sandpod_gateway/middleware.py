"""The ASGI layer in front of every route: request id, limits, authentication, rate limit, the
canonical log line and metrics.

Pure ASGI (not Starlette's BaseHTTPMiddleware) so streamed bodies, SSE and WebSockets pass
through untouched. Order per request: request id (the client's ``X-Request-Id`` if sane, else a
fresh one; echoed in every response) -> header size limit (431) -> API key (401) -> per-key rate
limit (429) -> route. Preview URLs (``/v1/sandboxes/{id}/ports/{port}/…`` and the preview domain's
hosts) take their own admission (:mod:`sandpod_gateway.preview`) after the request id, with the
same log line and metrics. WebSocket refusals are sent as an HTTP response before the handshake
completes (the ASGI ``websocket.http.response`` extension), so clients see the same JSON errors.

Credentials: ``Authorization: Bearer <key>`` or ``X-API-Key`` on any request; a WebSocket may
instead offer the subprotocols ``sandpod`` and ``sandpod.key.<key>`` (or
``sandpod.ticket.<ticket>``; the server selects ``sandpod``), or carry ``?ticket=`` (single use,
from ``POST /v1/ws-tickets``). An API key in the URL (``?token=``) is refused: URLs end up in
logs. ``/metrics`` needs an admin key or the metrics token unless ``metrics_auth`` is ``none``.
"""

from __future__ import annotations

import hmac
import itertools
import json
import re
import secrets
import time
from urllib.parse import parse_qs

import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandpod_contract.errors import InternalError, SandpodError
from sandpod_gateway.context import Context, Principal
from sandpod_gateway.errors import (
    Forbidden,
    HeadersTooLarge,
    RateLimited,
    Unauthenticated,
    error_body,
    http_status,
)
from sandpod_gateway.preview import PreviewGate, PreviewRoute
from sandpod_gateway.tenancy import Scope as TenantScope

__all__ = [
    "PREVIEW_HOST",
    "PREVIEW_PATH",
    "PUBLIC_PATHS",
    "GatewayMiddleware",
    "record",
    "refusal",
    "refusal_headers",
    "request_id",
]

log = structlog.get_logger("sandpod.gateway.http")

PUBLIC_PATHS = ("/healthz", "/readyz", "/openapi.json", "/", "/terminal")
METRICS_PATH = "/metrics"
SUBPROTOCOL = "sandpod"
_KEY_PROTO = "sandpod.key."
_TICKET_PROTO = "sandpod.ticket."
PUBLIC_PREFIXES = ("/static/",)
_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
# Request ids made here: this process's random prefix and a counter (unique without a syscall
# per request, which uuid4 makes)
_ID_PREFIX = secrets.token_hex(8)
_ID_COUNTER = itertools.count()


class _Label:
    """A fixed route label for metrics and the log line (bounded: never a sandbox id)."""

    def __init__(self, path: str) -> None:
        self.path = path


PREVIEW_PATH = _Label("/v1/sandboxes/{name}/ports/{port}/{path}")
PREVIEW_HOST = _Label("{port}-{id}.<preview domain>")


class GatewayMiddleware:
    def __init__(self, app: ASGIApp, ctx: Context) -> None:
        self.app = app
        self.ctx = ctx
        self.preview = PreviewGate(ctx)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        rid = request_id(headers)
        structlog.contextvars.bind_contextvars(request_id=rid)
        scope.setdefault("state", {})["request_id"] = rid
        started = time.perf_counter()
        status = [0]
        rid_header = (b"x-request-id", rid.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] in ("http.response.start", "websocket.http.response.start"):
                status[0] = message["status"]
                message = {**message, "headers": [*message.get("headers", []), rid_header]}
            elif message["type"] == "websocket.accept":
                status[0] = 101
                message = {**message, "headers": [*message.get("headers", []), rid_header]}
                if SUBPROTOCOL in scope.get("subprotocols", ()) and not message.get("subprotocol"):
                    message["subprotocol"] = SUBPROTOCOL  # browsers insist on an echoed protocol
            elif message["type"] == "websocket.close" and not status[0]:
                status[0] = 403
            await send(message)

        tenant = ""
        preview = self.preview.match(scope)
        if preview is not None:
            scope["route"] = PREVIEW_HOST if preview.by_host else PREVIEW_PATH
        try:
            if preview is not None:
                tenant = await self._preview(scope, receive, send_with_id, status, preview)
                return
            error, extra = await self._admit(scope, headers)
            if error is not None:
                await self._refuse(scope, send_with_id, error, extra)
            else:
                tenant = (
                    scope["state"].get("principal").scope.tenant
                    if scope["state"].get("principal")
                    else ""
                )
                await self._guarded(scope, receive, send_with_id, status)
        finally:
            method = scope.get("method", "WS")
            elapsed = time.perf_counter() - started
            record(self.ctx, method, scope.get("route"), status[0], elapsed, tenant=tenant)
            structlog.contextvars.unbind_contextvars("request_id")

    async def _preview(
        self, scope: Scope, receive: Receive, send: Send, status: list[int], route: PreviewRoute
    ) -> str:
        """A preview request (see :mod:`sandpod_gateway.preview`): its own admission, then the
        relay; refusals are the usual JSON errors. Returns the caller's tenant (or "")."""
        if not route.by_host and not route.path and scope["type"] == "http":
            query = scope.get("query_string", b"").decode("latin-1")
            where = route.prefix + "/" + (f"?{query}" if query else "")
            await send(  # relative links of the app resolve below the prefix only with a "/"
                {
                    "type": "http.response.start",
                    "status": 308,
                    "headers": [(b"location", where.encode()), (b"content-length", b"0")],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return ""
        try:
            ok = await self.preview.admit(scope, route)
        except SandpodError as exc:
            self.ctx.metrics.rejected.labels(exc.code.split(".", 1)[0]).inc()
            extra = refusal_headers(exc)
            await self._refuse(scope, send, exc, extra)
            return ""
        structlog.contextvars.bind_contextvars(sandbox_id=ok.target.sandbox_id)
        try:
            await self.preview.serve(scope, receive, send, route, ok)
        except SandpodError as exc:
            if not status[0]:
                await self._refuse(scope, send, exc, {})
        except Exception:
            log.exception("preview_crashed", port=route.port)
            if not status[0]:
                await self._refuse(scope, send, InternalError("preview relay failed"), {})
        finally:
            structlog.contextvars.unbind_contextvars("sandbox_id")
        return ok.tenant or ""

    async def _guarded(self, scope: Scope, receive: Receive, send: Send, status: list[int]) -> None:
        """Run the app; an unexpected exception becomes a JSON ``internal`` error (with the
        request id) if the response has not started, and is logged either way."""
        try:
            await self.app(scope, receive, send)
        except Exception as exc:
            log.exception("handler_crashed", path=scope["path"])
            if not status[0]:
                await self._refuse(scope, send, InternalError(f"{type(exc).__name__}"), {})

    async def _admit(  # noqa: PLR0911 (one return per refusal)
        self, scope: Scope, headers: list[tuple[bytes, bytes]]
    ) -> tuple[SandpodError | None, dict[str, str]]:
        size = sum(len(k) + len(v) + 4 for k, v in headers)
        if size > self.ctx.settings.max_header_bytes:
            self.ctx.metrics.rejected.labels("headers_too_large").inc()
            return HeadersTooLarge(limit=self.ctx.settings.max_header_bytes), {}
        path: str = scope["path"]
        if path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES):
            return None, {}
        token, ticket = _credentials(scope, headers)
        if path == METRICS_PATH:
            return await self._admit_metrics(token)
        try:
            if ticket is not None:
                issued = self.ctx.tickets.redeem(ticket)
                if issued is None:
                    raise Unauthenticated(
                        "unknown, used or expired ticket: get a fresh one from "
                        "POST /v1/ws-tickets just before connecting"
                    )
                key = await self.ctx.keys.still_valid(issued)  # revoked since: refused
            else:
                key = await self.ctx.keys.verify(token or "")
        except Unauthenticated as exc:
            self.ctx.metrics.rejected.labels("unauthenticated").inc()
            refused = exc
            if scope["type"] == "websocket" and _query(scope, "token") is not None:
                refused = Unauthenticated(
                    "API keys in the URL are refused (URLs get logged): "
                    "send Authorization, the sandpod.key.<key> subprotocol "
                    "or a ?ticket= from POST /v1/ws-tickets"
                )
            return refused, {"www-authenticate": 'Bearer realm="sandpod"'}
        except SandpodError as exc:  # the key bucket is unreachable: retryable
            return exc, {}
        wait = self.ctx.limiter.take(key.key_id)
        if wait > 0:
            self.ctx.metrics.rejected.labels("rate_limited").inc()
            retry = max(1, int(wait + 0.999))
            return RateLimited(retry_after=retry), {"retry-after": str(retry)}
        scope["state"]["principal"] = Principal(key, TenantScope(key.tenant))
        structlog.contextvars.bind_contextvars(tenant=key.tenant)
        return None, {}

    async def _admit_metrics(self, token: str | None) -> tuple[SandpodError | None, dict[str, str]]:
        """``/metrics``: public with ``metrics_auth=none``; else the metrics token or an admin
        key."""
        s = self.ctx.settings
        if s.metrics_auth == "none":
            return None, {}
        if token and s.metrics_token and hmac.compare_digest(token, s.metrics_token):
            return None, {}
        try:
            key = await self.ctx.keys.verify(token or "")
        except Unauthenticated:
            self.ctx.metrics.rejected.labels("unauthenticated").inc()
            return Unauthenticated(
                "/metrics needs an admin API key (keys create --admin) or "
                "SANDPOD_GATEWAY_METRICS_TOKEN"
            ), {"www-authenticate": 'Bearer realm="sandpod"'}
        except SandpodError as exc:
            return exc, {}
        if not key.admin:
            return Forbidden(
                "/metrics needs an admin API key (keys create --admin) or the "
                "metrics token (SANDPOD_GATEWAY_METRICS_TOKEN)"
            ), {}
        return None, {}

    async def _refuse(
        self, scope: Scope, send: Send, error: SandpodError, extra: dict[str, str]
    ) -> None:
        status, headers, body = refusal(error, extra)
        prefix = "websocket." if scope["type"] == "websocket" else ""
        if prefix and "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008})
            return
        await send({"type": f"{prefix}http.response.start", "status": status, "headers": headers})
        await send({"type": f"{prefix}http.response.body", "body": body})


def record(
    ctx: Context,
    method: str,
    route: object,
    status: int,
    elapsed: float,
    *,
    tenant: str,
    **fields: object,
) -> None:
    """The canonical log line and the request metrics of one request (``fields``: what the
    caller has not bound to the log context)."""
    label = getattr(route, "path", None)
    label = str(label) if label else "unmatched"  # the route's template: a bounded label
    ctx.metrics.observe_request(method, label, status, elapsed)
    log.info(
        "http_request",
        **fields,
        method=method,
        route=label,
        status=status,
        ms=round(elapsed * 1000, 2),
        tenant=tenant or None,
    )


def refusal(
    error: SandpodError, extra: dict[str, str]
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """A refusal as an HTTP response: status, headers and the JSON error body."""
    body = json.dumps(error_body(error)).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *((k.encode(), v.encode()) for k, v in extra.items()),
    ]
    return http_status(error.code), headers, body


def refusal_headers(exc: SandpodError) -> dict[str, str]:
    """What a preview refusal adds: the auth challenge, or when to retry."""
    if exc.code.startswith("auth."):
        return {"www-authenticate": 'Bearer realm="sandpod"'}
    if "retry_after" in exc.details:
        return {"retry-after": str(exc.details["retry_after"])}
    return {}


def request_id(headers: list[tuple[bytes, bytes]]) -> str:
    for k, v in headers:
        if k == b"x-request-id":
            value = v.decode("latin-1")
            if _REQUEST_ID.fullmatch(value):
                return value
    return f"{_ID_PREFIX}{next(_ID_COUNTER):016x}"


def _credentials(scope: Scope, headers: list[tuple[bytes, bytes]]) -> tuple[str | None, str | None]:
    """(API key, ticket) the request carries; at most one is set."""
    for k, v in headers:
        if k == b"authorization":
            scheme, _, value = v.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                return value.strip(), None
        elif k == b"x-api-key":
            return v.decode("latin-1").strip(), None
    if scope["type"] != "websocket":
        return None, None
    for proto in scope.get("subprotocols", ()):  # browsers cannot set headers on a WebSocket
        if proto.startswith(_KEY_PROTO):
            return proto[len(_KEY_PROTO) :], None
        if proto.startswith(_TICKET_PROTO):
            return None, proto[len(_TICKET_PROTO) :]
    ticket = _query(scope, "ticket")
    return (None, ticket) if ticket is not None else (None, None)


def _query(scope: Scope, name: str) -> str | None:
    values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get(name)
    return values[0] if values else None
