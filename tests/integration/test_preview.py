"""Preview URLs and port-forwarding: a real web app started in a sandbox (``bench/_preview_app.py``
through the processes API), reached through a real gateway over the sandbox's address.

Who may reach it (from where an attacker sits: no key, another tenant's key, a forged or expired
link, a link for another port), signed links (the gateway's clock is moved, not waited for) and
their cookie, public ports (recorded on the Sandbox: a second gateway replica sees them; made
private again), host routing, and the data path: SSE arriving event by event, a long poll longer
than every timeout the gateway has (set small here), WebSocket echo, uploads and a 1 GiB
download with its sha256, and ``sandpod port-forward``.

The data-path test runs on the process runtime and on the local (namespace) runtime; the local
case skips, saying why, while the local runtime gives sandboxes no network address.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import pytest
import websockets
from gateway_harness import Gateway, GatewayFactory, mint_key, start_gateway  # noqa: F401

from conftest import NatsServer, free_port
from sandpod import AsyncSandbox
from sandpod.errors import SandboxNotFound
from sandpod_gateway.keys import KeyStore

__all__: list[str] = []

ROOT = Path(__file__).resolve().parents[2]
APP = (ROOT / "bench" / "_preview_app.py").read_text()
DOMAIN = "preview.test"
BIG = 1024 * 1024 * 1024  # the 1 GiB download


class Site:
    """A sandbox "web" of tenant acme running the app on ``port``, behind gateway ``gw``."""

    def __init__(self, gw: Gateway, key: str, port: int, address: str) -> None:
        self.gw, self.key, self.port, self.address = gw, key, port, address
        self.sid = "acme--web"
        self.base = f"/v1/sandboxes/{self.sid}/ports/{port}"
        self.host = f"{port}-{self.sid}.{DOMAIN}"


@pytest.fixture
def lifecycle_on(nats: NatsServer, tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """Start a lifecycle replica with a runtime on a private prefix (returned); stopped, and its
    sandboxes destroyed, at teardown."""
    started: list[subprocess.Popen[bytes]] = []

    def start(runtime: str) -> str:
        prefix = f"p{uuid.uuid4().hex[:8]}"
        env = {
            **os.environ,
            "SANDPOD_NATS_URL": nats.url,
            "SANDPOD_PREFIX": prefix,
            "SANDPOD_STATE_DIR": str(tmp_path / prefix),
            "SANDPOD_RESYNC": "0.5",
            "SANDPOD_RUNTIME": runtime,
            "SANDPOD_DESTROY_ON_EXIT": "true",
        }
        with (tmp_path / f"lifecycle-{prefix}.log").open("ab") as out:
            started.append(
                subprocess.Popen(
                    [sys.executable, "-m", "sandpod_lifecycle"], env=env, stdout=out, stderr=out
                )
            )
        return prefix

    yield start
    for proc in started:
        proc.terminate()
        proc.wait(60)


async def _until(check: Callable[[], object], what: str, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while not await check():  # type: ignore[misc]
        assert time.monotonic() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def _site(
    start_gateway: GatewayFactory, lifecycle_on: Callable[[str], str], runtime: str, **kw: object
) -> Site:
    """Lifecycle + gateway + sandbox acme/web with the app listening; skips (local runtime) if
    the sandbox has no address."""
    gw = await start_gateway(prefix=lifecycle_on(runtime), preview_domain=DOMAIN, **kw)
    key = await mint_key(gw, "acme")
    async with gw.client(key) as c:

        async def lifecycle_up() -> bool:
            return (await c.get("/v1/sandboxes")).status_code == 200

        await _until(lifecycle_up, "lifecycle")
        r = await c.post("/v1/sandboxes", json={"metadata": {"name": "web"}, "wait": 60})
        assert r.status_code == 201, r.text
        address = (r.json()["status"].get("endpoint") or {}).get("address")
        if not address:
            await c.delete("/v1/sandboxes/web", params={"wait": 30})
            pytest.skip(
                f"the {runtime} runtime gave the sandbox no network address "
                "(status.endpoint.address): it lands with the per-sandbox veth (issue 15 part 1); "
                "until then preview URLs cannot reach its ports"
            )
        port = free_port()
        r = await c.post(
            "/v1/sandboxes/web/processes",
            json={"proc_id": "app", "argv": ["python3", "-c", APP, str(port)]},
        )
        assert r.status_code == 201, r.text
        site = Site(gw, key, port, address)

        async def app_up() -> bool:
            return (await c.get(f"{site.base}/ping")).status_code == 200

        await _until(app_up, "the app to listen")
    return site


@pytest.fixture
def clock() -> list[float]:
    """A wall clock the test moves (``clock[0]``): preview links expire by it."""
    return [time.time()]


async def test_who_may_open_a_preview(
    start_gateway: GatewayFactory, lifecycle_on: Callable[[str], str], clock: list[float]
) -> None:
    """No key 401, another tenant's key 404 (like a missing sandbox), the owner's key passes and
    the gateway's credentials never reach the app; X-Forwarded-* are added."""
    site = await _site(start_gateway, lifecycle_on, "process", clock=lambda: clock[0])
    other = await mint_key(site.gw, "other")
    async with site.gw.client() as anon, site.gw.client(other) as o, site.gw.client(site.key) as c:
        r = await anon.get(f"{site.base}/ping")
        assert (r.status_code, r.json()["code"]) == (401, "auth.unauthenticated")
        r = await anon.get(f"/v1/sandboxes/acme--nosuch/ports/{site.port}/ping")
        assert r.status_code == 401  # no credentials: existence is never revealed
        missing = await o.get(f"/v1/sandboxes/nosuch/ports/{site.port}/ping")
        for path in (site.base, f"/v1/sandboxes/web/ports/{site.port}"):
            r = await o.get(f"{path}/ping")
            assert r.status_code == missing.status_code == 404
            assert r.json()["code"] == missing.json()["code"] == "sandbox.not_found"
        for path in (site.base, f"/v1/sandboxes/web/ports/{site.port}"):  # id or own name
            assert (await c.get(f"{path}/ping")).text == "pong"
        r = await c.get(
            f"{site.base}/echo/a%20b",
            params={"x": "1"},
            headers={"x-forwarded-host": "spoofed", "cookie": "theirs=1"},
        )
        echo = r.json()
        headers = dict(echo["headers"])
        assert echo["path"] == "/echo/a%20b" and echo["query"] == "x=1"
        assert "authorization" not in headers and "x-api-key" not in headers
        assert headers["cookie"] == "theirs=1"
        assert headers["x-forwarded-for"] == "127.0.0.1"
        assert headers["x-forwarded-host"] == f"127.0.0.1:{site.gw.service.port}"
        assert headers["x-forwarded-proto"] == "http"
        assert headers["x-forwarded-prefix"] == site.base
        assert headers["host"] == f"{site.address}:{site.port}"
        # the app's own bearer token is the app's: forwarded, not taken for a gateway key
        r = await c.get(
            f"{site.base}/echo", headers={"x-api-key": site.key, "authorization": "Bearer app-jwt"}
        )
        assert dict(r.json()["headers"])["authorization"] == "Bearer app-jwt"
        assert "x-api-key" not in dict(r.json()["headers"])
        r = await c.get(site.base, follow_redirects=False)  # no trailing slash: relative links
        assert (r.status_code, r.headers["location"]) == (308, f"{site.base}/")


