"""The ASGI application: routes (one table), the middleware, and error handling for the rest.

Why Starlette on uvicorn: Starlette is a thin ASGI toolkit (routing, streamed request bodies,
``StreamingResponse``, WebSockets) with no validation layer of its own, so requests go straight
into the contract's typed messages with nothing between (FastAPI would add pydantic models that
duplicate the contract and cost time per request); uvicorn with uvloop and httptools is the
fastest mainstream ASGI server and speaks WebSockets (``websockets``) with protocol pings.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

from sandpod_contract.errors import InternalError
from sandpod_gateway.context import Context
from sandpod_gateway.errors import MethodNotAllowed, RouteNotFound, error_response
from sandpod_gateway.handlers import (
    credentials,
    events,
    exec,
    files,
    health,
    network,
    pools,
    previews,
    procs,
    sandboxes,
    snapshots,
    tickets,
    volumes,
    ws,
)
from sandpod_gateway.middleware import GatewayMiddleware

__all__ = ["build_app"]


class _Route(Route):
    """A route that records itself in the scope, so metrics label by its template."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["route"] = self
        await super().handle(scope, receive, send)


class _WsRoute(WebSocketRoute):
    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["route"] = self
        await super().handle(scope, receive, send)


def routes(ctx: Context) -> list[BaseRoute]:
    s = "/v1/sandboxes/{name}"
    table: list[BaseRoute] = [
        _Route("/healthz", health.healthz),
        _Route("/readyz", health.readyz),
        _Route("/metrics", health.metrics),
        _Route("/openapi.json", health.openapi),
        _Route("/", lambda r: RedirectResponse("/terminal")),
        _Route("/terminal", _terminal),
        _Route("/v1/ws-tickets", tickets.create_ticket, methods=["POST"]),
        _Route("/v1/sandboxes", sandboxes.list_, methods=["GET"]),
        _Route("/v1/sandboxes", sandboxes.create, methods=["POST"]),
        _Route(s, sandboxes.get, methods=["GET"]),
        _Route(s, sandboxes.delete, methods=["DELETE"]),
        _Route(f"{s}/renew", sandboxes.renew, methods=["POST"]),
        _Route(f"{s}/pause", sandboxes.pause, methods=["POST"]),
        _Route(f"{s}/resume", sandboxes.resume, methods=["POST"]),
        _Route(f"{s}/snapshots", snapshots.create, methods=["POST"]),
        _Route(f"{s}/fork", snapshots.fork, methods=["POST"]),
        _Route("/v1/snapshots", snapshots.list_, methods=["GET"]),
        _Route("/v1/snapshots/{name}", snapshots.get, methods=["GET"]),
        _Route("/v1/snapshots/{name}", snapshots.delete, methods=["DELETE"]),
        _Route(f"{s}/network", network.get, methods=["GET"]),
        _Route(f"{s}/network", network.put, methods=["PUT"]),
        _Route(f"{s}/exec", exec.run, methods=["POST"]),
        _Route(f"{s}/exec/stream", exec.stream, methods=["POST"]),
        _WsRoute(f"{s}/exec/ws", ws.exec_ws),
        _WsRoute(f"{s}/pty", ws.pty_ws),
        _Route(f"{s}/files/content", files.download, methods=["GET"]),
        _Route(f"{s}/files/content", files.upload, methods=["PUT"]),
        _Route(f"{s}/files/archive", files.archive, methods=["GET"]),
        _Route(f"{s}/files/archive", files.extract, methods=["PUT"]),
        _Route(f"{s}/files", files.list_, methods=["GET"]),
        _Route(f"{s}/files", files.remove, methods=["DELETE"]),
        _Route(f"{s}/files/stat", files.stat, methods=["GET"]),
        _Route(f"{s}/files/mkdir", files.mkdir, methods=["POST"]),
        _Route(f"{s}/files/move", files.move, methods=["POST"]),
        _Route(f"{s}/files/chmod", files.chmod, methods=["POST"]),
        _Route(f"{s}/files/search", files.search, methods=["POST"]),
        _Route(f"{s}/processes", procs.list_, methods=["GET"]),
        _Route(f"{s}/processes", procs.start, methods=["POST"]),
        _Route(f"{s}/processes/{{proc_id}}", procs.get, methods=["GET"]),
        _Route(f"{s}/processes/{{proc_id}}", procs.kill, methods=["DELETE"]),
        _Route(f"{s}/processes/{{proc_id}}/logs", procs.logs, methods=["GET"]),
        _Route(f"{s}/watch", events.watch, methods=["GET"]),
        _Route(f"{s}/previews", previews.list_, methods=["GET"]),
        _Route(f"{s}/previews", previews.create, methods=["POST"]),
        _Route(f"{s}/previews/{{port}}", previews.remove, methods=["DELETE"]),
        _WsRoute(f"{s}/port-forward/{{port}}", previews.port_forward),
        _Route("/v1/events", events.lifecycle_events, methods=["GET"]),
        _Route("/v1/pools", pools.pool_list, methods=["GET"]),
        _Route("/v1/pools", pools.pool_create, methods=["POST"]),
        _Route("/v1/pools/{name}", pools.pool_get, methods=["GET"]),
        _Route("/v1/pools/{name}", pools.pool_delete, methods=["DELETE"]),
        _Route("/v1/pools/{name}/scale", pools.pool_scale, methods=["POST"]),
        _Route("/v1/claims", pools.claim_list, methods=["GET"]),
        _Route("/v1/claims", pools.claim_create, methods=["POST"]),
        _Route("/v1/claims/{name}", pools.claim_get, methods=["GET"]),
        _Route("/v1/claims/{name}", pools.claim_delete, methods=["DELETE"]),
        _Route("/v1/volumes", volumes.volume_list, methods=["GET"]),
        _Route("/v1/volumes", volumes.volume_create, methods=["POST"]),
        _Route("/v1/volumes/{name}", volumes.volume_get, methods=["GET"]),
        _Route("/v1/volumes/{name}", volumes.volume_delete, methods=["DELETE"]),
        _Route("/v1/credentials/nats", credentials.nats, methods=["POST"]),
    ]
    if ctx.settings.web_dir.is_dir():
        table.append(Mount("/static", StaticFiles(directory=ctx.settings.web_dir)))
    return table


async def _terminal(request: Request) -> Response:
    page = request.app.state.ctx.settings.web_dir / "terminal.html"
    if not page.is_file():
        return HTMLResponse("web terminal assets are not installed", status_code=404)
    return HTMLResponse(page.read_text())


async def _http_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, HTTPException):  # registered for HTTPException only
        return error_response(InternalError(f"{type(exc).__name__} in routing"))
    if exc.status_code == 405:
        return error_response(MethodNotAllowed(f"{request.method} not allowed here"))
    if exc.status_code == 404:
        return error_response(RouteNotFound(f"no endpoint {request.url.path}"))
    return error_response(RouteNotFound(str(exc.detail)))


def build_app(ctx: Context) -> Starlette:
    app = Starlette(routes=routes(ctx), exception_handlers={HTTPException: _http_error})
    app.state.ctx = ctx
    app.add_middleware(GatewayMiddleware, ctx=ctx)
    return app
