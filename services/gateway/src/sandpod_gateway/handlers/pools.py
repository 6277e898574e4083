"""``/v1/pools`` and ``/v1/claims``: warm pools and claims (the pool service's
``<prefix>.api.{pools,claims}.*``) per tenant.

Pool and claim names follow the sandbox naming of :mod:`sandpod_gateway.tenancy` (a tenant's
``py`` is ``acme--py`` upstream), so a pool's members (``acme--py-<hex>``) and a claim's cold
sandbox (``acme--<claim>-<hex>``) are ids of the same tenant, and a claimed sandbox appears in
the tenant's ``/v1/sandboxes`` (the claim adds the tenant label to it). Every request goes on
the tenant's own subject, so the pool service, not the gateway, decides what is the tenant's.
Another tenant's pool or claim answers the same 404 as a missing one.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandpod_contract.errors import (
    PoolNotFound,
    ResourceInvalid,
    ResourceNotFound,
)
from sandpod_contract.messages.pools import Scale
from sandpod_contract.messages.sandboxes import (
    ObjectReply,
    ObjectRequest,
    ObjectsReply,
    Ref,
    Selection,
)
from sandpod_contract.reserved import refuse_reserved
from sandpod_gateway.context import context, principal
from sandpod_gateway.handlers.common import Body, handler, read_json
from sandpod_gateway.tenancy import LIFECYCLE_NAMESPACE, TENANT_LABEL, Scope

__all__ = [
    "claim_create",
    "claim_delete",
    "claim_get",
    "claim_list",
    "pool_create",
    "pool_delete",
    "pool_get",
    "pool_list",
    "pool_scale",
]

MAX_WAIT = 300.0
API = "sandpod.dev/v1alpha1"


def _not_found(kind: str, name: str) -> ResourceNotFound:
    return ResourceNotFound(f"{kind} {name!r} not found", kind=kind, name=name)


def _id(scope: Scope, kind: str, name: str | None, field: str = "name") -> str:
    sid = scope.sandbox_id(name) if name else None
    if sid is None:
        raise ResourceInvalid(
            f"invalid {kind} name {name!r}: a DNS label of at most {scope.max_name} characters "
            "without '--'",
            field=field,
        )
    return sid


def _path_id(request: Request, kind: str) -> tuple[Scope, str, str]:
    scope = principal(request).scope
    name = request.path_params["name"]
    sid = scope.sandbox_id(name)
    if sid is None:
        raise _not_found(kind, name)
    return scope, name, sid


async def _api(
    request: Request,
    kind: str,
    verb: str,
    msg: Any,
    reply: type[Any],
    *,
    timeout: float | None = None,
) -> Any:
    tenant = principal(request).scope.tenant
    return await context(request).upstream.api(kind, verb, msg, reply, timeout, tenant=tenant)


def _rename(scope: Scope, value: Any) -> Any:
    """An upstream id as this tenant's name (None when not the tenant's)."""
    return scope.name_of(value) if isinstance(value, str) else None


def _pool_out(scope: Scope, obj: dict[str, Any]) -> dict[str, Any] | None:
    meta = dict(obj.get("metadata") or {})
    name = _rename(scope, meta.get("name"))
    if name is None:  # ids map to names injectively: a name means the tenant's own
        return None
    meta.update(name=name, namespace=scope.tenant)
    return {**obj, "metadata": meta}


def _claim_out(scope: Scope, obj: dict[str, Any]) -> dict[str, Any] | None:
    out = _pool_out(scope, obj)
    if out is None:
        return None
    spec = dict(out.get("spec") or {})
    if isinstance(spec.get("poolRef"), dict):
        spec["poolRef"] = {"name": _rename(scope, spec["poolRef"].get("name"))}
    labels = dict(spec.get("labels") or {})
    labels.pop(TENANT_LABEL, None)
    if labels:
        spec["labels"] = labels
    else:
        spec.pop("labels", None)
    status = dict(out.get("status") or {})
    if status.get("sandbox"):
        status["sandbox"] = _rename(scope, status["sandbox"])
    return {**out, "spec": spec, "status": status}


def _one(out: dict[str, Any] | None, kind: str, name: str) -> dict[str, Any]:
    if out is None:
        raise _not_found(kind, name)
    return out


Out = Callable[[Scope, dict[str, Any]], dict[str, Any] | None]
_KINDS: dict[str, tuple[str, Out]] = {}  # API kind -> (what clients call it, how they see it)


async def _list(request: Request, api_kind: str) -> Response:
    """The tenant's objects of ``api_kind``."""
    _, out = _KINDS[api_kind]
    scope = principal(request).scope
    req = Selection(namespace=LIFECYCLE_NAMESPACE)  # the service narrows it to the tenant
    reply = await _api(request, api_kind, "list", req, ObjectsReply)
    return JSONResponse({"items": [o for o in (out(scope, i) for i in reply.items) if o]})


