"""``/v1/volumes``: SandboxVolumes (the lifecycle's ``<prefix>.api.volumes.*``) per tenant.

Volume names follow the sandbox naming of :mod:`sandpod_gateway.tenancy` (a tenant's ``data``
is ``acme--data`` upstream); the holders in a volume's status are shown as the tenant's sandbox
names. Every request goes on the tenant's own subject, so the lifecycle, not the gateway,
decides what is the tenant's; another tenant's volume answers the same 404 as a missing one.
Sandboxes mount volumes with ``spec.volumes`` in ``POST /v1/sandboxes`` (names as here).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandpod_contract.messages.sandboxes import ObjectReply, ObjectRequest
from sandpod_gateway.context import principal
from sandpod_gateway.handlers.common import handler, read_json
from sandpod_gateway.handlers.pools import _KINDS, API, _api, _id, _list, _one, _one_call, _pool_out
from sandpod_gateway.tenancy import LIFECYCLE_NAMESPACE, Scope

__all__ = ["volume_create", "volume_delete", "volume_get", "volume_list"]


def _volume_out(scope: Scope, obj: dict[str, Any]) -> dict[str, Any] | None:
    out = _pool_out(scope, obj)
    if out is None:
        return None
    status = dict(out.get("status") or {})
    if status.get("writer"):
        status["writer"] = scope.name_of(str(status["writer"]))
    status["readers"] = [scope.name_of(str(r)) for r in status.get("readers") or ()]
    return {**out, "status": status}


@handler
async def volume_create(request: Request) -> Response:
    """Create a volume: ``{name, size, storage_class?}``; its storage is made before the
    answer."""
    body = await read_json(request)
    scope = principal(request).scope
    name = body.req_text("name")
    spec: dict[str, Any] = {"size": body.req_text("size")}
    if storage_class := body.text("storage_class"):
        spec["storageClassName"] = storage_class
    obj = {
        "apiVersion": API,
        "kind": "SandboxVolume",
        "spec": spec,
        "metadata": {"name": _id(scope, "volume", name), "namespace": LIFECYCLE_NAMESPACE},
    }
    reply = await _api(request, "volumes", "create", ObjectRequest(object=obj), ObjectReply)
    return JSONResponse(_one(_volume_out(scope, reply.object), "volume", name), status_code=201)


@handler
async def volume_list(request: Request) -> Response:
    """The tenant's volumes."""
    return await _list(request, "volumes")


@handler
async def volume_get(request: Request) -> Response:
    return await _one_call(request, "volumes", "get")


@handler
async def volume_delete(request: Request) -> Response:
    """Delete a volume and its data; 409 (store.in_use) while a sandbox mounts it."""
    return await _one_call(request, "volumes", "delete")


_KINDS.update(volumes=("volume", _volume_out))