async def test_signed_links_expire_and_cannot_be_forged(
    start_gateway: GatewayFactory, lifecycle_on: Callable[[str], str], clock: list[float]
) -> None:
    """A signed link opens the port without a key and sets a cookie scoped to it; the token and
    the cookie are not forwarded; past its expiry it is refused (401), and a forged, altered or
    misdirected one is refused (403); so is one whose key was revoked."""
    site = await _site(start_gateway, lifecycle_on, "process", clock=lambda: clock[0])
    async with site.gw.client(site.key) as c:
        r = await c.post("/v1/sandboxes/web/previews", json={"port": site.port, "ttl_seconds": 60})
        assert r.status_code == 201, r.text
        link = r.json()
        assert link["url"].startswith(f"{site.gw.url}{site.base}/?token=spl1.")
        assert link["host_url"].startswith(f"http://{site.host}:{site.gw.service.port}/?token=")
        token = link["token"]
    async with httpx.AsyncClient(base_url=site.gw.url) as browser:
        r = await browser.get(f"{site.base}/echo", params={"token": token, "token2": "app"})
        assert r.status_code == 200, r.text
        assert r.json()["query"] == "token2=app"  # our token stripped, the app's params kept
        cookie = r.headers["set-cookie"]
        assert f"Path={site.base}/" in cookie and "HttpOnly" in cookie and "Max-Age=60" in cookie
        r = await browser.get(f"{site.base}/echo")  # the page's own sub-request: the cookie
        assert r.status_code == 200 and "cookie" not in dict(r.json()["headers"])
        forged = token[:-1] + ("A" if token[-1] != "A" else "B")
        for bad in (forged, token.replace(f".{site.port}.", f".{site.port + 1}.")):
            r = await httpx.AsyncClient(base_url=site.gw.url).get(
                f"{site.base}/ping", params={"token": bad}
            )
            assert (r.status_code, r.json()["code"]) == (403, "auth.link_invalid")
        r = await httpx.AsyncClient(base_url=site.gw.url).get(
            f"/v1/sandboxes/acme--web/ports/{site.port + 1}/ping", params={"token": token}
        )
        assert (r.status_code, r.json()["code"]) == (403, "auth.link_invalid")
        clock[0] += 61
        r = await browser.get(f"{site.base}/ping")  # the cookie outlived nothing
        assert (r.status_code, r.json()["code"]) == (401, "auth.link_expired")
        r = await browser.get(f"{site.base}/ping", params={"token": token})
        assert (r.status_code, r.json()["code"]) == (401, "auth.link_expired")
    async with site.gw.client(site.key) as c:
        token = (await c.post("/v1/sandboxes/web/previews", json={"port": site.port})).json()[
            "token"
        ]
    async with httpx.AsyncClient(base_url=site.gw.url) as browser:
        assert (await browser.get(f"{site.base}/ping", params={"token": token})).text == "pong"
        store = await KeyStore.open(site.gw.bus, site.gw.service.settings.bucket_base)
        await store.revoke(site.key.split("_")[1])

        async def refused() -> bool:
            r = await browser.get(f"{site.base}/ping", params={"token": token})
            return r.status_code == 403

        await _until(refused, "the revoked key's link to be refused", 10)


