"""Attacks on the gateway's edges: API keys in logs, stolen or replayed WebSocket tickets,
hostile JSON, and an unauthenticated /metrics.

Each runs against a real gateway process (its log file is what an operator ships) or the
in-process one, and checks that the tenant under attack still works afterwards.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest
from gateway_harness import (  # noqa: F401
    Gateway,
    GatewayFactory,
    GatewayProcess,
    gateway,
    gateway_procs,
    mint_key,
    start_gateway,
    unique_tenant,
)
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus
from websockets.typing import Subprotocol

from conftest import Execd, NatsServer
from sandpod_bus import Bus, BusSettings
from sandpod_gateway.keys import KeyStore
from sandpod_gateway.settings import GatewaySettings

__all__: list[str] = []

DEEP = b"[" * 100_000 + b"]" * 100_000


async def _key(nats: NatsServer, tenant: str, *, admin: bool = False) -> str:
    bus = await Bus.connect(BusSettings(url=nats.url))
    try:
        store = await KeyStore.open(bus, GatewaySettings().bucket_base)
        token, _ = await store.create(tenant, admin=admin)
        return token
    finally:
        await bus.drain()


async def _exit_of(ws: ClientConnection) -> tuple[bytes, int]:
    out = b""
    while True:
        msg = await ws.recv()
        if isinstance(msg, bytes):
            out += msg[1:]
        else:
            frame = json.loads(msg)
            if frame["type"] == "exit":
                return out, int(frame["exit_code"])
            assert frame["type"] in ("started", "keepalive"), frame


async def _ws_exec(url: str, command: str, **kw: object) -> tuple[bytes, int]:
    async with connect(url, **kw) as ws:  # type: ignore[arg-type]
        await ws.send(json.dumps({"shell": command}))
        return await _exit_of(ws)


async def test_no_key_or_ticket_in_the_gateway_log(
    nats: NatsServer, shared_execd: Execd, gateway_procs: Callable[..., GatewayProcess]
) -> None:
    """A browser-style client connects every way there is (ticket in the URL, ticket and key as
    subprotocols, the refused ?token=); the gateway's log, at info level, shows the handshakes
    but never the key's secret or a ticket. A ticket opens one socket, once, for its own
    tenant only."""
    gw = gateway_procs(SANDPOD_LOG_LEVEL="info")
    key = await _key(nats, "default")
    other = await _key(nats, unique_tenant())
    base = gw.url.replace("http://", "ws://") + "/v1/sandboxes/shared/exec/ws"
    async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:

        async def ticket(k: str) -> str:
            r = await c.post("/v1/ws-tickets", headers={"authorization": f"Bearer {k}"})
            assert r.status_code == 201, r.text
            assert 0 < r.json()["expires_in"] <= 60
            return str(r.json()["ticket"])

        t1 = await ticket(key)
        assert await _ws_exec(f"{base}?ticket={t1}", "echo via-url-ticket") == (
            b"via-url-ticket\n",
            0,
        )
        with pytest.raises(InvalidStatus) as replay:  # single use: a logged ticket is dead
            await _ws_exec(f"{base}?ticket={t1}", "echo again")
        assert replay.value.response.status_code == 401

        t2 = await ticket(key)
        protos = [Subprotocol("sandpod"), Subprotocol(f"sandpod.ticket.{t2}")]
        assert await _ws_exec(base, "echo via-proto-ticket", subprotocols=protos) == (
            b"via-proto-ticket\n",
            0,
        )

        protos = [Subprotocol("sandpod"), Subprotocol(f"sandpod.key.{key}")]
        assert await _ws_exec(base, "echo via-proto-key", subprotocols=protos) == (
            b"via-proto-key\n",
            0,
        )

        with pytest.raises(InvalidStatus) as in_url:  # the key in the URL is refused outright
            await _ws_exec(f"{base}?token={key}", "echo nope")
        assert in_url.value.response.status_code == 401
        assert "ws-tickets" in json.loads(in_url.value.response.body or b"{}")["message"]

        t3 = await ticket(other)  # another tenant's ticket: the sandbox does not exist for it
        async with connect(f"{base}?ticket={t3}") as ws:
            await ws.send(json.dumps({"shell": "echo x"}))
            err = json.loads(await ws.recv())
        assert err["code"] == "sandbox.not_found"

        # nothing else harmed: plain header auth still works on the same gateway
        r = await c.post(
            "/v1/sandboxes/shared/exec",
            json={"shell": "echo ok"},
            headers={"authorization": f"Bearer {key}"},
        )
        assert r.json()["stdout"] == "ok\n"

    log = gw.log.read_text()
    assert "WebSocket /v1/sandboxes/shared/exec/ws" in log, log[-2000:]  # handshakes are logged
    secret = key.rsplit("_", 1)[1]
    for needle in (secret, other.rsplit("_", 1)[1], t1, t2, t3):
        assert needle not in log, f"{needle[:8]}... is in gateway.log"


async def test_deeply_nested_json_is_a_400(
    nats: NatsServer, shared_execd: Execd, gateway_procs: Callable[..., GatewayProcess]
) -> None:
    """100 000 levels of ``[`` (under the size cap) in a request body and in a WebSocket's first
    frame: a typed 400, no RecursionError in the log; a body over the size cap is 413; the
    tenant's next request works."""
    gw = gateway_procs(SANDPOD_LOG_LEVEL="info")
    key = await _key(nats, "default")
    auth = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    async with httpx.AsyncClient(base_url=gw.url, timeout=30, headers=auth) as c:
        for path in (
            "/v1/sandboxes/shared/exec",
            "/v1/sandboxes",
            "/v1/claims",
            "/v1/sandboxes/shared/files/mkdir",
        ):
            r = await c.post(path, content=DEEP)
            assert r.status_code == 400, (path, r.status_code, r.text[:300])
            assert r.json()["code"] == "bad_request.json_too_deep", r.text
            assert "flatter" in r.json()["message"]
        nested = {"shell": "true", "env": {"A": "b"}, "x": json.loads("[" * 200 + "]" * 200)}
        r = await c.post("/v1/sandboxes/shared/exec", json=nested)  # parses, but still too deep
        assert r.json()["code"] == "bad_request.json_too_deep", r.text
        r = await c.post("/v1/sandboxes/shared/exec", content=b"[" * (2 << 20))
        assert r.status_code == 413 and r.json()["code"] == "bad_request.too_large"
        url = gw.url.replace("http://", "ws://") + "/v1/sandboxes/shared/exec/ws"
        async with connect(url, additional_headers={"authorization": f"Bearer {key}"}) as ws:
            await ws.send(DEEP.decode())
            err = json.loads(await ws.recv())
        assert err["code"] == "bad_request.json_too_deep"
        r = await c.post("/v1/sandboxes/shared/exec", json={"shell": "echo fine"})
        assert r.status_code == 200 and r.json()["stdout"] == "fine\n"
    log = gw.log.read_text()
    assert "RecursionError" not in log and "handler_crashed" not in log, log[-3000:]


async def test_metrics_needs_an_admin_key_or_the_metrics_token(
    start_gateway: GatewayFactory,
) -> None:
    """A tenant's key cannot read /metrics (other tenants' request counts, routes); an admin key
    and the metrics token can; ``metrics_auth=none`` makes it public again."""
    gw = await start_gateway(metrics_token="scrape-" + "s" * 32)
    tenant_key = await mint_key(gw, unique_tenant())
    admin_key = await mint_key(gw, "ops", admin=True)
    async with gw.client() as c:
        r = await c.get("/metrics")
        assert r.status_code == 401 and r.json()["code"] == "auth.unauthenticated"
        assert "--admin" in r.json()["message"]
        r = await c.get("/metrics", headers={"authorization": f"Bearer {tenant_key}"})
        assert r.status_code == 403 and r.json()["code"] == "auth.forbidden"
        r = await c.get("/metrics", headers={"authorization": "Bearer scrape-wrong"})
        assert r.status_code == 401
        for cred in (admin_key, "scrape-" + "s" * 32):
            r = await c.get("/metrics", headers={"authorization": f"Bearer {cred}"})
            assert r.status_code == 200 and "sandpod_gateway_requests_total" in r.text
        assert (await c.get("/healthz")).status_code == 200  # probes stay public
    open_gw = await start_gateway(metrics_auth="none")
    async with open_gw.client() as c:
        assert (await c.get("/metrics")).status_code == 200


def test_metrics_auth_setting_is_validated() -> None:
    """A typo in SANDPOD_GATEWAY_METRICS_AUTH fails at start-up, naming the choices."""
    assert GatewaySettings.from_env({}).metrics_auth == "admin"
    assert GatewaySettings.from_env({"SANDPOD_GATEWAY_METRICS_AUTH": "none"}).metrics_auth == "none"
    with pytest.raises(ValueError, match="'admin'"):
        GatewaySettings.from_env({"SANDPOD_GATEWAY_METRICS_AUTH": "off"})


async def test_a_ticket_dies_with_its_key(gateway: Gateway, shared_execd: Execd) -> None:
    """A ticket issued before its key was revoked opens nothing; the tenant's other key works."""
    doomed, spare = await mint_key(gateway, "default"), await mint_key(gateway, "default")
    async with gateway.client(doomed) as c:
        ticket = (await c.post("/v1/ws-tickets")).json()["ticket"]
    store = await KeyStore.open(gateway.bus, gateway.service.settings.bucket_base)
    await store.revoke(doomed.split("_")[1])
    url = gateway.url.replace("http://", "ws://") + "/v1/sandboxes/shared/exec/ws"
    with pytest.raises(InvalidStatus) as refused:
        await _ws_exec(f"{url}?ticket={ticket}", "echo nope")
    assert refused.value.response.status_code == 401
    async with gateway.client(spare) as c:
        ticket = (await c.post("/v1/ws-tickets")).json()["ticket"]
    assert await _ws_exec(f"{url}?ticket={ticket}", "echo spare") == (b"spare\n", 0)
