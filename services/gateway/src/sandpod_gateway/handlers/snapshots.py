"""``/v1/snapshots`` and ``/v1/sandboxes/{name}/snapshots``, ``.../fork``: snapshots (the
lifecycle's ``<prefix>.api.snapshots.*``) per tenant.

Snapshot names follow the sandbox naming of :mod:`sandpod_gateway.tenancy` (a tenant's
``prepared`` is ``acme--prepared`` upstream), and so does a snapshot's source. Every request
goes on the tenant's own subject, so the lifecycle, not the gateway, decides what is the
tenant's; another tenant's snapshot answers the same 404 as a missing one. A restore is a
sandbox create with ``spec.snapshotRef`` (``POST /v1/sandboxes``), or ``fork``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandpod_contract.errors import ResourceInvalid, ResourceNotFound
from sandpod_contract.messages.sandboxes import (
    ObjectReply,
    ObjectRequest,
    ObjectsReply,
    Ref,
    Selection,
)
from sandpod_gateway.context import context, principal
from sandpod_gateway.errors import sandbox_not_found
from sandpod_gateway.handlers.common import handler, read_json
from sandpod_gateway.handlers.pools import _id, _path_id, _rename
from sandpod_gateway.tenancy import LIFECYCLE_NAMESPACE, Scope

__all__ = ["create", "delete", "fork", "get", "list_"]

MAX_WAIT = 600.0
MAX_FORKS = 100
API = "sandpod.dev/v1alpha1"


def _out(scope: Scope, obj: dict[str, Any]) -> dict[str, Any] | None:
    meta = dict(obj.get("metadata") or {})
    name = _rename(scope, meta.get("name"))
    if name is None:
        return None
    meta.update(name=name, namespace=scope.tenant)
    spec = dict(obj.get("spec") or {})
    if isinstance(spec.get("sourceRef"), dict):
        spec["sourceRef"] = {"name": _rename(scope, spec["sourceRef"].get("name"))}
    status = dict(obj.get("status") or {})
    if status.get("parent"):
        status["parent"] = _rename(scope, status["parent"])
    return {**obj, "metadata": meta, "spec": spec, "status": status}


async def _api(request: Request, verb: str, msg: Any, reply: type[Any], wait: float = 0) -> Any:
    tenant = principal(request).scope.tenant
    up = context(request).upstream
    return await up.api("snapshots", verb, msg, reply, (wait + 10) if wait else None, tenant=tenant)


@handler
async def create(request: Request) -> Response:
    """Snapshot sandbox ``{name}``: ``{name?, ttl_seconds?, retain_count?, wait?}``; answers
    once it is Ready (or with ``snapshot.failed``)."""
    scope = principal(request).scope
    source = request.path_params["name"]
    sid = scope.sandbox_id(source)
    if sid is None:
        raise sandbox_not_found(source)
    body = await read_json(request, optional=True)
    spec: dict[str, Any] = {"sourceRef": {"name": sid}}
    if (ttl := body.integer("ttl_seconds")) is not None:
        spec["ttlSeconds"] = ttl
    if (keep := body.integer("retain_count")) is not None:
        spec["retainCount"] = keep
    meta: dict[str, Any] = {"namespace": LIFECYCLE_NAMESPACE}
    if name := body.text("name"):
        meta["name"] = _id(scope, "snapshot", name)
    obj = {"apiVersion": API, "kind": "SandboxSnapshot", "metadata": meta, "spec": spec}
    wait = min(body.number("wait", MAX_WAIT) or MAX_WAIT, MAX_WAIT)
    try:
        reply = await _api(
            request, "create", ObjectRequest(object=obj, wait_ready=wait), ObjectReply, wait
        )
    except ResourceNotFound:
        raise sandbox_not_found(source) from None
    out = _out(scope, reply.object)
    if out is None:
        raise ResourceNotFound("snapshot not found", kind="snapshot")
    return JSONResponse(out, status_code=201)


@handler
async def list_(request: Request) -> Response:
    """The tenant's snapshots (``?source=<sandbox>``: of one sandbox)."""
    scope = principal(request).scope
    req = Selection(namespace=LIFECYCLE_NAMESPACE, limit=1000)
    reply = await _api(request, "list", req, ObjectsReply)
    items = [o for o in (_out(scope, i) for i in reply.items) if o is not None]
    if source := request.query_params.get("source"):
        items = [
            o for o in items if (o.get("spec") or {}).get("sourceRef", {}).get("name") == source
        ]
    items.sort(key=lambda o: str(o["metadata"].get("creationTimestamp")))
    return JSONResponse({"items": items, "truncated": reply.truncated})


@handler
async def get(request: Request) -> Response:
    scope, name, sid = _path_id(request, "snapshot")
    reply = await _api(request, "get", Ref(name=sid, namespace=LIFECYCLE_NAMESPACE), ObjectReply)
    out = _out(scope, reply.object)
    if out is None:
        raise ResourceNotFound(f"snapshot {name!r} not found", kind="snapshot", name=name)
    return JSONResponse(out)


@handler
async def delete(request: Request) -> Response:
    """Delete a snapshot (409 ``snapshot.in_use`` while a sandbox or template restores from it)."""
    scope, name, sid = _path_id(request, "snapshot")
    reply = await _api(request, "delete", Ref(name=sid, namespace=LIFECYCLE_NAMESPACE), ObjectReply)
    return JSONResponse(_out(scope, reply.object) or {"metadata": {"name": name}})


@handler
async def fork(request: Request) -> Response:
    """``{n?, snapshot?, wait?}``: ``n`` new sandboxes with sandbox ``{name}``'s files (a
    snapshot taken now, or ``snapshot``); their names."""
    scope = principal(request).scope
    source = request.path_params["name"]
    if scope.sandbox_id(source) is None:
        raise sandbox_not_found(source)
    body = await read_json(request, optional=True)
    n = body.integer("n", 1) or 1
    if not 1 <= n <= MAX_FORKS:
        raise ResourceInvalid(f"n must be 1..{MAX_FORKS}", field="n")
    wait = min(body.number("wait", 60.0) or 60.0, MAX_WAIT)
    snap = body.text("snapshot") or await _snapshot_of(request, scope, source)
    snap_id = _id(scope, "snapshot", snap)
    up = context(request).upstream

    async def one() -> str:
        obj = {
            "apiVersion": API,
            "kind": "Sandbox",
            "metadata": {},
            "spec": {"snapshotRef": {"name": snap_id}},
        }
        reply = await up.api(
            "sandboxes",
            "create",
            ObjectRequest(object=obj, wait_ready=wait),
            ObjectReply,
            wait + 10,
            tenant=scope.tenant,
        )
        return str(_rename(scope, reply.object["metadata"]["name"]))

    names = await asyncio.gather(*(one() for _ in range(n)))
    return JSONResponse({"snapshot": snap, "sandboxes": names}, status_code=201)


async def _snapshot_of(request: Request, scope: Scope, source: str) -> str:
    """A new snapshot of the tenant's sandbox ``source``; its (tenant's) name."""
    sid = scope.sandbox_id(source)
    obj = {
        "apiVersion": API,
        "kind": "SandboxSnapshot",
        "metadata": {"namespace": LIFECYCLE_NAMESPACE},
        "spec": {"sourceRef": {"name": sid}},
    }
    try:
        reply = await _api(
            request, "create", ObjectRequest(object=obj, wait_ready=MAX_WAIT), ObjectReply, MAX_WAIT
        )
    except ResourceNotFound:
        raise sandbox_not_found(source) from None
    return str(_rename(scope, reply.object["metadata"]["name"]))