async def test_public_ports_and_host_routing(
    start_gateway: GatewayFactory, lifecycle_on: Callable[[str], str]
) -> None:
    """A port made public opens without credentials on every replica (it is recorded on the
    Sandbox), by path and by host (the app at /), until it is made private again; a client
    cannot set the reserved annotation itself."""
    site = await _site(start_gateway, lifecycle_on, "process")
    host = {"host": site.host}
    async with site.gw.client() as anon, site.gw.client(site.key) as c:
        r = await c.get("/echo", headers=host)  # host form: the whole path is the app's
        assert r.status_code == 200 and r.json()["path"] == "/echo"
        assert "x-forwarded-prefix" not in dict(r.json()["headers"])
        assert (await anon.get("/ping", headers=host)).status_code == 401
        r = await c.post("/v1/sandboxes/web/previews", json={"port": site.port, "public": True})
        assert r.status_code == 201 and r.json()["token"] is None
        assert r.json()["url"] == f"{site.gw.url}{site.base}/"
        assert (await anon.get(f"{site.base}/ping")).text == "pong"
        assert (await anon.get("/ping", headers=host)).text == "pong"
        async with websockets.connect(  # a WebSocket in the host form, no credentials
            f"ws://{site.host}:{site.gw.service.port}/ws",
            host="127.0.0.1",
            port=site.gw.service.port,
        ) as ws:
            await ws.send("over the host form")
            assert await ws.recv() == "over the host form"
        other_port = f"/v1/sandboxes/{site.sid}/ports/{site.port + 1}/ping"
        assert (await anon.get(other_port)).status_code == 401  # only that port
        listed = (await c.get("/v1/sandboxes/web/previews")).json()["items"]
        assert [i["port"] for i in listed] == [site.port]
        replica = await start_gateway(prefix=site.gw.service.settings.prefix)
        async with replica.client() as anon2:  # a fresh replica reads it from the Sandbox
            assert (await anon2.get(f"{site.base}/ping")).text == "pong"
        r = await c.post(
            "/v1/sandboxes",
            json={"metadata": {"name": "sneaky", "annotations": {"sandpod.dev/public-ports": "1"}}},
        )
        assert (r.status_code, r.json()["details"]["key"]) == (400, "sandpod.dev/public-ports")
        r = await c.delete(f"/v1/sandboxes/web/previews/{site.port}")
        assert r.status_code == 200 and r.json()["public_ports"] == []
        assert (await anon.get(f"{site.base}/ping")).status_code == 401  # this replica: at once

        async def private_on_replica() -> bool:
            async with replica.client() as anon2:
                return (await anon2.get(f"{site.base}/ping")).status_code == 401

        await _until(private_on_replica, "the other replica to see the port private", 10)


