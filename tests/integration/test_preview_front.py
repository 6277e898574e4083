"""The gateway's front protocol (``sandpod_gateway.front``): preview requests relayed on the fast
path, everything else handed to uvicorn, on raw keep-alive connections whose bytes the test
controls.

The gateway runs in this process on uvloop, as ``python -m sandpod_gateway`` does (uvloop's
transports behave differently from asyncio's: a check that passed on asyncio broke every
connection under uvloop): each test runs its scenario in ``uvloop.run``. The app is
``bench/_preview_app.py`` in a process-runtime sandbox.

Attacks: an app that writes a second, forged response after its real one (it must never reach
the client, whose connection the next request -- for any sandbox -- may use); refusals and
credentials on a kept connection; a request body the gateway refuses; a kept connection that
goes on using an admission after its key was revoked or its port made private again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import time
from collections.abc import Awaitable, Callable

import pytest
import uvloop
from gateway_harness import Gateway, close_gateway, mint_key, open_gateway
from test_preview import Site, _site, _until, lifecycle_on  # noqa: F401

from conftest import NatsServer
from sandpod_gateway.keys import KeyStore
from sandpod_gateway.preview import PreviewGate

__all__: list[str] = []

Scenario = Callable[[Site], Awaitable[None]]


class Raw:
    """One keep-alive HTTP/1.1 connection to the gateway, spoken byte by byte."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.r, self.w = reader, writer

    @classmethod
    async def open(cls, site: Site) -> Raw:
        port = int(site.gw.url.rsplit(":", 1)[1])
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    def send(self, method: str, path: str, key: str | None, body: bytes = b"") -> None:
        lines = [f"{method} {path} HTTP/1.1", "host: gw"]
        if key:
            lines.append(f"authorization: Bearer {key}")
        if body:
            lines.append(f"content-length: {len(body)}")
        self.w.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)

    async def response(self) -> tuple[int, dict[str, str], bytes]:
        """The next response: status, headers (lowercased names), body."""
        async with asyncio.timeout(30):
            raw = await self.r.readuntil(b"\r\n\r\n")
            lines = raw.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ")[1])
            headers = {}
            for line in lines[1:]:
                if line:
                    k, _, v = line.partition(":")
                    headers[k.strip().lower()] = v.strip()
            if "content-length" in headers:
                return status, headers, await self.r.readexactly(int(headers["content-length"]))
            if headers.get("transfer-encoding") == "chunked":
                body = b""
                while size := int((await self.r.readuntil(b"\r\n")).split(b";")[0], 16):
                    body += await self.r.readexactly(size)
                    await self.r.readexactly(2)
                await self.r.readuntil(b"\r\n")
                return status, headers, body
            return status, headers, await self.r.read()

    async def get(self, path: str, key: str | None) -> tuple[int, dict[str, str], bytes]:
        self.send("GET", path, key)
        return await self.response()

    async def closed(self) -> bool:
        """Whether the gateway closed the connection (EOF within 10 s)."""
        async with asyncio.timeout(10):
            return await self.r.read() == b""

    def close(self) -> None:
        self.w.close()


def _runner(
    nats: NatsServer, lifecycle_on: Callable[[str], str], front: str
) -> Callable[..., None]:
    def run(scenario: Scenario, **settings: object) -> None:
        async def main() -> None:
            assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
            started: list[Gateway] = []

            async def start(**overrides: object) -> Gateway:
                overrides.setdefault("preview_front", front == "native")
                started.append(await open_gateway(nats.url, clock=time.time, **overrides))
                if front == "native":
                    assert started[-1].service.native is not None, (
                        "sandpod-front is not installed: `make install` builds it (needs cargo)"
                    )
                return started[-1]

            try:
                await scenario(await _site(start, lifecycle_on, "process", **settings))
            finally:
                for gw in started:
                    await close_gateway(gw)

        uvloop.run(main())

    return run


