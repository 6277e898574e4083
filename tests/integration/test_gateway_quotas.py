"""Attack: tenant B holds as many streams, commands and sandboxes as the gateway lets it, and
tenant A (another key, its own sandbox) keeps working: never a 503, never a wait. B itself gets
429 ``busy.quota_exceeded`` naming the quota and the setting that raises it, at once.

Before per-tenant quotas B took every one of the replica's stream slots: A's streams got 503
and A's downloads hung waiting for a slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

import httpx
from gateway_harness import (  # noqa: F401
    Gateway,
    GatewayFactory,
    lifecycle_prefix,
    mint_key,
    start_gateway,
    unique_tenant,
)
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from conftest import Execd

__all__: list[str] = []

TENANT_STREAMS = 3
REPLICA_STREAMS = 8


def _quota(r: httpx.Response, quota: str, setting: str) -> None:
    assert r.status_code == 429, r.text
    body = r.json()
    assert body["code"] == "busy.quota_exceeded" and body["retryable"] is True, body
    assert body["details"]["quota"] == quota, body
    assert body["details"]["setting"] == setting, body
    assert setting in body["message"] or "--allow-permanent" in body["message"], body


async def _sse_exit(c: httpx.AsyncClient, path: str, command: str) -> dict[str, Any]:
    """Run ``command`` over SSE to its exit event."""
    async with c.stream("POST", path, json={"shell": command}) as r:
        assert r.status_code == 200, await r.aread()
        event = ""
        async for line in r.aiter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "exit":
                return json.loads(line[6:])  # type: ignore[no-any-return]
    raise AssertionError("no exit event")


async def _tenant_a_works(gw: Gateway, key: str) -> None:
    """Stream, download, WebSocket and one-shot exec of tenant A, each answered at once."""
    async with gw.client(key) as c:
        assert (await _sse_exit(c, "/v1/sandboxes/box/exec/stream", "echo a"))["exit_code"] == 0
        r = await c.put("/v1/sandboxes/box/files/content?path=a.txt", content=b"A" * 100_000)
        assert r.status_code == 201, r.text
        r = await asyncio.wait_for(c.get("/v1/sandboxes/box/files/content?path=a.txt"), 30)
        assert r.status_code == 200 and r.content == b"A" * 100_000
        r = await c.post("/v1/sandboxes/box/exec", json={"shell": "echo one-shot"})
        assert r.status_code == 200 and r.json()["stdout"] == "one-shot\n"
    url = gw.url.replace("http://", "ws://") + "/v1/sandboxes/box/exec/ws"
    async with connect(url, additional_headers={"authorization": f"Bearer {key}"}) as ws:
        await ws.send(json.dumps({"shell": "echo ws"}))
        while True:
            msg = await ws.recv()
            if isinstance(msg, str) and json.loads(msg)["type"] == "exit":
                break


async def test_one_tenant_at_its_stream_quota_never_blocks_another(
    start_gateway: GatewayFactory, start_execd: Callable[..., Execd]
) -> None:
    gw = await start_gateway(tenant_max_streams=TENANT_STREAMS, max_streams=REPLICA_STREAMS)
    a, b = unique_tenant(), unique_tenant()
    start_execd(sandbox_id=f"{a}--box")
    start_execd(sandbox_id=f"{b}--box")
    key_a, key_b = await mint_key(gw, a), await mint_key(gw, b)
    async with gw.client(key_b) as c:
        r = await c.put(
            "/v1/sandboxes/box/files/content?path=big", content=b"B" * (32 << 20)
        )  # more than socket buffers hold
        assert r.status_code == 201
    setting = "SANDPOD_GATEWAY_TENANT_MAX_STREAMS"
    async with contextlib.AsyncExitStack() as held, gw.client(key_b) as c:
        opened = 0
        for i in range(REPLICA_STREAMS):  # B tries to take every slot of the replica
            kind = ("sse", "download", "ws")[i % 3]
            if kind == "sse":
                r = await held.enter_async_context(
                    c.stream("POST", "/v1/sandboxes/box/exec/stream", json={"shell": "sleep 60"})
                )
            elif kind == "download":  # opened and never read: the slot stays held
                r = await held.enter_async_context(
                    c.stream("GET", "/v1/sandboxes/box/files/content?path=big")
                )
            else:
                url = gw.url.replace("http://", "ws://") + "/v1/sandboxes/box/pty?shell=sh"
                try:
                    await held.enter_async_context(
                        connect(url, additional_headers={"authorization": f"Bearer {key_b}"})
                    )
                except InvalidStatus as exc:
                    refused = exc.response
                else:
                    opened += 1
                    continue
                body = json.loads(refused.body or b"{}")
                assert refused.status_code == 429, body
                assert (
                    body["code"] == "busy.quota_exceeded" and body["details"]["quota"] == "streams"
                )
                continue
            if r.status_code == 200:
                opened += 1
            else:
                await r.aread()
                _quota(r, "streams", setting)
        assert opened == TENANT_STREAMS
        # B's watch and events streams are refused too, immediately
        r = await c.get("/v1/events")
        _quota(r, "streams", setting)
        await _tenant_a_works(gw, key_a)  # A: no 503, no hang, while B sits at its quota
    # B's slots come back when its streams close
    async with gw.client(key_b) as c:
        deadline = time.monotonic() + 10
        while True:
            exit_ = None
            try:
                exit_ = await _sse_exit(c, "/v1/sandboxes/box/exec/stream", "echo again")
            except AssertionError:
                assert time.monotonic() < deadline, "B's slots were never released"
                await asyncio.sleep(0.1)
                continue
            assert exit_["exit_code"] == 0
            break


async def test_one_tenant_at_its_exec_quota_never_blocks_another(
    start_gateway: GatewayFactory, start_execd: Callable[..., Execd]
) -> None:
    gw = await start_gateway(tenant_max_execs=2)
    a, b = unique_tenant(), unique_tenant()
    start_execd(sandbox_id=f"{a}--box")
    start_execd(sandbox_id=f"{b}--box")
    key_a, key_b = await mint_key(gw, a), await mint_key(gw, b)
    async with gw.client(key_b) as c:
        slow = [
            asyncio.ensure_future(
                c.post(
                    "/v1/sandboxes/box/exec",
                    json={
                        "shell": f"touch started-{i}; "
                        "while [ ! -e go ]; do sleep 0.05; done; echo done"
                    },
                )
            )
            for i in range(2)
        ]
        deadline = time.monotonic() + 20
        while True:  # both commands run (the file API takes no exec slot)
            r = await c.get("/v1/sandboxes/box/files/stat?path=started-1")
            r0 = await c.get("/v1/sandboxes/box/files/stat?path=started-0")
            if r.status_code == r0.status_code == 200:
                break
            assert time.monotonic() < deadline, [t.done() and t.result().text for t in slow]
            await asyncio.sleep(0.05)
        r = await c.post("/v1/sandboxes/box/exec", json={"shell": "true"})
        _quota(r, "execs", "SANDPOD_GATEWAY_TENANT_MAX_EXECS")
        async with c.stream("POST", "/v1/sandboxes/box/exec/stream", json={"shell": "true"}) as s:
            await s.aread()
            _quota(s, "execs", "SANDPOD_GATEWAY_TENANT_MAX_EXECS")
        async with gw.client(key_a) as ca:  # A runs at once while B is at its quota
            r = await ca.post("/v1/sandboxes/box/exec", json={"shell": "echo a"})
            assert r.status_code == 200 and r.json()["stdout"] == "a\n"
        r = await c.put("/v1/sandboxes/box/files/content?path=go", content=b"")
        assert r.status_code == 201
        for done in await asyncio.gather(*slow):
            assert done.status_code == 200 and done.json()["stdout"] == "done\n"
        r = await c.post("/v1/sandboxes/box/exec", json={"shell": "echo free"})
        assert r.status_code == 200 and r.json()["stdout"] == "free\n"


async def test_sandbox_count_and_permanent_sandboxes(
    start_gateway: GatewayFactory, lifecycle_prefix: str
) -> None:
    """B may hold one sandbox; a permanent one only with a key created --allow-permanent; A's
    create is unaffected; deleting frees B's quota."""
    gw = await start_gateway(prefix=lifecycle_prefix, tenant_max_sandboxes=1)
    a, b = unique_tenant(), unique_tenant()
    key_a, key_b = await mint_key(gw, a), await mint_key(gw, b)
    key_b_perm = await mint_key(gw, b, permanent=True)
    create = {"wait": 60}
    async with gw.client(key_b) as c:
        deadline = time.monotonic() + 20
        one = {"metadata": {"name": "one"}, **create}
        while (r := await c.post("/v1/sandboxes", json=one)).status_code == 503:
            assert time.monotonic() < deadline, "lifecycle never answered"
            await asyncio.sleep(0.05)
        assert r.status_code == 201, r.text
        r = await c.post("/v1/sandboxes", json={"metadata": {"name": "two"}, **create})
        _quota(r, "sandboxes", "SANDPOD_GATEWAY_TENANT_MAX_SANDBOXES")
        assert (await c.get("/v1/sandboxes/two")).status_code == 404  # nothing was created
    async with gw.client(key_a) as c:
        r = await c.post(
            "/v1/sandboxes",
            json={"metadata": {"name": "one"}, "spec": {"permanent": True}, **create},
        )
        _quota(r, "permanent_sandboxes", "keys create --allow-permanent")
        r = await c.post("/v1/sandboxes", json={"metadata": {"name": "one"}, **create})
        assert r.status_code == 201, r.text  # A is not limited by B's count
        assert (await c.delete("/v1/sandboxes/one?wait=30")).status_code == 200
    async with gw.client(key_b) as c:
        assert (await c.delete("/v1/sandboxes/one?wait=30")).status_code == 200
    async with gw.client(key_b_perm) as c:  # the same tenant, with a key that allows it
        r = await c.post(
            "/v1/sandboxes",
            json={"metadata": {"name": "keeper"}, "spec": {"permanent": True}, **create},
        )
        assert r.status_code == 201, r.text
        assert r.json()["spec"].get("permanent") is True
        assert (await c.delete("/v1/sandboxes/keeper?wait=30")).status_code == 200
