"""Preview URL parts on their own (the fast layer under test_preview.py): signed links on a fake
clock, route matching, the gateway's credentials stripped, and the upstream pool's bounds on real
loopback sockets."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from gateway_harness import GatewayFactory, start_gateway  # noqa: F401

from sandpod_gateway.errors import LinkExpired, LinkInvalid, PortUnreachable
from sandpod_gateway.links import LinkSigner
from sandpod_gateway.preview import _strip_cookie, _strip_token, _token
from sandpod_gateway.proxy import ConnectionPool
from sandpod_gateway.settings import GatewaySettings
from sandpod_gateway.targets import public_ports, tenant_of
from sandpod_gateway.upconn import UpstreamPool

__all__: list[str] = []

SECRET = b"s" * 32


def test_a_link_opens_its_port_until_it_expires() -> None:
    """Verified for its sandbox and port; refused as expired once the clock passes it."""
    now = [1000.0]
    signer = LinkSigner(SECRET, lambda: now[0])
    link = signer.sign("acme", "0123456789ab", "acme--web", 8000, 60)
    token = signer.token(link)
    assert signer.verify(token, "acme--web", 8000) == link
    now[0] += 61
    with pytest.raises(LinkExpired):
        signer.verify(token, "acme--web", 8000)


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"),  # the MAC
        lambda t: t.replace(".8000.", ".8001."),  # the port, MAC kept
        lambda t: t.replace("acme--web", "acme--wed"),  # the sandbox, MAC kept
        lambda t: t.replace(".1060.", ".9999999999."),  # a later expiry, MAC kept
        lambda t: "spl1.garbage",
    ],
)
def test_an_altered_link_is_invalid_whatever_it_claims(change: Any) -> None:
    """Any change to a token (or another secret) makes it invalid, even if it claims a future
    expiry."""
    signer = LinkSigner(SECRET, lambda: 1000.0)
    token = signer.token(signer.sign("acme", "0123456789ab", "acme--web", 8000, 60))
    altered = change(token)
    with pytest.raises(LinkInvalid):
        signer.verify(altered, "acme--web", 8000)
    with pytest.raises(LinkInvalid):
        LinkSigner(b"t" * 32, lambda: 1000.0).verify(token, "acme--web", 8000)


def test_a_link_for_another_port_or_sandbox_is_invalid() -> None:
    signer = LinkSigner(SECRET, lambda: 1000.0)
    token = signer.token(signer.sign("acme", "0123456789ab", "acme--web", 8000, 60))
    for sid, port in (("acme--web", 8001), ("acme--other", 8000), ("web", 8000)):
        with pytest.raises(LinkInvalid):
            signer.verify(token, sid, port)


def test_only_the_gateways_token_and_cookie_are_stripped() -> None:
    """The app's own ``token`` parameter and cookies pass; ours do not."""
    assert _strip_token(b"a=1&token=spl1.x.y&token=app&b=2") == "a=1&token=app&b=2"
    assert _strip_cookie(b"theirs=1; sandpod_preview=spl1.x; other=2") == b"theirs=1; other=2"
    scope = {"query_string": b"token=abc", "headers": [(b"cookie", b"sandpod_preview=spl1.q")]}
    assert _token(scope) == ("spl1.q", False)  # the app's ?token=abc is not ours
    scope["query_string"] = b"token=spl1.z"
    assert _token(scope) == ("spl1.z", True)


def test_ids_name_their_tenant_and_the_annotation_its_ports() -> None:
    assert tenant_of("acme--web") == "acme" and tenant_of("web") == "default"
    assert tenant_of("Bad--") is None and tenant_of("a--b--c") is None
    assert public_ports({"sandpod.dev/public-ports": "8000,x,70000,3000"}) == {3000, 8000}
    assert public_ports(None) == frozenset()


def test_a_preview_domain_must_be_a_dns_name() -> None:
    s = GatewaySettings.from_env({"SANDPOD_GATEWAY_PREVIEW_DOMAIN": "Preview.Example.com."})
    assert s.preview_domain == "preview.example.com"
    with pytest.raises(ValueError, match="DNS name"):
        GatewaySettings.from_env({"SANDPOD_GATEWAY_PREVIEW_DOMAIN": "bad domain"})


