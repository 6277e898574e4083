"""What every handler needs, built once by the service and reached through ``app.state``."""

from __future__ import annotations

import asyncio
import dataclasses

from starlette.requests import HTTPConnection

from sandpod_gateway.keys import ApiKey, KeyStore
from sandpod_gateway.links import LinkSigner
from sandpod_gateway.metrics import GatewayMetrics
from sandpod_gateway.proxy import ConnectionPool
from sandpod_gateway.quotas import Quotas
from sandpod_gateway.ratelimit import RateLimiter
from sandpod_gateway.settings import GatewaySettings
from sandpod_gateway.targets import Targets
from sandpod_gateway.tenancy import Scope
from sandpod_gateway.tickets import TicketStore
from sandpod_gateway.upstream import Upstream

__all__ = ["Context", "Principal", "context", "principal"]


@dataclasses.dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the verified key and its tenant's scope."""

    key: ApiKey
    scope: Scope


@dataclasses.dataclass
class Context:
    settings: GatewaySettings
    upstream: Upstream
    keys: KeyStore
    limiter: RateLimiter
    metrics: GatewayMetrics
    quotas: Quotas  # streams and execs per tenant, and the replica's stream ceiling
    tickets: TicketStore  # single-use WebSocket tickets
    ready: asyncio.Event
    targets: Targets  # sandboxes' addresses and public ports (preview URLs), cached briefly
    signer: LinkSigner  # signed preview links
    preview_pool: ConnectionPool  # keep-alive connections to sandboxes' ports
    # sandbox names each tenant is creating on this replica (counted against its quota)
    pending_creates: dict[str, set[str]] = dataclasses.field(default_factory=dict)


def context(conn: HTTPConnection) -> Context:
    ctx: Context = conn.app.state.ctx
    return ctx


def principal(conn: HTTPConnection) -> Principal:
    who: Principal = conn.scope["state"]["principal"]
    return who
