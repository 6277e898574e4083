"""The native front (``sandpod-front``, ``sandpod_gateway.native``): the kept preview requests it
relays itself, attacked from where attackers sit.

- An app in a sandbox answers with response headers of its choosing: it must not be able to hand
  the front a pass (which would send the connection's next requests wherever it says: here, a
  "host" service on the gateway's loopback).
- A client names its own address to the gateway in the header the front uses for that: the
  gateway and the app must see the address the connection really came from.
- The front dies: the gateway starts it again and its port keeps answering.

And parity: the app sees a request the front relayed exactly as it sees one the gateway relayed;
the front's requests get the gateway's log line and metrics. The grounds a pass is kept on
(credentials, key revocation, a port made private) are attacked in test_preview_front.py, which
runs every scenario behind both fronts.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
from collections.abc import Callable

import pytest
from test_preview import Site, _until, lifecycle_on  # noqa: F401
from test_preview_front import Raw, Scenario, _runner

from conftest import NatsServer
from sandpod_gateway.native import NativeFront

__all__: list[str] = []


@pytest.fixture
def on_native(nats: NatsServer, lifecycle_on: Callable[[str], str]) -> Callable[..., None]:
    return _runner(nats, lifecycle_on, "native")


def _native(site: Site) -> NativeFront:
    native = site.gw.service.native
    assert native is not None
    return native


async def _exchange(c: Raw, lines: list[str]) -> tuple[int, dict[str, str], bytes]:
    c.w.write(("\r\n".join(lines) + "\r\n\r\n").encode())
    return await c.response()


def test_an_app_cannot_hand_the_front_a_pass(on_native: Callable[[Scenario], None]) -> None:
    on_native(_app_plants_a_pass)


async def _app_plants_a_pass(site: Site) -> None:
    native = _native(site)
    hits: list[bytes] = []

    async def host_service(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        hits.append(await r.read(4096))
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nhost")
        await w.drain()
        w.close()

    server = await asyncio.start_server(host_service, "127.0.0.1", 0)
    host_port = server.sockets[0].getsockname()[1]
    forged = {
        "v": 1,
        "up": f"127.0.0.1:{host_port}",
        "prefix": "",
        "creds": [],
        "proto": "http",
        "ttl": 300.0,
        "epoch": native.epoch.value,
        "tenant": "acme",
        "sandbox": "acme--web",
        "by_host": False,
    }
    value = base64.urlsafe_b64encode(json.dumps(forged).encode()).decode().rstrip("=")
    names = ["x-sandpod-pass", "x-sandpod-pass-" + "0" * 32, "x-sandpod-pass-"]
    query = "&".join(f"h={n}:{value}" for n in names)
    c = await Raw.open(site)
    try:
        status, headers, body = await c.get(f"{site.base}/headers?{query}", site.key)
        assert (status, body) == (200, b"app")
        assert f"x-sandpod-pass-{native.secret}" not in headers  # the real one stays inside
        for _ in range(3):  # the connection's next requests: to the sandbox's app, never the host
            assert (await c.get(f"{site.base}/ping", site.key))[::2] == (200, b"pong")
        assert hits == []

        async def relayed() -> bool:
            return native.relayed >= 3

        await _until(relayed, "the front to relay the kept requests", 10)
    finally:
        c.close()
        server.close()


def test_the_client_cannot_name_its_own_address(on_native: Callable[[Scenario], None]) -> None:
    on_native(_client_names_its_address)


async def _client_names_its_address(site: Site) -> None:
    """Also: the app sees the request the front relayed (the second) exactly as the one the
    gateway relayed (the first): same target, same headers, our credentials removed."""
    native = _native(site)
    lines = [
        f"POST {site.base}/echo/x?a=1&b=%20 HTTP/1.1",
        "host: gw",
        f"authorization: Bearer {site.key}",
        "x-sandpod-front-peer: 203.0.113.9:1",
        "x-forwarded-for: 198.51.100.7",
        "x-forwarded-host: evil",
        "cookie: sandpod_preview=spl1.nope; theme=dark",
        "x-app: 1",
        "content-length: 5",
    ]
    c = await Raw.open(site)
    seen = []
    try:
        for _ in range(2):
            c.w.write(("\r\n".join(lines) + "\r\n\r\nhello").encode())
            status, _, body = await c.response()
            assert status == 200, body
            seen.append(json.loads(body))

        async def relayed() -> bool:
            return native.relayed >= 1

        await _until(relayed, "the front to relay the second request", 10)
    finally:
        c.close()
    for view in seen:
        headers = {k.lower(): v for k, v in view["headers"]}
        assert headers["x-forwarded-for"] == "198.51.100.7, 127.0.0.1"
        assert headers["x-forwarded-host"] == "gw"
        assert headers["cookie"] == "theme=dark"
        assert "authorization" not in headers
        assert not any(k.startswith("x-sandpod") for k in headers)
        assert (view["method"], view["path"], view["query"]) == ("POST", "/echo/x", "a=1&b=%20")
        assert view["body_len"] == 5
    first, second = ({**v, "headers": sorted(map(tuple, v["headers"]))} for v in seen)
    assert first == second


def test_a_killed_front_is_started_again(on_native: Callable[[Scenario], None]) -> None:
    on_native(_front_killed)


async def _front_killed(site: Site) -> None:
    native = _native(site)
    proc = native._proc
    assert proc is not None and native.starts == 1
    os.kill(proc.pid, signal.SIGKILL)

    async def restarted() -> bool:
        return native.starts == 2

    await _until(restarted, "the gateway to start the front again", 20)
    c = await Raw.open(site)
    try:
        for _ in range(2):
            assert (await c.get(f"{site.base}/ping", site.key))[::2] == (200, b"pong")
    finally:
        c.close()


def test_the_fronts_requests_are_logged_and_counted(
    on_native: Callable[[Scenario], None],
) -> None:
    on_native(_fronts_requests_counted)


async def _fronts_requests_counted(site: Site) -> None:
    native = _native(site)
    registry = site.gw.service.registry
    labels = {"method": "GET", "route": "/v1/sandboxes/{name}/ports/{port}/{path}"}

    def count() -> float:
        got = registry.get_sample_value(
            "sandpod_gateway_requests_total", {**labels, "status": "200"}
        )
        return got or 0.0

    before = count()
    c = await Raw.open(site)
    try:
        for _ in range(5):
            assert (await c.get(f"{site.base}/ping", site.key))[::2] == (200, b"pong")
    finally:
        c.close()

    async def counted() -> bool:
        return count() - before == 5 and native.relayed >= 4

    await _until(counted, "five preview requests in the gateway's metrics", 10)


def test_another_local_user_cannot_reach_the_gateway_behind_the_front(
    on_native: Callable[[Scenario], None],
) -> None:
    on_native(_other_user_at_the_backend)


_CONNECT = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as exc:
    print(type(exc).__name__)
    sys.exit(3)
print("connected")
"""


async def _other_user_at_the_backend(site: Site) -> None:
    """The gateway believes the client address the front names only because nobody else can
    connect to its socket: as root (the gateway's own user) a request there names any address
    it likes; as user nobody the socket cannot even be opened."""
    native = _native(site)
    r, w = await asyncio.open_unix_connection(native.backend)
    try:
        w.write(
            (
                f"GET {site.base}/echo HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {site.key}"
                "\r\nx-sandpod-front-peer: 203.0.113.9:1\r\n\r\n"
            ).encode()
        )
        status, _, body = await Raw(r, w).response()
        assert status == 200, body
        seen = {k.lower(): v for k, v in json.loads(body)["headers"]}
        assert seen["x-forwarded-for"] == "203.0.113.9"  # what the socket's mode protects
    finally:
        w.close()
    python = "/usr/bin/python3"
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python]
    done = await asyncio.create_subprocess_exec(
        *as_nobody, "-c", _CONNECT, native.backend, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await done.communicate()
    assert (done.returncode, out.strip()) == (3, b"PermissionError"), out