async def _one_call(request: Request, api_kind: str, verb: str, msg: Any = None) -> Response:
    """``verb`` on the object named in the path (a Ref unless ``msg`` is given); 404 alike for
    missing and foreign."""
    what, out = _KINDS[api_kind]
    scope, name, sid = _path_id(request, what)
    try:
        reply = await _api(request, api_kind, verb, msg or Ref(name=sid), ObjectReply)
    except ResourceNotFound:
        raise _not_found(what, name) from None
    return JSONResponse(_one(out(scope, reply.object), what, name))


# -- pools ---------------------------------------------------------------------------------------


@handler
async def pool_create(request: Request) -> Response:
    """Create or update a warm pool: ``{name, template?, replicas, strategy?}``."""
    body = await read_json(request)
    scope = principal(request).scope
    name = body.req_text("name")
    spec: dict[str, Any] = {
        "replicas": body.integer("replicas", 1),
        "updateStrategy": {"type": body.text("strategy", "RollingUpdate")},
    }
    if template := body.text("template"):
        spec["templateRef"] = {"name": template}
    obj = {
        "apiVersion": API,
        "kind": "SandboxWarmPool",
        "spec": spec,
        "metadata": {"name": _id(scope, "pool", name), "namespace": LIFECYCLE_NAMESPACE},
    }
    reply = await _api(request, "pools", "apply", ObjectRequest(object=obj), ObjectReply)
    return JSONResponse(_one(_pool_out(scope, reply.object), "pool", name), status_code=201)


@handler
async def pool_list(request: Request) -> Response:
    """The tenant's pools."""
    return await _list(request, "pools")


@handler
async def pool_get(request: Request) -> Response:
    return await _one_call(request, "pools", "get")


@handler
async def pool_scale(request: Request) -> Response:
    """Set the pool's replicas: ``{replicas}``."""
    _, _, sid = _path_id(request, "pool")
    replicas = (await read_json(request)).integer("replicas")
    if replicas is None:
        raise ResourceInvalid("replicas is required", field="replicas")
    return await _one_call(request, "pools", "scale", Scale(name=sid, replicas=replicas))


@handler
async def pool_delete(request: Request) -> Response:
    """Delete a pool; its free members go, claimed ones stay with their claims."""
    return await _one_call(request, "pools", "delete")


# -- claims --------------------------------------------------------------------------------------


@handler
async def claim_create(request: Request) -> Response:
    """Claim a ready sandbox: ``{pool | template, lifetime_seconds?, idle_timeout_seconds?,
    labels?, env?, name?, wait?}``; answers once it is bound and ready."""
    body = await read_json(request)
    scope = principal(request).scope
    name = body.text("name") or f"claim-{secrets.token_hex(5)}"
    spec: dict[str, Any] = {"labels": body.text_map("labels") or {}}
    if pool := body.text("pool"):
        spec["poolRef"] = {"name": _id(scope, "pool", pool, field="pool")}
    if template := body.text("template"):
        spec["templateRef"] = {"name": template}
    for field, key in (
        ("lifetime_seconds", "lifetimeSeconds"),
        ("idle_timeout_seconds", "idleTimeoutSeconds"),
    ):
        if (value := body.integer(field)) is not None:
            spec[key] = value
    if env := body.text_map("env"):
        spec["env"] = [{"name": k, "value": v} for k, v in env.items()]
    wait = min(max(_wait(body), 0.0), MAX_WAIT)
    obj = {
        "apiVersion": API,
        "kind": "SandboxClaim",
        "spec": spec,
        "metadata": {"name": _id(scope, "claim", name), "namespace": LIFECYCLE_NAMESPACE},
    }
    refuse_reserved(obj, spec_labels=True)  # the pool service refuses it too (the real check)
    try:
        reply = await _api(
            request,
            "claims",
            "create",
            ObjectRequest(object=obj, wait_ready=wait or None),
            ObjectReply,
            timeout=wait + 10,
        )
    except PoolNotFound:
        raise PoolNotFound(f"no pool {pool!r}", pool=pool) from None
    return JSONResponse(_one(_claim_out(scope, reply.object), "claim", name), status_code=201)


def _wait(body: Body) -> float:
    value = body.number("wait", 60.0)
    return 60.0 if value is None else value


@handler
async def claim_list(request: Request) -> Response:
    return await _list(request, "claims")


@handler
async def claim_get(request: Request) -> Response:
    return await _one_call(request, "claims", "get")


@handler
async def claim_delete(request: Request) -> Response:
    """Release a claim: its sandbox is deleted."""
    return await _one_call(request, "claims", "delete")


_KINDS.update(pools=("pool", _pool_out), claims=("claim", _claim_out))
