"""``POST /v1/credentials/nats``: a NATS credential for the calling tenant, to talk to the bus
directly (the SDK, any NATS client) with the same reach as its API key and no more.

The credential (:func:`sandpod_bus.natsauth.tenant_creds`) may publish to the data plane of the
tenant's sandboxes as they are now (``<prefix>.sbx.<id>.>`` each; lifecycle lists them on the
tenant's own subject) and to the tenant's control subjects (``<prefix>.api.t.<tenant>.>``, where
the services take the tenant from the subject), and subscribe to its own inboxes only. It
expires after ``SANDPOD_GATEWAY_TENANT_CREDS_TTL``: mint again to reach sandboxes made since.
The gateway signs it with the NATS account's seed (``SANDPOD_NATS_ACCOUNT_SEED_FILE``).
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandpod_bus.natsauth import KeyPair, tenant_creds
from sandpod_contract.messages.sandboxes import ObjectsReply, Selection
from sandpod_gateway.context import context, principal
from sandpod_gateway.errors import NotConfigured
from sandpod_gateway.handlers.common import handler
from sandpod_gateway.tenancy import LIFECYCLE_NAMESPACE

__all__ = ["nats"]


def _signing_key(request: Request) -> KeyPair:
    path = context(request).settings.nats_account_seed_file
    if path is None:
        raise NotConfigured(
            "this gateway mints no NATS credentials (SANDPOD_NATS_ACCOUNT_SEED_FILE is unset); "
            "use the HTTP API, or ask the administrator for `sandpod creds nats --tenant`"
        )
    try:
        return KeyPair.from_seed(path.read_text())
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise NotConfigured(f"the gateway cannot read its NATS account seed ({why})") from exc


@handler
async def nats(request: Request) -> Response:
    """The tenant's NATS credential: ``{creds, inbox_prefix, tenant, prefix, expires_at,
    sandboxes: {name: id}}`` (connect with ``creds`` and ``inbox_prefix``; address sandboxes
    by id; control-plane requests on ``<prefix>.api.t.<tenant>.<kind>.<verb>``)."""
    ctx = context(request)
    key = _signing_key(request)
    scope = principal(request).scope
    listed = await ctx.upstream.api(
        "sandboxes",
        "list",
        Selection(namespace=LIFECYCLE_NAMESPACE),
        ObjectsReply,
        tenant=scope.tenant,
    )
    ids = [str(i["metadata"]["name"]) for i in listed.items]
    cred = tenant_creds(
        key,
        prefix=ctx.settings.prefix,
        tenant=scope.tenant,
        sandbox_ids=ids,
        now=int(time.time()),
        ttl=int(ctx.settings.tenant_creds_ttl),
        account=ctx.settings.nats_account_public,
    )
    body = {
        "creds": cred.creds,
        "inbox_prefix": cred.inbox_prefix,
        "tenant": scope.tenant,
        "prefix": ctx.settings.prefix,
        "expires_at": cred.expires,
        "sandboxes": {scope.name_of(i) or i: i for i in cred.sandboxes},
    }
    return JSONResponse(body, status_code=201, headers={"cache-control": "no-store"})
