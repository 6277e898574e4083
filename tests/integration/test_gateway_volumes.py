"""Gateway: SandboxVolumes over HTTP, tenant-scoped, through a real lifecycle (local runtime)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from gateway_harness import GatewayFactory, mint_key, start_gateway  # noqa: F401
from test_lifecycle import Lifecycle, _ready_api, lifecycles  # noqa: F401 - fixture

from sandpod_lifecycle.runtime.volumes import LocalVolumes

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the local runtime's volumes need root (loop devices, the jail)"
)


async def _created(c: httpx.AsyncClient, url: str, body: dict[str, object]) -> httpx.Response:
    deadline = time.monotonic() + 30
    while (r := await c.post(url, json=body)).status_code == 503:
        assert time.monotonic() < deadline, r.text  # the services are still starting
        await asyncio.sleep(0.1)
    return r


async def test_volumes_over_http_are_tenant_scoped_and_exclusive(
    start_gateway: GatewayFactory,
    lifecycles: Callable[..., Lifecycle],
    tmp_path: Path,
) -> None:
    """Tenant acme creates volume data and a sandbox mounting it; tenant other cannot see,
    delete or mount it (404 / 422); deleting it while mounted is 409 store.in_use naming the
    sandbox by acme's name; after the sandbox goes, the delete succeeds."""
    lc = lifecycles(SANDPOD_RUNTIME="local")
    await _ready_api(lc)
    gw = await start_gateway(prefix=lc.prefix)
    acme, other = await mint_key(gw, "acme"), await mint_key(gw, "other")
    try:
        async with gw.client(acme) as c, gw.client(other) as o:
            r = await _created(c, "/v1/volumes", {"name": "data", "size": "32Mi"})
            assert r.status_code == 201, r.text
            assert (r.json()["metadata"]["name"], r.json()["metadata"]["namespace"]) == (
                "data",
                "acme",
            )
            bad = await c.post("/v1/volumes", json={"name": "x", "size": "lots"})
            assert bad.status_code == 422 and bad.json()["code"] == "store.invalid"
            mount = {"volumes": [{"name": "data", "mountPath": "/data"}]}
            r = await c.post("/v1/sandboxes", json={"name": "box", "spec": mount, "wait": 60})
            assert r.status_code == 201, r.text
            assert r.json()["spec"]["volumes"][0]["name"] == "data"  # the tenant's name
            ran = await c.post("/v1/sandboxes/box/exec", json={"shell": "echo hi > /data/f"})
            assert ran.json()["exit_code"] == 0, ran.text
            got = (await c.get("/v1/volumes/data")).json()
            assert got["status"]["writer"] == "box" and got["status"]["usedBytes"] > 0
            # the other tenant: acme's volume does not exist for it
            for url in ("/v1/volumes/data", "/v1/volumes/acme--data"):
                assert (await o.get(url)).status_code == 404, url
                assert (await o.delete(url)).status_code == 404, url
            assert (await o.get("/v1/volumes")).json()["items"] == []
            theirs = await o.post("/v1/sandboxes", json={"name": "steal", "spec": mount})
            assert theirs.status_code == 422 and theirs.json()["code"] == "store.invalid"
            held = await c.delete("/v1/volumes/data")
            assert held.status_code == 409 and held.json()["code"] == "store.in_use", held.text
            assert (await c.delete("/v1/sandboxes/box", params={"wait": 30})).status_code == 200
            gone = await c.delete("/v1/volumes/data")
            assert gone.status_code == 200, gone.text
            assert (await c.get("/v1/volumes")).json()["items"] == []
    finally:
        leftovers = LocalVolumes(tmp_path / "jails")
        for vol in (tmp_path / "jails" / ".volumes" / "default").glob("*"):
            leftovers.remove("default", vol.name)