async def test_the_pool_keeps_a_bounded_number_of_idle_connections() -> None:
    """Idle connections are reused, capped per target and in all (least recently used target
    first), and a closed port is PortUnreachable."""
    accepted: list[asyncio.StreamWriter] = []

    async def on_conn(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        accepted.append(w)

    servers = [await asyncio.start_server(on_conn, "127.0.0.1", 0) for _ in range(3)]
    ports = [s.sockets[0].getsockname()[1] for s in servers]
    pool = ConnectionPool(1.0, max_idle=2, max_total=3)
    try:
        first = await pool.acquire("127.0.0.1", ports[0])
        pool.release(first, True)
        again = await pool.acquire("127.0.0.1", ports[0])
        assert again is first and again.reused
        conns = [await pool.acquire("127.0.0.1", p) for p in (ports[0], ports[0], ports[0])]
        for c in conns:
            pool.release(c, True)
        assert len(pool._idle) == 2  # per target
        more = [await pool.acquire("127.0.0.1", p) for p in (ports[1], ports[2])]
        for c in more:
            pool.release(c, True)
        assert len(pool._idle) == 3 and pool._idle.targets() == [(("127.0.0.1", ports[0]))] + [
            ("127.0.0.1", p) for p in ports[1:]
        ]
        pool.release(await pool.acquire("127.0.0.1", ports[2], fresh=True), True)
        assert len(pool._idle) == 3 and ("127.0.0.1", ports[0]) not in pool._idle.targets()
        free = servers[0].sockets[0].getsockname()[1]
        servers[0].close()
        await servers[0].wait_closed()
        with pytest.raises(PortUnreachable):
            await ConnectionPool(1.0).acquire("127.0.0.1", free)
    finally:
        pool.close()
        for s in servers:
            s.close()
        for w in accepted:
            w.close()


async def test_the_fast_paths_pool_keeps_a_bounded_number_of_idle_connections() -> None:
    """The fast path's pool (``upconn.UpstreamPool``): an idle connection is reused, one the
    server closed is not, at most ``max_idle`` per target and ``max_total`` in all (the least
    recently used target's go), and a closed port is PortUnreachable."""
    accepted: list[asyncio.StreamWriter] = []

    async def on_conn(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        accepted.append(w)

    servers = [await asyncio.start_server(on_conn, "127.0.0.1", 0) for _ in range(3)]
    ports = [s.sockets[0].getsockname()[1] for s in servers]
    pool = UpstreamPool(1.0, max_idle=2, max_total=3)
    try:
        first = await pool.connect("127.0.0.1", ports[0])
        pool.release(first, True)
        again = pool.idle("127.0.0.1", ports[0])
        assert again is first and again.reused
        assert pool.idle("127.0.0.1", ports[0]) is None
        conns = [await pool.connect("127.0.0.1", ports[0]) for _ in range(3)]
        for c in conns:
            pool.release(c, True)
        assert len(pool._idle) == 2 and conns[2].closed  # per target
        for p in ports[1:]:
            pool.release(await pool.connect("127.0.0.1", p), True)
        # in all: the least recently used target's connections went first
        assert len(pool._idle) == 3 and pool._idle.targets() == [("127.0.0.1", p) for p in ports]
        assert pool._idle.count(("127.0.0.1", ports[0])) == 1
        pool.release(await pool.connect("127.0.0.1", ports[2]), True)
        assert len(pool._idle) == 3 and ("127.0.0.1", ports[0]) not in pool._idle.targets()
        while accepted:  # the servers close every connection: none is handed out again
            accepted.pop().close()
        for _ in range(100):  # the loop delivers the closes
            if all(c.closed for c in pool._idle):
                break
            await asyncio.sleep(0.01)
        assert all(pool.idle("127.0.0.1", p) is None for p in ports)
        free = ports[0]
        servers[0].close()
        await servers[0].wait_closed()
        with pytest.raises(PortUnreachable):
            await UpstreamPool(1.0).connect("127.0.0.1", free)
    finally:
        pool.close()
        for s in servers:
            s.close()
        for w in accepted:
            w.close()


def test_the_fast_path_can_be_switched_off() -> None:
    assert GatewaySettings.from_env({}).preview_fast_path
    off = {"SANDPOD_GATEWAY_PREVIEW_FAST_PATH": "false"}
    assert not GatewaySettings.from_env(off).preview_fast_path


async def test_lookups_without_credentials_are_rate_limited(start_gateway: GatewayFactory) -> None:
    """Made-up sandbox ids without credentials cost control-plane reads: past the burst they
    get 429 with Retry-After, before any read."""
    gw = await start_gateway(prefix=f"q{uuid.uuid4().hex[:8]}", rate=0.001, burst=3)
    async with gw.client() as anon:
        codes = [
            (await anon.get(f"/v1/sandboxes/made-up-{i}/ports/80/")).status_code for i in range(5)
        ]
        r = await anon.get("/v1/sandboxes/made-up-9/ports/80/")
    assert codes[:3] == [503, 503, 503]  # no lifecycle on this prefix: a retryable 503
    assert codes[3:] == [429, 429] and r.status_code == 429
    assert r.json()["code"] == "busy.rate_limited" and int(r.headers["retry-after"]) >= 1


def test_a_host_url_is_given_only_when_its_label_fits_in_dns() -> None:
    """``{port}-{id}`` must be one DNS label (63 characters): a long id gets no host URL but
    the reason, never a name no resolver or browser accepts."""
    from sandpod_gateway.handlers.previews import host_url

    assert host_url("https://gw.example:8443", "preview.example", "t1--web", 8000) == (
        "https://8000-t1--web.preview.example:8443/",
        None,
    )
    assert host_url("http://gw", None, "t1--web", 8000) == (None, None)
    long_id = "t1--" + "a" * 58  # a valid id; with "65535-" the label has 68 characters
    url, reason = host_url("http://gw", "preview.example", long_id, 65535)
    assert url is None and reason is not None and "63" in reason
    fits = "t1--" + "a" * 53  # 63 with "8000-"
    assert host_url("http://gw", "d.example", fits, 8000)[0] == f"http://8000-{fits}.d.example/"
