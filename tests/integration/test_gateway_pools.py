"""Gateway: warm pools and claims over HTTP, tenant-scoped, through real lifecycle and pool
services."""

from __future__ import annotations

import asyncio
import time

import httpx
from gateway_harness import (  # noqa: F401
    GatewayFactory,
    lifecycle_prefix,
    mint_key,
    pool_service,
    start_gateway,
)

__all__: list[str] = []


async def _until(c: httpx.AsyncClient, url: str, done: object, timeout: float = 60) -> dict:  # type: ignore[type-arg]
    """GET ``url`` until ``done(json)``; each answer is a fresh read of the store."""
    deadline = time.monotonic() + timeout
    while True:
        r = await c.get(url)
        if r.status_code == 200 and done(r.json()):  # type: ignore[operator]
            return r.json()  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, f"{url}: {r.status_code} {r.text[:300]}"
        await asyncio.sleep(0.1)


async def test_pools_and_claims_over_http_are_tenant_scoped(
    start_gateway: GatewayFactory, pool_service: str
) -> None:
    """A tenant creates a pool, claims a warm sandbox with env, runs a command in it, sees it
    in its sandboxes and releases it; another tenant reaches none of it (404) and cannot claim
    from the pool."""
    gw = await start_gateway(prefix=pool_service)
    acme, other = await mint_key(gw, "acme"), await mint_key(gw, "other")
    async with gw.client(acme) as c, gw.client(other) as o:
        deadline = time.monotonic() + 30
        while (
            r := await c.post("/v1/pools", json={"name": "py", "replicas": 2})
        ).status_code == 503:
            assert time.monotonic() < deadline, r.text  # the services are still starting
            await asyncio.sleep(0.1)
        assert r.status_code == 201, r.text
        assert r.json()["metadata"] == {**r.json()["metadata"], "name": "py", "namespace": "acme"}
        await _until(c, "/v1/pools/py", lambda p: p.get("status", {}).get("availableReplicas") == 2)
        assert [p["metadata"]["name"] for p in (await c.get("/v1/pools")).json()["items"]] == ["py"]
        claim = await c.post(
            "/v1/claims", json={"pool": "py", "env": {"WHO": "acme"}, "lifetime_seconds": 600}
        )
        assert claim.status_code == 201, claim.text
        body = claim.json()
        sandbox, name = body["status"]["sandbox"], body["metadata"]["name"]
        bound = next(x for x in body["status"]["conditions"] if x["type"] == "Bound")
        assert bound["reason"] == "WarmPoolBind" and body["spec"]["poolRef"]["name"] == "py"
        ran = await c.post(f"/v1/sandboxes/{sandbox}/exec", json={"shell": "echo $WHO"})
        assert ran.json()["stdout"] == "acme\n", ran.text
        listed = (await c.get("/v1/sandboxes")).json()["items"]
        assert sandbox in [s["metadata"]["name"] for s in listed]
        # another tenant: nothing of acme's exists for it
        for url in ("/v1/pools/py", f"/v1/claims/{name}", f"/v1/sandboxes/{sandbox}"):
            assert (await o.get(url)).status_code == 404, url
        assert (await o.get("/v1/pools")).json()["items"] == []
        denied = await o.post("/v1/claims", json={"pool": "py"})
        assert denied.status_code == 404 and denied.json()["code"] == "claim.pool_not_found"
        assert (await o.delete(f"/v1/claims/{name}")).status_code == 404
        # bad input is a typed 4xx
        bad = await c.post("/v1/pools", json={"name": "x", "replicas": -3})
        assert bad.status_code == 422 and bad.json()["code"] == "store.invalid"
        assert (await c.post("/v1/claims", json={"pool": "a--b"})).status_code == 422
        released = await c.delete(f"/v1/claims/{name}")
        assert released.status_code == 200, released.text
        await _until(c, "/v1/claims", lambda js: js["items"] == [])
        deadline = time.monotonic() + 30
        while (await c.get(f"/v1/sandboxes/{sandbox}")).status_code != 404:
            assert time.monotonic() < deadline, "the released sandbox was never deleted"
            await asyncio.sleep(0.1)
        assert (await c.delete("/v1/pools/py")).status_code == 200


async def test_a_missing_control_service_is_named_by_the_kind_asked(
    start_gateway: GatewayFactory,
) -> None:
    """With no pool and no lifecycle service on the bus, pools and claims answer 503
    `sandbox.unavailable` naming the pool service, sandboxes naming lifecycle (one mapping in the
    upstream, by kind)."""
    gw = await start_gateway()
    async with gw.client(await mint_key(gw, "acme")) as c:
        for url, service in (
            ("/v1/pools", "pool service"),
            ("/v1/claims", "pool service"),
            ("/v1/sandboxes", "lifecycle"),
        ):
            r = await c.get(url)
            assert r.status_code == 503, (url, r.text)
            assert r.json()["code"] == "sandbox.unavailable", r.text
            assert service in r.json()["message"], (url, r.text)
