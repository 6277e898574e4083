"""Gateway: the sandbox API through a real lifecycle replica, tenant-scoped; processes; watch
and lifecycle events as SSE; two gateway replicas serving the same sandbox."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

import httpx
from gateway_harness import (  # noqa: F401
    Gateway,
    GatewayFactory,
    gateway,
    lifecycle_prefix,
    mint_key,
    start_gateway,
)

from conftest import Execd

__all__: list[str] = []


async def _sse(
    c: httpx.AsyncClient, url: str, want: int, **kw: object
) -> AsyncIterator[tuple[str, dict[str, object]]]:
    async with c.stream("GET", url, **kw) as r:  # type: ignore[arg-type]
        assert r.status_code == 200
        event = ""
        async for line in r.aiter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                yield event, json.loads(line[6:])
                want -= 1
                if want == 0:
                    return


async def test_sandbox_crud_is_tenant_scoped(
    start_gateway: GatewayFactory, lifecycle_prefix: str
) -> None:
    """Create, get, list (selector, pages), renew, pause, resume, exec and delete a sandbox as a
    tenant; another tenant neither lists nor reaches it."""
    gw = await start_gateway(prefix=lifecycle_prefix)
    acme, other = await mint_key(gw, "acme"), await mint_key(gw, "other")
    async with gw.client(acme) as c, gw.client(other) as o:
        deadline = time.monotonic() + 20
        while (await c.get("/v1/sandboxes")).status_code != 200:  # lifecycle still starting
            assert time.monotonic() < deadline, "lifecycle never answered"
            await asyncio.sleep(0.05)
        events = asyncio.ensure_future(_collect(c, "/v1/events", "ready", "box"))
        try:
            await _crud(c, o, events)
        finally:
            events.cancel()
            await asyncio.gather(events, return_exceptions=True)


async def _crud(c: httpx.AsyncClient, o: httpx.AsyncClient, events: asyncio.Future[None]) -> None:
    """The CRUD walk of the test above (acme's client ``c``, the other tenant's ``o``)."""
    r = await c.post(
        "/v1/sandboxes",
        json={"metadata": {"name": "box", "labels": {"app": "web"}}, "spec": {}, "wait": 60},
    )
    assert r.status_code == 201, r.text
    obj = r.json()
    assert obj["metadata"]["name"] == "box" and obj["metadata"]["namespace"] == "acme"
    assert obj["status"]["phase"] == "Running"
    await asyncio.wait_for(events, 30)
    await c.post("/v1/sandboxes", json={"metadata": {"name": "box2"}, "wait": 0})
    r = await c.post("/v1/sandboxes/box/exec", json={"argv": ["echo", "in-box"]})
    assert r.json()["stdout"] == "in-box\n"
    page1 = (await c.get("/v1/sandboxes", params={"limit": 1})).json()
    assert [i["metadata"]["name"] for i in page1["items"]] == ["box"]
    nxt = {"limit": 1, "cursor": page1["next_cursor"]}
    page2 = (await c.get("/v1/sandboxes", params=nxt)).json()
    assert [i["metadata"]["name"] for i in page2["items"]] == ["box2"]
    assert page2["next_cursor"] is None
    sel = (await c.get("/v1/sandboxes", params={"selector": "app=web"})).json()
    assert [i["metadata"]["name"] for i in sel["items"]] == ["box"]
    assert (await o.get("/v1/sandboxes")).json()["items"] == []
    assert (await o.get("/v1/sandboxes/box")).status_code == 404
    assert (await o.delete("/v1/sandboxes/box")).status_code == 404
    r = await c.post("/v1/sandboxes/box/renew", json={"seconds": 7200})
    assert r.status_code == 200 and r.json()["spec"]["shutdownTime"]
    assert (await c.post("/v1/sandboxes/box/pause")).json()["status"]["phase"] == "Paused"
    assert (await c.post("/v1/sandboxes/box/resume")).json()["status"]["phase"] == "Running"
    r = await c.delete("/v1/sandboxes/box", params={"wait": 30})
    assert r.status_code == 200
    assert (await c.get("/v1/sandboxes/box")).status_code == 404
    await c.delete("/v1/sandboxes/box2", params={"wait": 30})


async def _collect(c: httpx.AsyncClient, url: str, event: str, name: str) -> None:
    async for ev, data in _sse(c, url, 100):
        if ev == event and data.get("name") == name:
            assert data["namespace"] == "acme"
            return


async def test_processes_start_logs_kill(gateway: Gateway, shared_execd: Execd) -> None:
    """Start a background process, read its logs by cursor, list it, kill it."""
    key = await mint_key(gateway, "default")
    pid = f"p{uuid.uuid4().hex[:8]}"
    base = "/v1/sandboxes/shared/processes"
    async with gateway.client(key) as c:
        r = await c.post(base, json={"proc_id": pid, "shell": "echo one; echo two; sleep 60"})
        assert r.status_code == 201 and r.json()["state"] == "running"
        text, cursor = "", 0
        while "two" not in text:
            part = (await c.get(f"{base}/{pid}/logs", params={"cursor": cursor, "wait": 5})).json()
            text += "".join(ch["data"] for ch in part["chunks"])
            cursor = part["next_cursor"]
        assert text == "one\ntwo\n"
        assert pid in [p["proc_id"] for p in (await c.get(base)).json()["procs"]]
        r = await c.delete(f"{base}/{pid}", params={"grace": 1})
        assert r.json()["state"] == "exited"
        assert (await c.get(f"{base}/nope")).status_code == 404


async def test_watch_streams_file_events(gateway: Gateway, shared_execd: Execd) -> None:
    """GET /watch is SSE: a ready event, then file events as they happen."""
    key = await mint_key(gateway, "default")
    d = f"/workspace/w-{uuid.uuid4().hex[:8]}"
    async with gateway.client(key) as c:
        await c.post("/v1/sandboxes/shared/files/mkdir", json={"path": d})
        seen: list[tuple[str, object]] = []
        async for ev, data in _sse(c, "/v1/sandboxes/shared/watch", 100, params={"path": d}):
            seen.append((ev, data.get("path")))
            if ev == "ready":
                await c.put(
                    "/v1/sandboxes/shared/files/content",
                    params={"path": f"{d}/new.txt"},
                    content=b"x",
                )
            elif data.get("path") == f"{d}/new.txt":
                break
    assert seen[0][0] == "ready" and seen[-1][1] == f"{d}/new.txt"


async def test_two_replicas_serve_the_same_sandbox(
    start_gateway: GatewayFactory, shared_execd: Execd
) -> None:
    """A file written through one gateway replica is read through another; both exec."""
    a, b = await start_gateway(), await start_gateway()
    key = await mint_key(a, "default")
    name = f"r-{uuid.uuid4().hex[:8]}.txt"
    path = f"/workspace/{name}"
    async with a.client(key) as ca, b.client(key) as cb:
        await ca.put("/v1/sandboxes/shared/files/content", params={"path": path}, content=b"hi")
        r = await cb.get("/v1/sandboxes/shared/files/content", params={"path": path})
        assert r.content == b"hi"
        outs = await asyncio.gather(
            *(
                cl.post("/v1/sandboxes/shared/exec", json={"argv": ["cat", name]})
                for cl in (ca, cb, ca, cb)
            )
        )
        assert [o.json()["stdout"] for o in outs] == ["hi"] * 4
