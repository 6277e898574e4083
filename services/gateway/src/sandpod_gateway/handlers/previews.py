"""``/v1/sandboxes/{name}/previews``: preview URLs of a sandbox's ports, and port-forwarding.

- ``POST …/previews`` ``{port, public?, ttl_seconds?}``: the URLs of ``port`` (path form, and host
  form when ``SANDPOD_GATEWAY_PREVIEW_DOMAIN`` is set). Without ``public`` they carry a signed
  link (``?token=``) valid ``ttl_seconds`` (default ``SANDPOD_GATEWAY_PREVIEW_LINK_TTL``); with
  ``public: true`` the port is recorded as public on the Sandbox (lifecycle's ``expose``) and the
  URLs need no credentials at all.
- ``DELETE …/previews/{port}``: the port is private again (on every replica within
  ``SANDPOD_GATEWAY_PREVIEW_CACHE_TTL``). Links already handed out keep working until they expire;
  revoke the key that asked for them to end them at once.
- ``GET …/previews``: the public ports.
- WebSocket ``…/port-forward/{port}``: a TCP connection to the port, bytes as binary frames (see
  :func:`sandpod_gateway.wsrelay.relay_tcp`); what ``sandpod port-forward`` uses.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.websockets import WebSocket

from sandpod_contract.errors import (
    BadRequest,
    ResourceNotFound,
    SandboxUnavailable,
    SandpodError,
)
from sandpod_contract.messages.sandboxes import Expose, ObjectReply
from sandpod_gateway.context import Context, context, principal
from sandpod_gateway.errors import error_response, sandbox_not_found
from sandpod_gateway.handlers.common import handler, read_json
from sandpod_gateway.preview import MAX_LABEL, host_label, path_prefix
from sandpod_gateway.targets import SandboxPorts, public_ports
from sandpod_gateway.tenancy import LIFECYCLE_NAMESPACE
from sandpod_gateway.wsrelay import relay_tcp

__all__ = ["create", "list_", "port_forward", "remove"]


def _port(value: object, field: str = "port") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise BadRequest(f"{field}: a TCP port 1..65535", field=field)
    return value


def _path_port(request: Request | WebSocket) -> int:
    raw = request.path_params["port"]
    if not raw.isdigit():
        raise BadRequest("port: a TCP port 1..65535", field="port")
    return _port(int(raw))


async def _sandbox(request: Request | WebSocket) -> tuple[str, SandboxPorts]:
    """(the tenant's name, the sandbox as the preview proxy sees it). Raises 404."""
    name = request.path_params["name"]
    sid = principal(request).scope.own_id(name)  # the tenant's name, or its id (the SDK's)
    found = await context(request).targets.get(sid) if sid else None
    if found is None:
        raise sandbox_not_found(name)
    return name, found


def _base(request: Request, ctx: Context) -> str:
    return ctx.settings.public_url or str(request.base_url).rstrip("/")


def host_url(base: str, domain: str | None, sid: str, port: int) -> tuple[str | None, str | None]:
    """The host-form URL (``{port}-{id}.{domain}``, with ``base``'s scheme and port), or None
    and why not: no preview domain, or a label longer than DNS allows (a long sandbox id)."""
    if not domain:
        return None, None
    label = host_label(sid, port)
    if len(label) > MAX_LABEL:
        return None, (
            f"{label!r} is longer than a DNS label's {MAX_LABEL} characters: use url, "
            "or give the sandbox a shorter name"
        )
    scheme, _, rest = base.partition("://")
    hostport = rest.split("/", 1)[0]
    port_part = f":{hostport.rsplit(':', 1)[1]}" if ":" in hostport else ""
    return f"{scheme}://{label}.{domain}{port_part}/", None


def _urls(request: Request, sid: str, port: int, token: str | None) -> dict[str, Any]:
    ctx = context(request)
    query = f"?token={token}" if token else ""
    out: dict[str, Any] = {"url": f"{_base(request, ctx)}{path_prefix(sid, port)}/{query}"}
    out["host_url"], reason = host_url(_base(request, ctx), ctx.settings.preview_domain, sid, port)
    if out["host_url"] is not None:
        out["host_url"] += query
    elif reason:
        out["host_url_reason"] = reason
    return out


async def _expose(request: Request, sid: str, port: int, public: bool) -> dict[str, Any]:
    ctx = context(request)
    msg = Expose(name=sid, namespace=LIFECYCLE_NAMESPACE, port=port, public=public)
    tenant = principal(request).scope.tenant
    try:
        reply = await ctx.upstream.api("sandboxes", "expose", msg, ObjectReply, tenant=tenant)
    except ResourceNotFound:
        raise sandbox_not_found(request.path_params["name"]) from None
    ctx.targets.forget(sid)
    return reply.object


@handler
async def create(request: Request) -> Response:
    """The preview URLs of a port: signed links, or public (``public: true``)."""
    body = await read_json(request)
    port = _port(body.data.get("port"))
    public = body.flag("public")
    ctx = context(request)
    s = ctx.settings
    ttl = body.number("ttl_seconds", s.preview_link_ttl) or s.preview_link_ttl
    if not 0 < ttl <= s.preview_link_max_ttl:
        raise BadRequest(
            f"ttl_seconds: 1..{s.preview_link_max_ttl:g} (SANDPOD_GATEWAY_PREVIEW_LINK_MAX_TTL)",
            field="ttl_seconds",
        )
    name, found = await _sandbox(request)
    sid = found.sandbox_id
    reply: dict[str, Any] = {"sandbox": name, "port": port, "public": public}
    if public:
        await _expose(request, sid, port, True)
        reply.update(_urls(request, sid, port, None), token=None, expires_at=None)
    else:
        who = principal(request)
        link = ctx.signer.sign(who.scope.tenant, who.key.key_id, sid, port, ttl)
        token = ctx.signer.token(link)
        reply.update(_urls(request, sid, port, token), token=token, expires_at=link.expires)
    reply["address_ready"] = found.address is not None
    return JSONResponse(reply, status_code=201)


@handler
async def remove(request: Request) -> Response:
    """Make a port private again."""
    port = _path_port(request)
    name, found = await _sandbox(request)
    obj = await _expose(request, found.sandbox_id, port, False)
    ports = sorted(public_ports((obj.get("metadata") or {}).get("annotations")))
    return JSONResponse({"sandbox": name, "port": port, "public": False, "public_ports": ports})


@handler
async def list_(request: Request) -> Response:
    """The sandbox's public ports, with their URLs."""
    name, found = await _sandbox(request)
    items = [
        {"port": p, "public": True, **_urls(request, found.sandbox_id, p, None)}
        for p in sorted(found.public)
    ]
    return JSONResponse({"sandbox": name, "items": items, "checked_at": time.time()})


async def port_forward(ws: WebSocket) -> None:
    """Relay this WebSocket to a TCP connection to the sandbox's port."""
    try:
        port = _path_port(ws)
        _, found = await _sandbox(ws)
        if found.address is None:
            raise SandboxUnavailable(
                f"sandbox {ws.path_params['name']!r} has no network address: its runtime "
                "does not publish one (yet)"
            )
        slot = context(ws).quotas.stream(principal(ws).scope.tenant)
    except SandpodError as exc:
        await ws.send_denial_response(error_response(exc))
        return
    with slot:
        try:
            await relay_tcp(ws, found.address, port, context(ws).settings.preview_connect_timeout)
        except SandpodError as exc:
            await ws.send_denial_response(error_response(exc))