async def test_sdk_expose_and_url(
    start_gateway: GatewayFactory, lifecycle_on: Callable[[str], str], nats: NatsServer
) -> None:
    """``sbx.url(port)`` is a signed link that opens without a key; ``sbx.expose(port,
    public=True)`` a plain URL until ``sbx.unexpose(port)``; the SDK names the sandbox by its id."""
    site = await _site(start_gateway, lifecycle_on, "process")
    gw, key = site.gw.url, site.key
    prefix = site.gw.service.settings.prefix
    async with (
        await AsyncSandbox.connect(site.sid, nats_url=nats.url, prefix=prefix) as sbx,
        httpx.AsyncClient() as anon,
    ):
        link = await sbx.url(site.port, ttl=30, gateway=gw, api_key=key)
        assert "?token=spl1." in link
        assert (await anon.get(link.replace("/?", "/ping?"))).text == "pong"
        shown = await sbx.expose(site.port, public=True, gateway=gw, api_key=key)
        assert shown.public and shown.token is None and shown.host_url
        assert (await anon.get(shown.url + "ping")).text == "pong"
        await sbx.unexpose(site.port, gateway=gw, api_key=key)
        anon.cookies.clear()  # the signed link's cookie still opens it, until the link expires
        assert (await anon.get(shown.url + "ping")).status_code == 401
        with pytest.raises(SandboxNotFound):
            await sbx.expose(
                site.port, api_key=await mint_key(site.gw, "other"), gateway=site.gw.url
            )


