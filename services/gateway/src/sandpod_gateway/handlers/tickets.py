"""``POST /v1/ws-tickets``: trade the API key (in a header) for a single-use WebSocket ticket."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandpod_gateway.context import context, principal
from sandpod_gateway.handlers.common import handler

__all__ = ["create_ticket"]


@handler
async def create_ticket(request: Request) -> Response:
    """A ticket that opens one WebSocket of this key within ``expires_in`` seconds."""
    ctx = context(request)
    ticket = ctx.tickets.issue(principal(request).key)
    return JSONResponse(
        {"ticket": ticket, "expires_in": ctx.tickets.ttl},
        status_code=201,
        headers={"cache-control": "no-store"},
    )