@pytest.fixture(params=["native", "python"])
def on_uvloop(
    request: pytest.FixtureRequest, nats: NatsServer, lifecycle_on: Callable[[str], str]
) -> Callable[..., None]:
    """Run a scenario on uvloop against a site (a lifecycle, an in-process gateway, the app);
    keyword arguments are the gateway's settings. Twice: behind the native front
    (sandpod-front, native.py) and with the gateway's own front.py taking the connections."""
    return _runner(nats, lifecycle_on, request.param)


@pytest.fixture
def on_uvloop_python(nats: NatsServer, lifecycle_on: Callable[[str], str]) -> Callable[..., None]:
    """:func:`on_uvloop` with front.py taking the connections (its own internals under test)."""
    return _runner(nats, lifecycle_on, "python")


def test_an_apps_forged_second_response_never_reaches_the_client(
    on_uvloop: Callable[[Scenario], None],
) -> None:
    on_uvloop(_forged_second_response)


async def _forged_second_response(site: Site) -> None:
    # first on its connection (admitted afresh), then on a kept admission (behind the native
    # front: relayed by the front itself, on its own upstream connection)
    for warm in (False, True):
        c = await Raw.open(site)
        try:
            if warm:
                assert (await c.get(f"{site.base}/ping", site.key))[::2] == (200, b"pong")
            status, _, body = await c.get(f"{site.base}/smuggle", site.key)
            assert (status, body) == (200, b"ok")
            # the same client connection, next request: the app's real answer, not the forgery
            status, _, body = await c.get(f"{site.base}/ping", site.key)
            assert (status, body) == (200, b"pong")
            status, _, body = await c.get(f"{site.base}/echo?n=2", site.key)
            assert status == 200
            assert json.loads(body)["query"] == "n=2"
        finally:
            c.close()


def test_a_connection_goes_on_after_responses_its_client_read_slowly(
    on_uvloop: Callable[[Scenario], None],
) -> None:
    on_uvloop(_slow_reader_goes_on)


