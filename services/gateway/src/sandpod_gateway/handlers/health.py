"""Health, readiness, metrics and the OpenAPI document (no API key needed)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandpod_gateway.context import context
from sandpod_gateway.openapi import spec

__all__ = ["healthz", "metrics", "openapi", "readyz"]


async def healthz(request: Request) -> Response:
    """The process serves HTTP."""
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Ready when connected to NATS and the key bucket is open."""
    ctx = context(request)
    ok = ctx.ready.is_set() and ctx.upstream.bus.is_connected
    return JSONResponse(
        {"status": "ready" if ok else "not_ready", "nats": ctx.upstream.bus.is_connected},
        status_code=200 if ok else 503,
    )


async def metrics(request: Request) -> Response:
    """Prometheus text exposition of the gateway's registry."""
    return Response(
        generate_latest(context(request).metrics.registry), media_type=CONTENT_TYPE_LATEST
    )


async def openapi(request: Request) -> Response:
    """The OpenAPI 3.1 document of this API."""
    return JSONResponse(spec())
