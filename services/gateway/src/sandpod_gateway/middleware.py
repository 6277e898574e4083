"""The ASGI layer in front of every route: request id, limits, authentication, rate limit, the
canonical log line and metrics.

Pure ASGI (not Starlette's BaseHTTPMiddleware) so streamed bodies, SSE and WebSockets pass
through untouched. Order per request: request id (the client's ``X-Request-Id`` if sane, else a
fresh one; echoed in every response) -> header size limit (431) -> API key (401) -> per-key rate
limit (429) -> route. WebSocket refusals are sent as an HTTP response before the handshake
completes (the ASGI ``websocket.http.response`` extension), so clients see the same JSON errors.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from urllib.parse import parse_qs

import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandpod_contract.errors import InternalError, SandpodError
from sandpod_gateway.context import Context, Principal
from sandpod_gateway.errors import (
    HeadersTooLarge,
    RateLimited,
    Unauthenticated,
    error_body,
    http_status,
)
from sandpod_gateway.tenancy import Scope as TenantScope

__all__ = ["PUBLIC_PATHS", "GatewayMiddleware"]

log = structlog.get_logger("sandpod.gateway.http")

PUBLIC_PATHS = ("/healthz", "/readyz", "/metrics", "/openapi.json", "/", "/terminal")
PUBLIC_PREFIXES = ("/static/",)
_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


class GatewayMiddleware:
    def __init__(self, app: ASGIApp, ctx: Context) -> None:
        self.app = app
        self.ctx = ctx

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        rid = _request_id(headers)
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
            elif message["type"] == "websocket.close" and not status[0]:
                status[0] = 403
            await send(message)

        tenant = ""
        try:
            error, extra = await self._admit(scope, headers)
            if error is not None:
                await self._refuse(scope, send_with_id, error, extra)
            else:
                tenant = scope["state"].get("principal").scope.tenant if scope["state"].get(
                    "principal") else ""  # fmt: skip
                await self._guarded(scope, receive, send_with_id, status)
        finally:
            route = _route(scope)
            elapsed = time.perf_counter() - started
            self.ctx.metrics.requests.labels(scope.get("method", "WS"), route, str(status[0])).inc()
            self.ctx.metrics.latency.labels(scope.get("method", "WS"), route).observe(elapsed)
            log.info(
                "http_request", method=scope.get("method", "WS"), route=route,
                status=status[0], ms=round(elapsed * 1000, 2), tenant=tenant or None,
            )  # fmt: skip
            structlog.contextvars.unbind_contextvars("request_id")

    async def _guarded(self, scope: Scope, receive: Receive, send: Send, status: list[int]) -> None:
        """Run the app; an unexpected exception becomes a JSON ``internal`` error (with the
        request id) if the response has not started, and is logged either way."""
        try:
            await self.app(scope, receive, send)
        except Exception as exc:
            log.exception("handler_crashed", path=scope["path"])
            if not status[0]:
                await self._refuse(scope, send, InternalError(f"{type(exc).__name__}"), {})

    async def _admit(
        self, scope: Scope, headers: list[tuple[bytes, bytes]]
    ) -> tuple[SandpodError | None, dict[str, str]]:
        size = sum(len(k) + len(v) + 4 for k, v in headers)
        if size > self.ctx.settings.max_header_bytes:
            self.ctx.metrics.rejected.labels("headers_too_large").inc()
            return HeadersTooLarge(limit=self.ctx.settings.max_header_bytes), {}
        path: str = scope["path"]
        if path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES):
            return None, {}
        token = _token(scope, headers)
        try:
            key = await self.ctx.keys.verify(token or "")
        except Unauthenticated as exc:
            self.ctx.metrics.rejected.labels("unauthenticated").inc()
            return exc, {"www-authenticate": 'Bearer realm="sandpod"'}
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

    async def _refuse(
        self, scope: Scope, send: Send, error: SandpodError, extra: dict[str, str]
    ) -> None:
        body = json.dumps(error_body(error)).encode()
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode()),
                   *((k.encode(), v.encode()) for k, v in extra.items())]  # fmt: skip
        prefix = "websocket." if scope["type"] == "websocket" else ""
        if prefix and "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008})
            return
        await send({"type": f"{prefix}http.response.start", "status": http_status(error.code),
                    "headers": headers})  # fmt: skip
        await send({"type": f"{prefix}http.response.body", "body": body})


def _request_id(headers: list[tuple[bytes, bytes]]) -> str:
    for k, v in headers:
        if k == b"x-request-id":
            value = v.decode("latin-1")
            if _REQUEST_ID.fullmatch(value):
                return value
    return uuid.uuid4().hex


def _token(scope: Scope, headers: list[tuple[bytes, bytes]]) -> str | None:
    for k, v in headers:
        if k == b"authorization":
            scheme, _, value = v.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                return value.strip()
        elif k == b"x-api-key":
            return v.decode("latin-1").strip()
    if scope["type"] == "websocket":  # browsers cannot set headers on a WebSocket
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        values = query.get("token")
        return values[0] if values else None
    return None


def _route(scope: Scope) -> str:
    """The matched route's template (bounded label), else a fixed placeholder."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return str(path) if path else "unmatched"
