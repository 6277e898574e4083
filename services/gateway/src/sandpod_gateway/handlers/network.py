"""``/v1/sandboxes/{name}/network``: a sandbox's egress policy, read (GET) and replaced (PUT).

A translator to lifecycle's ``sandboxes.network`` / ``sandboxes.set_network`` on the tenant's
own subject (the client core's control-plane call, as every ``/v1/sandboxes`` route): the
tenant is the API key's, so another tenant's sandbox answers exactly like a missing one (404).
The PUT body is the policy itself (``mode``, ``allow``, ``deny``, ``limits``, ``inject``; what
is absent takes its default), or ``{"reset": true}`` for the template's; ``generation`` makes
it conditional (409 when the sandbox changed since it was read), ``wait`` (seconds, default 10)
waits for the runtime to apply it. A bad rule is a 422 ``resource.invalid`` naming the field.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandpod_contract.errors import BadRequest, ResourceNotFound
from sandpod_contract.messages.sandboxes import NetworkState, NetworkUpdate, Ref
from sandpod_gateway.context import context, principal
from sandpod_gateway.errors import sandbox_not_found
from sandpod_gateway.handlers.common import handler, message_json, read_json
from sandpod_gateway.tenancy import LIFECYCLE_NAMESPACE

__all__ = ["POLICY_FIELDS", "get", "put"]

POLICY_FIELDS = ("mode", "allow", "deny", "limits", "inject")
DEFAULT_WAIT = 10.0
MAX_WAIT = 60.0


async def _call(request: Request, verb: str, msg: Any, name: str, timeout: float) -> Response:
    tenant = principal(request).scope.tenant
    try:
        state = await context(request).upstream.api(
            "sandboxes", verb, msg, NetworkState, timeout, tenant=tenant
        )
    except ResourceNotFound:
        raise sandbox_not_found(name) from None
    body = message_json(state)
    body["name"] = name  # the tenant's own name, not the platform's id
    body.pop("namespace", None)
    return JSONResponse(body)


def _sid(request: Request) -> tuple[str, str]:
    name = request.path_params["name"]
    sid = principal(request).scope.sandbox_id(name)
    if sid is None:
        raise sandbox_not_found(name)
    return name, sid


@handler
async def get(request: Request) -> Response:
    """The sandbox's effective egress policy and what its runtime applied."""
    name, sid = _sid(request)
    return await _call(request, "network", Ref(name=sid, namespace=LIFECYCLE_NAMESPACE), name, 10)


@handler
async def put(request: Request) -> Response:
    """Replace the sandbox's egress policy (or reset it to its template's)."""
    name, sid = _sid(request)
    body = await read_json(request)
    unknown = set(body.data) - {*POLICY_FIELDS, "reset", "generation", "wait"}
    if unknown:
        field = sorted(unknown)[0]
        raise BadRequest(f"{field}: not a field of a network policy", field=field)
    reset = body.flag("reset")
    policy = {k: body.data[k] for k in POLICY_FIELDS if body.data.get(k) is not None}
    if reset and policy:
        raise BadRequest("reset: send either a policy or reset, not both", field="reset")
    wait = min(body.number("wait", DEFAULT_WAIT) or 0.0, MAX_WAIT)
    req = NetworkUpdate(
        name=sid,
        namespace=LIFECYCLE_NAMESPACE,
        policy=None if reset else policy,
        reset=True if reset else None,
        generation=body.integer("generation"),
        wait=wait or None,
    )
    return await _call(request, "set_network", req, name, wait + 10)
