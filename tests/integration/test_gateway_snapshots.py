"""Snapshots through the gateway's REST API, per tenant, against a real lifecycle (local
runtime, as root): snapshot, list, fork, restore by create, delete -- and another tenant's key
sees none of it."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable

import pytest
from gateway_harness import GatewayFactory, mint_key, start_gateway, unique_tenant  # noqa: F401
from test_default_rootfs import Platform, platform  # noqa: F401 - fixture used by name

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="snapshots need the local runtime as root: run as root"
)


@pytest.fixture
async def plat(platform: Callable[..., Platform]) -> Platform:
    p = platform()
    await p.answering()
    return p


async def test_snapshot_fork_restore_and_tenancy_over_rest(
    plat: Platform,
    start_gateway: GatewayFactory,
) -> None:
    """A tenant snapshots its sandbox, forks it twice, restores it by a create naming the
    snapshot, and cannot delete it while restored; another tenant's key gets 404 for the
    snapshot, its fork and a create naming it, and lists none of it."""
    gw = await start_gateway(prefix=plat.prefix)
    acme, beta = unique_tenant(), unique_tenant()
    a, b = await mint_key(gw, acme), await mint_key(gw, beta)
    async with gw.client(a) as ca, gw.client(b) as cb:
        r = await ca.post("/v1/sandboxes", json={"name": "src", "wait": 60})
        assert r.status_code == 201, r.text
        r = await ca.post("/v1/sandboxes/src/exec", json={"shell": "echo gw > /workspace/f"})
        assert r.status_code == 200, r.text
        r = await ca.post("/v1/sandboxes/src/snapshots", json={"name": "s1"})
        assert r.status_code == 201, r.text
        snap = r.json()
        assert snap["metadata"]["name"] == "s1" and snap["status"]["phase"] == "Ready"
        assert snap["spec"]["sourceRef"]["name"] == "src"
        listed = (await ca.get("/v1/snapshots")).json()["items"]
        assert [s["metadata"]["name"] for s in listed] == ["s1"]
        r = await ca.post("/v1/sandboxes/src/fork", json={"n": 2, "snapshot": "s1"})
        assert r.status_code == 201, r.text
        forks = r.json()["sandboxes"]
        assert len(forks) == 2
        for name in forks:
            out = await ca.post(
                f"/v1/sandboxes/{name}/exec", json={"argv": ["cat", "/workspace/f"]}
            )
            assert out.json()["stdout"] == "gw\n", out.text
        r = await ca.post(
            "/v1/sandboxes",
            json={"name": f"r{uuid.uuid4().hex[:4]}", "spec": {"snapshotRef": {"name": "s1"}}},
        )
        assert r.status_code == 201, r.text
        busy = await ca.delete("/v1/snapshots/s1")
        assert busy.status_code == 409 and busy.json()["code"] == "snapshot.in_use", busy.text
        # the other tenant
        assert (await cb.get("/v1/snapshots/s1")).status_code == 404
        assert (await cb.get(f"/v1/snapshots/{acme}--s1")).status_code == 404
        assert (await cb.delete("/v1/snapshots/s1")).status_code == 404
        assert (await cb.get("/v1/snapshots")).json()["items"] == []
        steal = await cb.post("/v1/sandboxes", json={"spec": {"snapshotRef": {"name": "s1"}}})
        assert steal.status_code in (400, 422), steal.text
        grab = await cb.post("/v1/sandboxes/src/snapshots", json={})
        assert grab.status_code == 404, grab.text
        theirs = await cb.post("/v1/sandboxes/src/fork", json={"snapshot": "s1"})
        assert theirs.status_code in (400, 404, 422), theirs.text
