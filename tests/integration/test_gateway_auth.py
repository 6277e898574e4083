"""Gateway: API keys, tenants and rate limits (the auth matrix)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable

from gateway_harness import Gateway, GatewayFactory, mint_key, start_gateway  # noqa: F401

from conftest import Execd, NatsServer
from sandpod_gateway.keys import KeyStore
from sandpod_gateway.ratelimit import RateLimiter

__all__: list[str] = []


async def test_auth_matrix(
    start_gateway: GatewayFactory, start_execd: Callable[..., Execd]
) -> None:
    """No key, bad key, another tenant's sandbox and a revoked key are all refused; the other
    tenant's sandbox is indistinguishable from a missing one."""
    gw = await start_gateway()
    start_execd("acme--box")  # tenant acme's sandbox "box"
    acme, other = await mint_key(gw, "acme"), await mint_key(gw, "other")
    body = {"argv": ["echo", "hi"]}
    async with gw.client() as c:
        r = await c.post("/v1/sandboxes/box/exec", json=body)
        assert (r.status_code, r.json()["code"]) == (401, "auth.unauthenticated")
        assert r.headers["www-authenticate"].startswith("Bearer")
        for bad in (
            "nope",
            acme[:-1] + ("0" if acme[-1] != "0" else "1"),
            "spk_" + "0" * 12 + "_" + "0" * 48,
        ):
            r = await c.post(
                "/v1/sandboxes/box/exec", json=body, headers={"authorization": f"Bearer {bad}"}
            )
            assert r.status_code == 401, bad
        r = await c.post(
            "/v1/sandboxes/box/exec", json=body, headers={"authorization": f"Bearer {acme}"}
        )
        assert (r.status_code, r.json()["stdout"]) == (200, "hi\n")
        # The other tenant: "box" is its own (missing) name; acme's id is not addressable at all.
        missing = await c.post(
            "/v1/sandboxes/missing/exec", json=body, headers={"x-api-key": other}
        )
        for name in ("box", "acme--box"):
            r = await c.post(f"/v1/sandboxes/{name}/exec", json=body, headers={"x-api-key": other})
            assert r.status_code == missing.status_code == 404
            assert r.json() == {**missing.json(), "message": f"sandbox {name!r} not found"}
        store = await KeyStore.open(gw.bus, gw.service.settings.bucket_base)
        await store.revoke(acme.split("_")[1])
        # Revoked through another store handle: the gateway's cache drops the key when the
        # bucket's watch delivers the change (ms), not at the instant of the write.
        deadline = time.monotonic() + 10
        revoked = {"authorization": f"Bearer {acme}"}
        while (
            await c.post("/v1/sandboxes/box/exec", json=body, headers=revoked)
        ).status_code != 401:
            assert time.monotonic() < deadline, "the revoked key kept working"
            await asyncio.sleep(0.02)


async def test_revocation_reaches_other_replica(start_gateway: GatewayFactory) -> None:
    """A key revoked through one replica's store stops working on another replica that had it
    cached (the bucket watch evicts it)."""
    a, b = await start_gateway(), await start_gateway()
    key = await mint_key(a, "acme")
    async with b.client(key) as c:
        assert (await c.get("/v1/sandboxes/x/processes")).status_code == 404  # cached: valid
        store = await KeyStore.open(a.bus, a.service.settings.bucket_base)
        await store.revoke(key.split("_")[1])
        deadline = time.monotonic() + 10
        while (await c.get("/v1/sandboxes/x/processes")).status_code != 401:
            assert time.monotonic() < deadline, "revocation never reached replica b"
            await asyncio.sleep(0.02)


async def test_rate_limit_per_key(start_gateway: GatewayFactory) -> None:
    """Past its burst a key gets 429 busy.rate_limited + Retry-After; other keys are unaffected."""
    gw = await start_gateway(rate=0.5, burst=3)
    k1, k2 = await mint_key(gw, "acme"), await mint_key(gw, "acme")
    async with gw.client(k1) as c:
        codes = [(await c.get("/v1/sandboxes/x/processes")).status_code for _ in range(4)]
        assert codes[:3] == [404] * 3 and codes[3] == 429
        r = await c.get("/v1/sandboxes/x/processes")
        assert r.json()["code"] == "busy.rate_limited" and r.json()["retryable"] is True
        assert int(r.headers["retry-after"]) >= 1
        r2 = await c.get("/v1/sandboxes/x/processes", headers={"authorization": f"Bearer {k2}"})
        assert r2.status_code == 404


def test_rate_limiter_memory_is_bounded() -> None:
    """The limiter keeps at most max_keys buckets, evicting the least recently used."""
    now = [0.0]
    rl = RateLimiter(rate=1, burst=1, max_keys=100, clock=lambda: now[0])
    for i in range(10_000):
        rl.take(f"k{i}")
    assert len(rl) == 100
    assert rl.take("k9999") > 0  # recent: still tracked, its token spent
    assert rl.take("k0") == 0  # evicted long ago: starts full


def test_bootstrap_cli_creates_lists_and_revokes_keys(nats: NatsServer) -> None:
    """`python -m sandpod_gateway keys create` prints a key once; list shows it; revoke marks it."""
    env = {**os.environ, "SANDPOD_NATS_URL": nats.url, "SANDPOD_PREFIX": "clitest"}

    def run(*a: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "sandpod_gateway", "keys", *a]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)

    created = run("create", "--tenant", "acme", "--name", "ci")
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    assert token.startswith("spk_") and "not shown again" in created.stderr
    key_id = token.split("_")[1]
    listed = run("list")
    assert key_id in listed.stdout and "active" in listed.stdout and token not in listed.stdout
    assert run("revoke", key_id).returncode == 0
    assert "revoked" in run("list").stdout
    assert run("create", "--tenant", "Bad--Tenant").returncode == 1