async def _slow_reader_goes_on(site: Site) -> None:
    """A client with a tiny receive buffer keeps the gateway's writes backed up, so a response
    ends in the read that fills the buffer: the upstream connection it came on, kept for the
    next request, must read that request's response (it was left paused: the next request on
    the connection hung, ~half of the runs behind the native front)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", int(site.gw.url.rsplit(":", 1)[1])))
    sock.setblocking(False)
    c = Raw(*await asyncio.open_connection(sock=sock, limit=1 << 16))
    size = 4 << 20
    try:
        for _ in range(4):
            status, _, body = await c.get(f"{site.base}/bytes?n={size}", site.key)
            assert (status, len(body)) == (200, size)
            assert (await c.get(f"{site.base}/ping", site.key))[::2] == (200, b"pong")
    finally:
        c.close()


def test_pipelined_requests_are_answered_in_order(on_uvloop: Callable[[Scenario], None]) -> None:
    on_uvloop(_pipelined_requests_are_answered_in_order)


async def _pipelined_requests_are_answered_in_order(site: Site) -> None:
    c = await Raw.open(site)
    try:
        for i in range(5):  # one write would do too; the gateway must not care
            c.send("GET", f"{site.base}/echo?i={i}", site.key)
        for i in range(5):
            status, headers, body = await c.response()
            assert status == 200
            assert json.loads(body)["query"] == f"i={i}"
            assert headers["x-request-id"]
    finally:
        c.close()


def test_one_connection_carries_previews_and_api_calls(
    on_uvloop: Callable[[Scenario], None],
) -> None:
    on_uvloop(_one_connection_carries_previews_and_api_calls)


async def _one_connection_carries_previews_and_api_calls(site: Site) -> None:
    """A preview, then an API call (the connection goes on to uvicorn from that request's
    first byte), then a preview again (now through uvicorn's path)."""
    c = await Raw.open(site)
    try:
        assert (await c.get(f"{site.base}/ping", site.key))[::2] == (200, b"pong")
        status, _, body = await c.get("/v1/sandboxes", site.key)
        assert status == 200, body
        assert "web" in [s["metadata"]["name"] for s in json.loads(body)["items"]]
        assert (await c.get(f"{site.base}/ping", site.key))[::2] == (200, b"pong")
    finally:
        c.close()


def test_refusals_keep_a_connection_in_step(on_uvloop: Callable[[Scenario], None]) -> None:
    on_uvloop(_refusals_keep_a_connection_in_step)


async def _refusals_keep_a_connection_in_step(site: Site) -> None:
    """Another tenant's key (404, as for a missing sandbox), no key (401), a revoked-looking
    key (401): each answered on the same connection, which then carries a good request."""
    stranger = await mint_key(site.gw, "evil")
    c = await Raw.open(site)
    try:
        status, _, body = await c.get(f"{site.base}/ping", stranger)
        assert status == 404, body
        assert json.loads(body)["code"] == "sandbox.not_found"
        status, headers, body = await c.get(f"{site.base}/ping", None)
        assert status == 401, body
        assert headers["www-authenticate"].startswith("Bearer")
        status, _, _ = await c.get(f"{site.base}/ping", "spk_000000000000_" + "0" * 48)
        assert status == 401
        assert (await c.get(f"{site.base}/ping", site.key))[::2] == (200, b"pong")
        # a refused request's body is never read: the gateway closes rather than guess
        c.send("POST", f"{site.base}/upload", stranger, b"x" * 100)
        assert (await c.response())[0] == 404
        assert await c.closed()
    finally:
        c.close()


def test_a_kept_connection_is_admitted_afresh_when_its_grounds_change(
    on_uvloop: Callable[..., None],
) -> None:
    # the Sandbox records cached for 5 minutes: a revoked key is refused because its record
    # left the key cache, not because the Sandbox's expired
    on_uvloop(_kept_connection_admitted_afresh, preview_cache_ttl=300.0)


async def _kept_connection_admitted_afresh(site: Site) -> None:
    """A connection keeps its last admission for its next requests (no key check per request):
    other credentials, another sandbox, a revoked key or a port made private again on that same
    connection are each decided afresh."""
    owner = await mint_key(site.gw, "acme")  # site.key is revoked below; this one stays
    stranger = await mint_key(site.gw, "evil")
    c = await Raw.open(site)
    anon = await Raw.open(site)
    try:
        for _ in range(3):
            assert (await c.get(f"{site.base}/ping", site.key))[::2] == (200, b"pong")
        native = site.gw.service.native
        if native is not None:  # the kept ones went client -> front -> app

            async def relayed() -> bool:
                return native.relayed >= 2

            await _until(relayed, "the front to report its relays", 10)
        assert (await c.get(f"{site.base}/ping", stranger))[0] == 404
        assert (await c.get(f"{site.base}/ping", None))[0] == 401
        assert (await c.get(f"{site.base}/ping", site.key))[::2] == (200, b"pong")
        other = f"/v1/sandboxes/evil--web/ports/{site.port}/ping"  # the same key elsewhere
        assert (await c.get(other, site.key))[0] == 404
        assert (await c.get(f"{site.base}/ping", site.key))[::2] == (200, b"pong")
        store = await KeyStore.open(site.gw.bus, site.gw.service.settings.bucket_base)
        await store.revoke(site.key.split("_")[1])

        async def revoked() -> bool:
            return (await c.get(f"{site.base}/ping", site.key))[0] == 401

        await _until(revoked, "the revoked key to be refused on the kept connection", 10)
        async with site.gw.client(owner) as api:
            r = await api.post(
                "/v1/sandboxes/web/previews", json={"port": site.port, "public": True}
            )
            assert r.status_code == 201, r.text
            for _ in range(3):
                assert (await anon.get(f"{site.base}/ping", None))[::2] == (200, b"pong")
            r = await api.delete(f"/v1/sandboxes/web/previews/{site.port}")
            assert r.status_code == 200, r.text
        # this replica forgets its record of the Sandbox at once: so does the kept connection
        assert (await anon.get(f"{site.base}/ping", None))[0] == 401
    finally:
        c.close()
        anon.close()


def test_a_bug_in_the_relay_ends_its_request_with_a_500_not_the_gateway(
    on_uvloop_python: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step that raises (here: building the upstream head) answers that request with a typed
    500 and closes its connection, on both paths a request takes (its connection's first,
    admitted by a task; a later one, from ``data_received``); other connections go on."""
    broken = [False]
    real = PreviewGate.upstream_headers

    def upstream_headers(self: PreviewGate, *args: object) -> list[tuple[bytes, bytes]]:
        if broken[0]:
            raise RuntimeError("a bug")
        return real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(PreviewGate, "upstream_headers", upstream_headers)

    async def scenario(site: Site) -> None:
        ping = f"{site.base}/ping"
        for first in (False, True):
            broken[0] = False
            c = await Raw.open(site)
            try:
                if not first:
                    assert (await c.get(ping, site.key))[::2] == (200, b"pong")
                broken[0] = True
                status, _, body = await c.get(ping, site.key)
                assert (status, json.loads(body)["code"]) == (500, "internal"), body
                assert await c.closed()
            finally:
                c.close()
        broken[0] = False
        c = await Raw.open(site)
        try:
            assert (await c.get(ping, site.key))[::2] == (200, b"pong")
        finally:
            c.close()

    on_uvloop_python(scenario)


def test_bodies_go_up_exactly_and_unframed_bodies_end_at_close(
    on_uvloop: Callable[[Scenario], None],
) -> None:
    on_uvloop(_bodies_go_up_exactly_and_unframed_bodies_end_at_close)


async def _bodies_go_up_exactly_and_unframed_bodies_end_at_close(site: Site) -> None:
    c = await Raw.open(site)
    try:
        body = bytes(range(256)) * 4000  # 1 MB: several reads, the upstream's buffer fills
        c.send("POST", f"{site.base}/upload", site.key, body)
        status, _, answer = await c.response()
        assert status == 200
        assert json.loads(answer) == {
            "sha256": hashlib.sha256(body).hexdigest(),
            "length": len(body),
        }
        # no length, no chunks: the app's close ends the body; the client gets it chunked
        # and keeps its connection
        status, headers, answer = await c.get(f"{site.base}/unframed", site.key)
        assert (status, answer) == (200, b"until the end")
        assert headers["transfer-encoding"] == "chunked"
        assert (await c.get(f"{site.base}/ping", site.key))[::2] == (200, b"pong")
    finally:
        c.close()


def test_an_app_that_hangs_up_gives_a_typed_502(on_uvloop: Callable[[Scenario], None]) -> None:
    on_uvloop(_an_app_that_hangs_up_gives_a_typed_502)


async def _an_app_that_hangs_up_gives_a_typed_502(site: Site) -> None:
    c = await Raw.open(site)
    try:
        status, _, body = await c.get(f"{site.base}/hangup", site.key)
        assert status == 502
        assert json.loads(body)["code"] == "sandbox.port_unreachable"
        assert await c.closed()
    finally:
        c.close()
    c = await Raw.open(site)  # cut after its head: the client's response is cut off too
    try:
        c.send("GET", f"{site.base}/cut", site.key)
        async with asyncio.timeout(30):
            head = await c.r.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200") and b"content-length: 100" in head
            assert await c.r.read() == b"0123456789"  # then the end: never a reused stream
    finally:
        c.close()
    c = await Raw.open(site)  # the gateway itself is unharmed
    try:
        assert (await c.get(f"{site.base}/ping", site.key))[::2] == (200, b"pong")
    finally:
        c.close()
