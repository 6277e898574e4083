"""``/v1/sandboxes``: the control plane (lifecycle's ``<prefix>.api.sandboxes.*``) per tenant.

Names are the tenant's own (see :mod:`sandpod_gateway.tenancy`); lists are filtered to the
tenant, sorted by name and paged with an opaque cursor. A sandbox of another tenant and a missing
one get the same 404 body.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandpod_contract.errors import BadRequest, ResourceInvalid, ResourceNotFound
from sandpod_contract.messages.sandboxes import (
    ObjectReply,
    ObjectRequest,
    ObjectsReply,
    Ref,
    Renew,
    Selection,
)
from sandpod_contract.reserved import refuse_reserved
from sandpod_gateway.context import context, principal
from sandpod_gateway.errors import QuotaExceeded, sandbox_not_found
from sandpod_gateway.handlers.common import Body, handler, query_float, query_int, read_json
from sandpod_gateway.tenancy import LIFECYCLE_NAMESPACE, Scope
from sandpod_gateway.upstream import Upstream

__all__ = ["create", "delete", "get", "list_", "pause", "renew", "resume"]

MAX_PAGE = 1000
DEFAULT_PAGE = 100
MAX_WAIT = 300.0


def _out(scope: Scope, obj: dict[str, Any], name: str) -> dict[str, Any]:
    shown = scope.outbound(obj)
    if shown is None:  # lifecycle answered about an object this tenant cannot own
        raise sandbox_not_found(name)
    return shown


def _ref(request: Request) -> tuple[Scope, str, str]:
    scope = principal(request).scope
    name = request.path_params["name"]
    sid = scope.sandbox_id(name)
    if sid is None:
        raise sandbox_not_found(name)
    return scope, name, sid


async def _call(
    request: Request, verb: str, msg: Any, name: str, timeout: float = 0
) -> ObjectReply:
    up: Upstream = context(request).upstream
    tenant = principal(request).scope.tenant
    try:
        return await up.api("sandboxes", verb, msg, ObjectReply, timeout or None, tenant=tenant)
    except ResourceNotFound:
        raise sandbox_not_found(name) from None


@handler
async def create(request: Request) -> Response:
    """Create a sandbox; waits until it is Ready (or failed) for up to ``wait`` seconds."""
    body = await read_json(request, optional=True)
    scope = principal(request).scope
    meta = Body(body.obj("metadata") or {})
    name = meta.text("name") or body.text("name") or f"sbx-{uuid.uuid4().hex[:10]}"
    if scope.sandbox_id(name) is None:
        raise ResourceInvalid(
            f"invalid sandbox name {name!r}: a DNS label of at most {scope.max_name} characters "
            "without '--'",
            field="metadata.name",
        )
    labels = meta.text_map("labels") or body.text_map("labels")
    annotations = meta.text_map("annotations")
    obj = {
        "apiVersion": "sandpod.dev/v1alpha1",
        "kind": "Sandbox",
        "metadata": {
            "name": name,
            **({"labels": labels} if labels else {}),
            **({"annotations": annotations} if annotations else {}),
        },
        "spec": body.obj("spec") or {},
    }
    refuse_reserved(obj)  # lifecycle refuses it too; this is only an earlier, same error
    wait = min(body.number("wait", 60.0) or 0.0, MAX_WAIT)
    who = principal(request)
    if (body.obj("spec") or {}).get("permanent") and not who.key.permanent:
        raise QuotaExceeded(
            "permanent_sandboxes",
            0,
            "keys create --allow-permanent",
            scope.tenant,
            hint="use an API key created with `sandpod_gateway keys create --allow-permanent`, "
            "or give the sandbox a lifetime",
        )
    req = ObjectRequest(object=scope.inbound(obj, name), wait_ready=wait or None)
    pending = context(request).pending_creates.setdefault(scope.tenant, set())
    await _check_count(request, scope, pending, name)
    pending.add(name)
    try:
        reply = await _call(request, "create", req, name, timeout=wait + 10)
    finally:
        pending.discard(name)
        if not pending:
            context(request).pending_creates.pop(scope.tenant, None)
    return JSONResponse(_out(scope, reply.object, name), status_code=201)


async def _check_count(request: Request, scope: Scope, pending: set[str], name: str) -> None:
    """Refuse a create once the tenant has ``tenant_max_sandboxes`` sandboxes, counting the
    creates this replica has in flight (by name, so one already stored is not counted twice)."""
    ctx = context(request)
    limit = ctx.settings.tenant_max_sandboxes
    req = Selection(namespace=LIFECYCLE_NAMESPACE, selector=None, limit=MAX_PAGE)
    reply = await ctx.upstream.api("sandboxes", "list", req, ObjectsReply, tenant=scope.tenant)
    held = {str(o["metadata"]["name"]) for o in map(scope.outbound, reply.items) if o is not None}
    held |= pending
    held.discard(name)  # an existing name fails as a conflict, not as a quota
    if len(held) >= limit:
        raise QuotaExceeded(
            "sandboxes",
            limit,
            "SANDPOD_GATEWAY_TENANT_MAX_SANDBOXES",
            scope.tenant,
            hint="delete one first, or ask the operator to raise "
            "SANDPOD_GATEWAY_TENANT_MAX_SANDBOXES",
        )


@handler
async def get(request: Request) -> Response:
    """One sandbox."""
    scope, name, sid = _ref(request)
    reply = await _call(request, "get", Ref(name=sid, namespace=LIFECYCLE_NAMESPACE), name)
    return JSONResponse(_out(scope, reply.object, name))


@handler
async def list_(request: Request) -> Response:
    """The tenant's sandboxes matching ``selector``, by name, ``limit`` per page."""
    scope = principal(request).scope
    limit = min(query_int(request, "limit", DEFAULT_PAGE, minimum=1), MAX_PAGE)
    after = _decode_cursor(request.query_params.get("cursor"))
    selector = request.query_params.get("selector") or None
    req = Selection(namespace=LIFECYCLE_NAMESPACE, selector=selector, limit=MAX_PAGE)
    reply = await context(request).upstream.api(
        "sandboxes", "list", req, ObjectsReply, tenant=scope.tenant
    )  # lifecycle narrows it to the tenant (the subject's)
    items = sorted(
        (o for o in (scope.outbound(i) for i in reply.items) if o is not None),
        key=lambda o: str(o["metadata"]["name"]),
    )
    if after is not None:
        items = [o for o in items if str(o["metadata"]["name"]) > after]
    page = items[:limit]
    more = len(items) > limit
    cursor = _encode_cursor(str(page[-1]["metadata"]["name"])) if more and page else None
    return JSONResponse({"items": page, "next_cursor": cursor, "truncated": reply.truncated})