@pytest.mark.parametrize("runtime", ["process", "local"])
async def test_streams_websockets_and_big_bodies(
    start_gateway: GatewayFactory, lifecycle_on: Callable[[str], str], runtime: str
) -> None:
    """SSE events arrive one by one (the first before the server finishes), a long poll outlives
    every gateway timeout (all set far below it), WebSocket echo (text, binary, the app's
    subprotocol), a chunked upload and a 1 GiB download arrive intact (sha256)."""
    if runtime == "local" and os.geteuid() != 0:
        pytest.skip("the local runtime needs root (run the suite as root, as CI does)")
    site = await _site(
        start_gateway,
        lifecycle_on,
        runtime,
        keepalive=0.2,
        request_timeout=0.3,
        preview_connect_timeout=0.3,
    )
    async with site.gw.client(site.key) as c:
        async with c.stream("GET", f"{site.base}/sse", params={"n": 3}) as r:
            assert r.headers["content-type"] == "text/event-stream"
            lines = r.aiter_lines()
            seen = []
            async for line in lines:
                if line.startswith("data: "):
                    seen.append(line[6:])
                    if len(seen) == 3:
                        break
                    # the server holds the next event until released: this one came first
                    assert (await c.get(f"{site.base}/release")).text == "released"
            assert seen == ["event 0", "event 1", "event 2"]
        t0 = time.monotonic()
        r = await c.get(f"{site.base}/poll", params={"hold": 1.5})
        assert (r.status_code, r.text) == (200, "polled")
        assert time.monotonic() - t0 >= 1.5  # 5x the gateway's request and connect timeouts
        ws_url = f"ws://127.0.0.1:{site.gw.service.port}{site.base}/ws"
        async with websockets.connect(
            ws_url,
            additional_headers={"authorization": f"Bearer {site.key}"},
            subprotocols=["echo"],  # type: ignore[list-item]
            max_size=None,
        ) as ws:
            assert ws.subprotocol == "echo"
            await ws.send("hello")
            assert await ws.recv() == "hello"
            blob = os.urandom(300_000)
            await ws.send(blob)
            assert await ws.recv() == blob
        body = os.urandom(8 * 1024 * 1024)

        async def chunks() -> AsyncIterator[bytes]:
            for i in range(0, len(body), 1 << 20):
                yield body[i : i + (1 << 20)]

        r = await c.post(f"{site.base}/upload", content=chunks())  # chunked: no length
        assert r.json() == {"sha256": hashlib.sha256(body).hexdigest(), "length": len(body)}
        digest, size = hashlib.sha256(), 0
        async with c.stream("GET", f"{site.base}/bytes", params={"n": BIG}) as r:
            assert r.headers["content-length"] == str(BIG)
            async for part in r.aiter_raw():
                digest.update(part)
                size += len(part)
        expected = hashlib.sha256()
        pattern = bytes(range(256)) * 4096
        for _ in range(BIG // len(pattern)):
            expected.update(pattern)
        assert (size, digest.hexdigest()) == (BIG, expected.hexdigest())
        async with c.stream("GET", f"{site.base}/bytes", params={"n": BIG}) as r:
            async for _ in r.aiter_raw():
                break  # a client that leaves mid-body: the upstream connection is dropped
        for _ in range(3):  # and the next requests get fresh, working connections
            assert (await c.get(f"{site.base}/ping")).text == "pong"
        await c.delete("/v1/sandboxes/web", params={"wait": 30})


async def test_port_forward_cli(
    start_gateway: GatewayFactory, lifecycle_on: Callable[[str], str], tmp_path: Path
) -> None:
    """``sandpod port-forward web :PORT`` listens locally and relays a TCP connection (an HTTP
    request read to EOF after a half-close) to the sandbox's port; without a key it is refused."""
    site = await _site(start_gateway, lifecycle_on, "process")
    env = {**os.environ, "SANDPOD_GATEWAY_URL": site.gw.url, "SANDPOD_API_KEY": site.key}
    env["SANDPOD_STATE_DIR"] = str(tmp_path)  # no sandpod up's key to fall back on
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sandpod",
        "port-forward",
        "web",
        f":{site.port}",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert line.startswith("Forwarding from 127.0.0.1:") and line.endswith(f" {site.port}\n")
        local = int(line.split(":")[1].split()[0])
        reader, writer = await asyncio.open_connection("127.0.0.1", local)
        writer.write(b"GET /ping HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        writer.write_eof()
        answer = await asyncio.wait_for(reader.read(), 30)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"pong")
    finally:
        proc.terminate()
        await proc.wait()
    async with site.gw.client() as anon:
        r = await anon.get(f"/v1/sandboxes/web/port-forward/{site.port}")
        assert r.status_code in (401, 403)
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(
            f"ws://127.0.0.1:{site.gw.service.port}/v1/sandboxes/web/port-forward/{site.port}"
        ):
            pass
    assert refused.value.response.status_code == 401
    assert json.loads(refused.value.response.body or b"{}")["code"] == "auth.unauthenticated"
