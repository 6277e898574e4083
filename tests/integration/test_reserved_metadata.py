"""Attack: tenant B forges tenant A's warm-pool labels to hijack A's claims (issue 12, finding 6).

B reads ``sandpod.dev/pool`` and ``sandpod.dev/template-hash`` off a sandbox of its own pool and
creates sandboxes carrying A's pool name with them, hoping A's pool counts them and A's claim
binds one (delivering A's env into B's sandbox). Every client path is refused with a typed
``bad_request`` naming the key: the gateway with B's API key, and the NATS API (global and
tenant subjects: lifecycle and pool check, since anything can speak NATS). Then A's claim still
binds A's own member, A's env reaches only it, and B's sandboxes never see it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest
from gateway_harness import (  # noqa: F401
    Gateway,
    GatewayFactory,
    lifecycle_prefix,
    mint_key,
    pool_service,
    start_gateway,
)

from conftest import NatsServer
from sandpod.control import api_call
from sandpod_bus import Bus, BusSettings
from sandpod_contract.codec import decode_reply, encode
from sandpod_contract.errors import BadRequest
from sandpod_contract.messages.sandboxes import ObjectReply, ObjectRequest, ObjectsReply, Selection
from sandpod_contract.pooling import HASH_LABEL, POOL_LABEL
from sandpod_contract.subjects import Subjects
from sandpod_contract.tenancy import TENANT_LABEL

__all__: list[str] = []

SECRET = "s3cr3t-of-acme"
API = "sandpod.dev/v1alpha1"


async def _until(c: httpx.AsyncClient, url: str, done: Any, timeout: float = 60) -> Any:
    """GET ``url`` until ``done(json)`` (each answer a fresh read of the store)."""
    deadline = time.monotonic() + timeout
    while True:
        r = await c.get(url)
        if r.status_code == 200 and done(r.json()):
            return r.json()
        assert time.monotonic() < deadline, f"{url}: {r.status_code} {r.text[:300]}"
        await asyncio.sleep(0.1)


async def _pool(c: httpx.AsyncClient, name: str) -> None:
    deadline = time.monotonic() + 30
    while (r := await c.post("/v1/pools", json={"name": name, "replicas": 1})).status_code == 503:
        assert time.monotonic() < deadline, r.text  # the services are still starting
        await asyncio.sleep(0.1)
    assert r.status_code == 201, r.text
    await _until(c, f"/v1/pools/{name}", lambda p: p.get("status", {}).get("availableReplicas"))


def _refused(r: httpx.Response, key: str) -> None:
    assert r.status_code == 400, f"not refused: {r.status_code} {r.text[:300]}"
    body = r.json()
    assert body["code"] == "bad_request" and key in body["message"], body


async def test_tenant_b_cannot_forge_tenant_a_pool_labels_through_the_gateway(
    start_gateway: GatewayFactory,  # noqa: F811
    pool_service: str,  # noqa: F811
) -> None:
    """B (its own API key) copies its member's pool labels with A's pool name onto new
    sandboxes, annotations and claim labels: each is a 400 naming the key; A's claim binds A's
    own warm member and A's secret env is seen there only, never in any of B's sandboxes."""
    gw = await start_gateway(prefix=pool_service)
    acme, beta = await mint_key(gw, "acme"), await mint_key(gw, "beta")
    async with gw.client(acme) as a, gw.client(beta) as b:
        await _pool(a, "py")
        await _pool(b, "py")
        mine = await b.post("/v1/claims", json={"pool": "py", "lifetime_seconds": 600})
        assert mine.status_code == 201, mine.text
        own = (await b.get(f"/v1/sandboxes/{mine.json()['status']['sandbox']}")).json()
        digest = own["metadata"]["labels"][HASH_LABEL]  # read off B's own member
        forged = {POOL_LABEL: "acme--py", HASH_LABEL: digest}
        # the attack, every way the gateway takes metadata
        for n, body in enumerate(
            (
                {"name": "evil", "labels": forged, "wait": 0},
                {"metadata": {"name": "evil1", "labels": forged}, "wait": 0},
                {"metadata": {"name": "evil2", "labels": {POOL_LABEL: "acme--py"}}, "wait": 0},
                {"metadata": {"name": "evil3", "labels": {TENANT_LABEL: "acme"}}, "wait": 0},
                {
                    "metadata": {
                        "name": "evil4",
                        "annotations": {"sandpod.dev/owner": "SandboxWarmPool/acme--py"},
                    },
                    "wait": 0,
                },
            )
        ):
            r = await b.post("/v1/sandboxes", json=body)
            _refused(r, "sandpod.dev/")
            assert f"evil{n or ''}" not in r.text or "reserved" in r.text
        _refused(await b.post("/v1/claims", json={"pool": "py", "labels": forged}), POOL_LABEL)
        # nothing was created for B by the attempts
        names = {s["metadata"]["name"] for s in (await b.get("/v1/sandboxes")).json()["items"]}
        assert not {n for n in names if n.startswith("evil")}, names
        # A's claim binds A's own warm member; A's secret reaches it and nothing of B's
        claim = await a.post(
            "/v1/claims", json={"pool": "py", "env": {"SECRET": SECRET}, "lifetime_seconds": 600}
        )
        assert claim.status_code == 201, claim.text
        bound = claim.json()["status"]["sandbox"]
        reason = next(x for x in claim.json()["status"]["conditions"] if x["type"] == "Bound")
        assert reason["reason"] == "WarmPoolBind"
        got = await a.get(f"/v1/sandboxes/{bound}")
        assert got.status_code == 200 and got.json()["metadata"]["labels"][POOL_LABEL] == "acme--py"
        ran = await a.post(f"/v1/sandboxes/{bound}/exec", json={"shell": "echo $SECRET"})
        assert ran.json()["stdout"] == f"{SECRET}\n", ran.text
        for s in (await b.get("/v1/sandboxes")).json()["items"]:
            env = await b.post(
                f"/v1/sandboxes/{s['metadata']['name']}/exec", json={"argv": ["env"]}
            )
            assert env.status_code == 200 and SECRET not in env.text
        assert (await b.get(f"/v1/sandboxes/{bound}")).status_code == 404


@pytest.fixture
async def bus(nats: NatsServer) -> Any:
    b = await Bus.connect(BusSettings(url=nats.url))
    yield b
    await b.close()


async def _nats(bus: Bus, subject: str, obj: dict[str, Any]) -> None:
    """One create-like request straight on the bus; raises the typed error it answers."""
    data = await bus.request(subject, encode(ObjectRequest(object=obj)), 10)
    decode_reply(ObjectReply, data)


def _sandbox(name: str, **meta: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "Sandbox", "metadata": {"name": name, **meta}, "spec": {}}


async def test_the_nats_api_refuses_reserved_keys_and_owner_references(
    bus: Bus,
    pool_service: str,  # noqa: F811
) -> None:
    """Straight on the bus (global and tenant subjects), lifecycle and pool refuse a sandbox,
    template, pool or claim that sets a ``sandpod.dev/`` label or annotation (claims: in
    ``spec.labels`` too) or any ownerReferences, each with ``bad_request`` naming the key; a
    clean create on the same subjects still works."""
    subjects = Subjects(pool_service)
    deadline = time.monotonic() + 30
    while True:  # the services start concurrently with the test
        try:
            await api_call(bus, subjects, "pools", "list", Selection(), ObjectsReply)
            await api_call(bus, subjects, "sandboxes", "list", Selection(), ObjectsReply)
            break
        except Exception:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
    owner = [{"apiVersion": API, "kind": "SandboxWarmPool", "name": "acme--py", "uid": "x"}]
    attempts: list[tuple[str, str, dict[str, Any], str]] = []
    for subject_of in (subjects.api, lambda k, v: subjects.api_tenant("beta", k, v)):
        attempts += [
            (
                subject_of("sandboxes", "create"),
                "sandboxes",
                _sandbox("beta--e1", labels={POOL_LABEL: "acme--py"}),
                POOL_LABEL,
            ),
            (
                subject_of("sandboxes", "create"),
                "sandboxes",
                _sandbox("beta--e2", annotations={"sandpod.dev/bound-at": "1"}),
                "sandpod.dev/bound-at",
            ),
            (
                subject_of("sandboxes", "create"),
                "sandboxes",
                _sandbox("beta--e3", labels={"x.sandpod.dev/a": "b"}),
                "x.sandpod.dev/a",
            ),
            (
                subject_of("sandboxes", "create"),
                "sandboxes",
                _sandbox("beta--e4", ownerReferences=owner),
                "ownerReferences",
            ),
            (
                subject_of("pools", "apply"),
                "pools",
                {
                    "apiVersion": API,
                    "kind": "SandboxWarmPool",
                    "spec": {"replicas": 0},
                    "metadata": {"name": "beta--p", "labels": {TENANT_LABEL: "acme"}},
                },
                TENANT_LABEL,
            ),
            (
                subject_of("claims", "create"),
                "claims",
                {
                    "apiVersion": API,
                    "kind": "SandboxClaim",
                    "metadata": {"name": "beta--c"},
                    "spec": {"labels": {POOL_LABEL: "acme--py"}},
                },
                POOL_LABEL,
            ),
        ]
    template = {
        "apiVersion": API,
        "kind": "SandboxTemplate",
        "spec": {},
        "metadata": {"name": "t1", "labels": {POOL_LABEL: "x"}},
    }
    attempts.append((subjects.api("templates", "apply"), "templates", template, POOL_LABEL))
    for subject, _kind, obj, key in attempts:
        with pytest.raises(BadRequest) as caught:
            await _nats(bus, subject, obj)
        assert caught.value.code == "bad_request" and key in caught.value.message, subject
        assert caught.value.details.get("key") == key, caught.value.details
    # nothing was stored, and a clean create on the tenant subject works and is the tenant's
    listed = await api_call(bus, subjects, "sandboxes", "list", Selection(), ObjectsReply)
    assert not [i for i in listed.items if i["metadata"]["name"].startswith("beta--e")]
    data = await bus.request(
        subjects.api_tenant("beta", "sandboxes", "create"),
        _encode(_sandbox("fine", labels={"team": "x"})),
        10,
    )
    made = decode_reply(ObjectReply, data).object
    assert made["metadata"]["name"] == "beta--fine"
    assert made["metadata"]["labels"] == {"team": "x", TENANT_LABEL: "beta"}
    # the CLI: the same refusal, a typed error and exit 125, nothing created
    env = {**os.environ, "SANDPOD_NATS_URL": bus.settings.url, "SANDPOD_PREFIX": pool_service}
    for argv in (
        ["create", "--name", "cli-evil", "-l", f"{POOL_LABEL}=acme--py"],
        ["claim", "py", "-l", f"{POOL_LABEL}=acme--py"],
    ):
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "sandpod", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 125 and POOL_LABEL in done.stderr, done.stderr
        assert "bad_request" in done.stderr
    listed = await api_call(bus, subjects, "sandboxes", "list", Selection(), ObjectsReply)
    assert "cli-evil" not in {i["metadata"]["name"] for i in listed.items}


def _encode(obj: dict[str, Any]) -> bytes:
    return encode(ObjectRequest(object=obj))