@handler
async def delete(request: Request) -> Response:
    """Delete a sandbox (waits up to ``wait`` seconds for its instance to be gone)."""
    scope, name, sid = _ref(request)
    wait = min(query_float(request, "wait", 0.0), MAX_WAIT)
    ref = Ref(name=sid, namespace=LIFECYCLE_NAMESPACE, wait=wait or None)
    reply = await _call(request, "delete", ref, name, timeout=wait + 10)
    return JSONResponse(_out(scope, reply.object, name))


@handler
async def renew(request: Request) -> Response:
    """Push the sandbox's shutdown time to now + ``seconds`` (or to ``shutdown_time``)."""
    scope, name, sid = _ref(request)
    body = await read_json(request)
    req = Renew(
        name=sid,
        namespace=LIFECYCLE_NAMESPACE,
        seconds=body.number("seconds"),
        shutdown_time=body.text("shutdown_time"),
    )
    reply = await _call(request, "renew", req, name)
    return JSONResponse(_out(scope, reply.object, name))


async def _mode(request: Request, verb: str) -> Response:
    scope, name, sid = _ref(request)
    wait = min(query_float(request, "wait", 30.0), MAX_WAIT) or 30.0
    ref = Ref(name=sid, namespace=LIFECYCLE_NAMESPACE, wait=wait)
    reply = await _call(request, verb, ref, name, timeout=wait + 10)
    return JSONResponse(_out(scope, reply.object, name))


@handler
async def pause(request: Request) -> Response:
    """Freeze the sandbox; returns once Paused (or after ``wait``)."""
    return await _mode(request, "pause")


@handler
async def resume(request: Request) -> Response:
    """Thaw the sandbox; returns once Running (or after ``wait``)."""
    return await _mode(request, "resume")


def _encode_cursor(name: str) -> str:
    return base64.urlsafe_b64encode(name.encode()).decode().rstrip("=")


def _decode_cursor(raw: str | None) -> str | None:
    if not raw:
        return None
    try:
        return base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode()
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise BadRequest("cursor: not a cursor from this API", field="cursor") from None
