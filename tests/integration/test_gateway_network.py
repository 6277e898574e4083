"""Gateway: ``GET/PUT /v1/sandboxes/{name}/network`` through a real lifecycle replica.

The tenant reads and replaces its sandbox's egress policy over HTTP; another tenant's key gets
the same 404 as for a missing sandbox, on read and on write, and changes nothing.
"""

from __future__ import annotations

import asyncio
import time

from gateway_harness import (  # noqa: F401 - fixtures
    GatewayFactory,
    lifecycle_prefix,
    mint_key,
    start_gateway,
)

__all__: list[str] = []


async def test_network_policy_over_http_is_tenant_scoped(
    start_gateway: GatewayFactory, lifecycle_prefix: str
) -> None:
    """GET shows the template's public policy; PUT replaces it (applied in the reply), a bad
    rule is a 422 naming the field, reset brings the template's back; the other tenant gets 404
    for GET and PUT and the policy is unchanged."""
    gw = await start_gateway(prefix=lifecycle_prefix)
    acme, other = await mint_key(gw, "acme"), await mint_key(gw, "other")
    async with gw.client(acme) as c, gw.client(other) as o:
        deadline = time.monotonic() + 20
        while (await c.get("/v1/sandboxes")).status_code != 200:  # lifecycle still starting
            assert time.monotonic() < deadline, "lifecycle never answered"
            await asyncio.sleep(0.05)
        r = await c.post("/v1/sandboxes", json={"metadata": {"name": "box"}, "wait": 60})
        assert r.status_code == 201, r.text
        r = await c.get("/v1/sandboxes/box/network")
        assert r.status_code == 200, r.text
        shown = r.json()
        assert shown["name"] == "box" and "namespace" not in shown
        assert shown["policy"]["mode"] == "public" and shown["source"] == "template"
        body = {"mode": "allowlist", "allow": ["api.test:443"], "wait": 20}
        r = await c.put("/v1/sandboxes/box/network", json=body)
        assert r.status_code == 200, r.text
        put = r.json()
        assert put["policy"]["allow"] == ["api.test:443"] and put["source"] == "sandbox"
        assert put["applied_generation"] == put["generation"] == shown["generation"] + 1
        assert put["enforced"] is False and "process runtime" in put["reason"]
        r = await c.put("/v1/sandboxes/box/network", json={"allow": ["ok.test", "not ok"]})
        assert r.status_code == 422, r.text
        assert r.json()["details"]["field"] == "spec.network.allow[1]"
        r = await c.put("/v1/sandboxes/box/network", json={"mode": "public", "reset": True})
        assert r.status_code == 400 and r.json()["details"]["field"] == "reset"
        for method in ("GET", "PUT"):
            r = await o.request(method, "/v1/sandboxes/box/network", json={"mode": "public"})
            assert r.status_code == 404, (method, r.text)
            missing = await c.request(method, "/v1/sandboxes/nope/network", json={})
            assert r.json()["code"] == missing.json()["code"]
        assert (await c.get("/v1/sandboxes/box/network")).json()["generation"] == put["generation"]
        r = await c.put("/v1/sandboxes/box/network", json={"reset": True, "wait": 20})
        assert r.status_code == 200 and r.json()["source"] == "template"
        assert (await c.delete("/v1/sandboxes/box", params={"wait": 30})).status_code == 200
