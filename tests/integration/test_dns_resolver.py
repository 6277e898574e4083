"""The node's policy DNS resolver on real sockets, attacked from where a sandbox sits.

Every query is a real UDP or TCP packet from a "sandbox" source address to the resolver, which
asks a real authoritative server (tests/dnsauth.py). ``auth.asked_for`` shows what reached
"the internet": a denied name must never get there.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
from collections.abc import AsyncIterator

import dns.asyncquery
import dns.edns
import dns.exception
import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset
import pytest
from dns_harness import FakeSink, Harness, ede_of, policy, rcode
from prometheus_client import CollectorRegistry

from sandpod_contract.network import NetworkPolicy
from sandpod_lifecycle.network.metrics import NetworkMetrics
from sandpod_lifecycle.network.resolver import NodeResolver, ResolverSettings
from sandpod_lifecycle.network.sandboxnet import DenialKind, SandboxNet

BLOCKED = int(dns.edns.EDECode.BLOCKED)


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    harness = await Harness.start()
    auth = harness.auth
    auth.add("open.test", "A", 300, "11.22.0.1")
    auth.add("open.test", "AAAA", 300, "2a00:1450::1")
    auth.add("evil.test", "A", 300, "11.22.0.66")
    auth.add("*.wild.test", "A", 300, "11.22.0.7")
    auth.add("wild.test", "A", 300, "11.22.0.8")
    auth.add("api.corp.test", "A", 300, "11.22.0.9")
    auth.add("secret.corp.test", "A", 300, "11.22.0.10")
    auth.add("rebind.test", "A", 300, "127.0.0.1")
    auth.add("meta.test", "A", 300, "169.254.169.254")
    auth.add("lan.test", "A", 300, "10.1.2.3")
    auth.add("mixed.test", "A", 300, "11.22.0.5", "10.0.0.1", "192.168.1.1")
    auth.add("alias.test", "CNAME", 300, "evil.test.")
    auth.add("cdn-alias.test", "CNAME", 300, "edge.cdn.test.")
    auth.add("edge.cdn.test", "A", 300, "11.22.0.12")
    yield harness
    await harness.close()


def addresses(response: dns.message.Message) -> list[str]:
    return sorted(
        rd.address
        for rrset in response.answer
        if rrset.rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA)
        for rd in rrset
    )


async def test_public_name_is_answered(h: Harness) -> None:
    """A sandbox in public mode resolves a public name; the proxy's map records it."""
    source = h.sandbox(policy("public"), "sbx-a")
    response = await h.ask(source, "open.test")
    assert rcode(response) == "NOERROR"
    assert addresses(response) == ["11.22.0.1"]
    assert h.resolver.resolved_names("sbx-a", "11.22.0.1") == {"open.test"}
    assert h.resolver.resolved_names("sbx-b", "11.22.0.1") == set()
    assert h.sink.calls == []  # public mode: the firewall's public rule covers it, no sets


async def test_an_injected_names_addresses_go_to_the_injection_set_in_public_mode(
    h: Harness,
) -> None:
    """Public mode with ``inject`` for api.corp.test: its answer goes to the sandbox's
    injection set (through the proxy, which adds the header); any other name's does not, nor
    does a CNAME chain's; an allowlist sandbox's goes there besides its rule's set."""
    inject = [{"domain": "api.corp.test", "secret": "tok"}]
    public = NetworkPolicy.from_dict({"mode": "public", "inject": inject})
    source = h.sandbox(public, "sbx-inject")
    assert addresses(await h.ask(source, "api.corp.test")) == ["11.22.0.9"]
    assert h.sink.injected == [("sbx-inject", [("11.22.0.9", 300)])]
    for other in ("open.test", "secret.corp.test", "cdn-alias.test"):
        assert rcode(await h.ask(source, other)) == "NOERROR"
    assert len(h.sink.injected) == 1 and h.sink.calls == []
    listed = NetworkPolicy.from_dict(
        {"mode": "allowlist", "allow": ["api.corp.test:443"], "inject": inject}
    )
    source = h.sandbox(listed, "sbx-listed")
    assert addresses(await h.ask(source, "api.corp.test")) == ["11.22.0.9"]
    assert h.sink.injected[-1] == ("sbx-listed", [("11.22.0.9", 300)])
    assert [(c[0], c[1].text) for c in h.sink.calls] == [("sbx-listed", "api.corp.test:443")]


async def test_allowed_name_reaches_the_sink_before_the_reply(h: Harness) -> None:
    """Allowlist: the answer's addresses are in the sink before the client has any reply."""
    source = h.sandbox(policy("allowlist", ["open.test:443"]), "sbx-allow")
    h.sink.gate = asyncio.Event()
    query = dns.message.make_query("open.test", "A")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
        client.bind((source, 0))
        client.setblocking(False)
        client.sendto(query.to_wire(), (h.host, h.port))
        await asyncio.wait_for(h.sink.called.wait(), 10)
        # the sink holds the reply: nothing may have been sent yet
        with pytest.raises(BlockingIOError):
            client.recv(4096)
        h.sink.gate.set()
        loop = asyncio.get_running_loop()
        wire = await asyncio.wait_for(loop.sock_recv(client, 4096), 10)
    response = dns.message.from_wire(wire)
    assert addresses(response) == ["11.22.0.1"]
    [(sandbox_id, rule, opened)] = h.sink.calls
    assert sandbox_id == "sbx-allow"
    assert rule.text == "open.test:443" and rule.ports is not None
    assert opened == [("11.22.0.1", 300)]


async def test_denied_name_is_refused_with_event_and_metric(h: Harness) -> None:
    """Allowlist: a name no rule allows is REFUSED (EDE Blocked), never asked upstream."""
    source = h.sandbox(policy("allowlist", ["open.test"]), "sbx-deny")
    response = await h.ask(source, "evil.test")
    assert rcode(response) == "REFUSED"
    code, text = ede_of(response) or (None, None)
    assert code == BLOCKED and text is not None and "mode:allowlist" in text
    assert h.auth.asked_for("evil.test") == 0
    assert [(d.sandbox_id, d.kind, d.destination) for d in h.denials] == [
        ("sbx-deny", DenialKind.DNS, "evil.test")
    ]
    assert h.metric("sandpod_lifecycle_network_denied_total", kind="dns") == 1
    assert h.sink.calls == []


async def test_wildcard_rule_covers_subdomains_not_apex(h: Harness) -> None:
    """``*.wild.test`` allows any name below it, and not ``wild.test`` itself."""
    source = h.sandbox(policy("allowlist", ["*.wild.test"]))
    assert addresses(await h.ask(source, "deep.down.wild.test")) == ["11.22.0.7"]
    assert addresses(await h.ask(source, "A.WILD.TEST")) == ["11.22.0.7"]
    assert rcode(await h.ask(source, "wild.test")) == "REFUSED"
    assert rcode(await h.ask(source, "wild.test.evil.test")) == "REFUSED"


async def test_deny_beats_allow(h: Harness) -> None:
    """A deny rule wins over an allow wildcard that also covers the name."""
    source = h.sandbox(policy("allowlist", ["*.corp.test"], deny=["secret.corp.test"]))
    assert addresses(await h.ask(source, "api.corp.test")) == ["11.22.0.9"]
    response = await h.ask(source, "secret.corp.test")
    assert rcode(response) == "REFUSED"
    assert "secret.corp.test" in str((ede_of(response) or (0, ""))[1])
    assert h.auth.asked_for("secret.corp.test") == 0


async def test_deny_rule_in_public_mode(h: Harness) -> None:
    """Public mode with a deny rule: that name is refused, everything else resolves."""
    source = h.sandbox(policy("public", deny=["evil.test"]))
    assert rcode(await h.ask(source, "evil.test")) == "REFUSED"
    assert addresses(await h.ask(source, "open.test")) == ["11.22.0.1"]


async def test_cname_to_a_denied_name_is_refused(h: Harness) -> None:
    """An allowed name whose CNAME leads to a denied name is refused whole."""
    source = h.sandbox(policy("public", deny=["evil.test"]))
    response = await h.ask(source, "alias.test")
    assert rcode(response) == "REFUSED"
    assert addresses(response) == []


async def test_cname_chain_of_an_allowed_name_opens_its_addresses(h: Harness) -> None:
    """Allowlist: an allowed name behind a CDN CNAME resolves; the CDN's address is opened
    under the allowing rule and recorded for both names."""
    source = h.sandbox(policy("allowlist", ["cdn-alias.test"]), "sbx-cdn")
    response = await h.ask(source, "cdn-alias.test")
    assert addresses(response) == ["11.22.0.12"]
    assert [(c[1].text, c[2]) for c in h.sink.calls] == [("cdn-alias.test", [("11.22.0.12", 300)])]
    assert h.resolver.resolved_names("sbx-cdn", "11.22.0.12") == {
        "cdn-alias.test",
        "edge.cdn.test",
    }


@pytest.mark.parametrize("name", ["rebind.test", "meta.test", "lan.test"])
async def test_rebinding_answer_is_refused(h: Harness, name: str) -> None:
    """Public mode: a public name answering loopback, metadata or a private address is
    REFUSED (not an empty answer), with a rebinding event."""
    source = h.sandbox(policy("public"), "sbx-rebind")
    response = await h.ask(source, name)
    assert rcode(response) == "REFUSED"
    assert addresses(response) == []
    assert (ede_of(response) or (0, ""))[0] == BLOCKED
    assert [d.kind for d in h.denials] == [DenialKind.REBINDING]
    assert h.metric("sandpod_lifecycle_network_denied_total", kind="rebinding") == 1
    assert h.resolver.resolved_names("sbx-rebind", "127.0.0.1") == set()


async def test_rebinding_records_are_removed_from_a_mixed_answer(h: Harness) -> None:
    """Public mode: private addresses are cut from an answer, public ones stay."""
    source = h.sandbox(policy("public"))
    response = await h.ask(source, "mixed.test")
    assert rcode(response) == "NOERROR"
    assert addresses(response) == ["11.22.0.5"]


async def test_allowlist_never_opens_a_private_address_by_name(h: Harness) -> None:
    """Allowlist: an allowed name cannot open 10.x/192.168.x in the firewall by answering it,
    unless a CIDR rule allows that range too."""
    source = h.sandbox(policy("allowlist", ["mixed.test"]))
    assert addresses(await h.ask(source, "mixed.test")) == ["11.22.0.5"]
    assert [a for call in h.sink.calls for a, _ in call[2]] == ["11.22.0.5"]
    h.sink.calls.clear()
    inside = h.sandbox(policy("allowlist", ["mixed.test", "10.0.0.0/8"]))
    assert addresses(await h.ask(inside, "mixed.test")) == ["10.0.0.1", "11.22.0.5"]
    assert sorted(a for call in h.sink.calls for a, _ in call[2]) == ["10.0.0.1", "11.22.0.5"]
    metadata = h.sandbox(policy("allowlist", ["meta.test", "169.254.0.0/16"]))
    assert rcode(await h.ask(metadata, "meta.test")) == "REFUSED"  # no rule opens metadata


async def test_unknown_source_is_refused(h: Harness) -> None:
    """A source address that is no sandbox gets REFUSED (EDE Prohibited), nothing upstream."""
    response = await h.ask("127.0.0.1", "open.test")
    assert rcode(response) == "REFUSED"
    assert (ede_of(response) or (0, ""))[0] == int(dns.edns.EDECode.PROHIBITED)
    assert h.auth.asked_for("open.test") == 0


async def test_deny_all_refuses_everything(h: Harness) -> None:
    """deny-all: every name and type is refused, none asked upstream."""
    source = h.sandbox(policy("deny-all"))
    for name, rdtype in [("open.test", "A"), ("open.test", "AAAA"), ("open.test", "TXT")]:
        assert rcode(await h.ask(source, name, rdtype)) == "REFUSED"
    assert rcode(await h.ask(source, "open.test", tcp=True)) == "REFUSED"
    assert h.auth.asked == []


async def test_policy_change_is_seen_on_the_next_query(h: Harness) -> None:
    """The lookup is live: an allowed (and cached) name is refused right after an update,
    and allowed again right after the reverse update."""
    source = h.sandbox(policy("allowlist", ["open.test"]), "sbx-live")
    assert addresses(await h.ask(source, "open.test")) == ["11.22.0.1"]
    h.sandboxes[source] = h.sandboxes[source].__class__("sbx-live", policy("deny-all"))
    assert rcode(await h.ask(source, "open.test")) == "REFUSED"
    h.sandboxes[source] = h.sandboxes[source].__class__("sbx-live", policy("public"))
    assert rcode(await h.ask(source, "open.test")) == "NOERROR"


async def test_cache_honours_ttl(h: Harness) -> None:
    """An answer is served from the cache until its TTL runs out (on the resolver's clock),
    with the TTL counting down; then the upstream is asked again."""
    h.auth.add("short.test", "A", 60, "11.22.0.20")
    source = h.sandbox(policy("public"))
    first = await h.ask(source, "short.test")
    assert first.answer[0].ttl == 60
    h.clock.now += 45
    second = await h.ask(source, "short.test")
    assert addresses(second) == ["11.22.0.20"]
    assert second.answer[0].ttl == 15
    assert h.auth.asked_for("short.test") == 1
    h.clock.now += 16
    await h.ask(source, "short.test")
    assert h.auth.asked_for("short.test") == 2
    assert h.metric("sandpod_lifecycle_dns_cache_total", result="hit") == 1


async def test_negative_answers_are_cached_by_soa(h: Harness) -> None:
    """NXDOMAIN is passed on with its SOA and cached for the SOA's negative TTL."""
    source = h.sandbox(policy("public"))
    response = await h.ask(source, "nothing.test")
    assert rcode(response) == "NXDOMAIN"
    assert response.authority and response.authority[0].rdtype == dns.rdatatype.SOA
    await h.ask(source, "nothing.test")
    assert h.auth.asked_for("nothing.test") == 1


async def test_ttl_is_capped_and_set_entries_clamped() -> None:
    """A long TTL is cut to max_ttl for client and set alike; a short one opens the set for
    min_ttl while the client is told the short TTL."""
    harness = await Harness.start(min_ttl=30, max_ttl=120)
    try:
        harness.auth.add("long.test", "A", 86400, "11.22.0.30")
        harness.auth.add("brief.test", "A", 5, "11.22.0.31")
        source = harness.sandbox(policy("allowlist", ["long.test", "brief.test"]))
        assert (await harness.ask(source, "long.test")).answer[0].ttl == 120
        assert (await harness.ask(source, "brief.test")).answer[0].ttl == 5
        assert [c[2] for c in harness.sink.calls] == [
            [("11.22.0.30", 120)],
            [("11.22.0.31", 30)],
        ]
    finally:
        await harness.close()


async def test_any_and_zone_transfers_are_refused(h: Harness) -> None:
    """ANY and AXFR are refused whatever the policy (EDE Not Supported)."""
    source = h.sandbox(policy("public"))
    for rdtype in ("ANY", "AXFR"):
        response = await h.ask(source, "open.test", rdtype, tcp=rdtype == "AXFR")
        assert rcode(response) == "REFUSED"
        assert (ede_of(response) or (0, ""))[0] == int(dns.edns.EDECode.NOT_SUPPORTED)
    assert h.auth.asked == []


async def test_https_records_lose_address_hints_and_ech(h: Harness) -> None:
    """HTTPS records pass without ipv4hint/ipv6hint/ech; one that makes a hint mandatory is
    dropped."""
    h.auth.add(
        "svc.test",
        "HTTPS",
        300,
        '1 . alpn="h2" ipv4hint=10.0.0.1 ech="AAj+DQAEAAAAAA==" ipv6hint=::1',
        '2 . mandatory=ipv4hint alpn="h3" ipv4hint=10.0.0.2',
    )
    source = h.sandbox(policy("public"))
    response = await h.ask(source, "svc.test", "HTTPS")
    [rrset] = response.answer
    [record] = list(rrset)
    text = record.to_text()
    assert "alpn" in text
    assert "hint" not in text and "ech" not in text


async def test_upstream_down_is_servfail_quickly() -> None:
    """No upstream listening: SERVFAIL (EDE No Reachable Authority) well inside a stub's
    timeout, never a hang."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    harness = await Harness.start(upstreams=(("127.0.0.1", port),), deadline=1.0)
    try:
        source = harness.sandbox(policy("public"))
        response = await harness.ask(source, "open.test", timeout=4)
        assert rcode(response) == "SERVFAIL"
        assert (ede_of(response) or (0, ""))[0] == int(dns.edns.EDECode.NO_REACHABLE_AUTHORITY)
    finally:
        await harness.close()


async def test_upstream_silent_is_servfail_by_the_deadline() -> None:
    """An upstream that swallows queries: SERVFAIL when the deadline passes."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as blackhole:
        blackhole.bind(("127.0.0.1", 0))
        harness = await Harness.start(
            upstreams=(blackhole.getsockname(),), attempt_timeout=0.3, deadline=0.6
        )
        try:
            source = harness.sandbox(policy("public"))
            response = await harness.ask(source, "open.test", timeout=4)
            assert rcode(response) == "SERVFAIL"
            assert (
                harness.metric(
                    "sandpod_lifecycle_dns_queries_total",
                    transport="udp",
                    outcome="upstream_failed",
                )
                == 1
            )
        finally:
            await harness.close()


async def test_tcp_query_and_truncation_fallback(h: Harness) -> None:
    """TCP works; an upstream that truncates over UDP is asked again over TCP; an answer
    too big for a client's 512-byte UDP comes back with TC set."""
    many = [f"11.22.1.{i}" for i in range(1, 60)]
    h.auth.add("big.test", "A", 300, *many)
    h.auth.truncate_udp = True
    source = h.sandbox(policy("public"))
    by_tcp = await h.ask(source, "big.test", tcp=True)
    assert len(addresses(by_tcp)) == 59
    assert ("big.test.", "A", "tcp") in h.auth.asked
    small = dns.message.make_query("big.test", "A")  # no EDNS: 512 bytes at most
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
        client.bind((source, 0))
        client.setblocking(False)
        client.sendto(small.to_wire(), (h.host, h.port))
        wire = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(client, 65535), 10)
    assert len(wire) <= 512
    assert dns.message.from_wire(wire, raise_on_truncation=False).flags & dns.flags.TC


async def udp_exchange(h: Harness, source: str, packet: bytes) -> bytes:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
        client.bind((source, 0))
        client.setblocking(False)
        client.sendto(packet, (h.host, h.port))
        return await asyncio.wait_for(asyncio.get_running_loop().sock_recv(client, 65535), 10)


async def test_malformed_packets_are_counted_and_answered_formerr(h: Harness) -> None:
    """Garbage with a header gets FORMERR (same id); a response, a NOTIFY, two questions and
    an oversized packet each get their typed reason; the resolver keeps serving."""
    source = h.sandbox(policy("public"))
    ident = 0x4242
    garbage = struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0) + b"\xff" * 20
    reply = dns.message.from_wire(await udp_exchange(h, source, garbage))
    assert reply.id == ident and reply.rcode() == dns.rcode.FORMERR
    notify = struct.pack("!HHHHHH", 7, 4 << 11, 0, 0, 0, 0)
    assert dns.message.from_wire(await udp_exchange(h, source, notify)).rcode() == (
        dns.rcode.NOTIMP
    )
    two = dns.message.make_query("open.test", "A")
    two.question.append(dns.message.make_query("evil.test", "A").question[0])
    assert dns.message.from_wire(await udp_exchange(h, source, two.to_wire())).rcode() == (
        dns.rcode.FORMERR
    )
    huge = dns.message.make_query("open.test", "A").to_wire() + b"\0" * 5000
    assert dns.message.from_wire(await udp_exchange(h, source, huge)).rcode() == dns.rcode.FORMERR
    # a short packet and a response get no reply at all; the next query still works
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
        client.bind((source, 0))
        client.sendto(b"\x01\x02\x03", (h.host, h.port))
        response_packet = dns.message.make_response(dns.message.make_query("x.test", "A"))
        client.sendto(response_packet.to_wire(), (h.host, h.port))
    assert addresses(await h.ask(source, "open.test")) == ["11.22.0.1"]
    for reason in ("malformed", "opcode", "questions", "too_large", "short", "not_a_query"):
        assert h.metric("sandpod_lifecycle_dns_malformed_total", reason=reason) >= 1, reason
    assert h.auth.asked_for("evil.test") == 0


async def test_random_packets_never_crash_the_resolver(h: Harness) -> None:
    """Hundreds of random and bit-flipped packets: each is answered or dropped, and a real
    query right after is answered."""
    source = h.sandbox(policy("allowlist", ["open.test"]))
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    valid = dns.message.make_query("evil.test", "A", use_edns=0).to_wire()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
        client.bind((source, 0))
        for _ in range(300):
            if rng.random() < 0.5:
                packet = rng.randbytes(rng.randint(0, 600))
            else:
                flipped = bytearray(valid)
                for _ in range(rng.randint(1, 6)):
                    flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
                packet = bytes(flipped)
            client.sendto(packet, (h.host, h.port))
    # the flood may fill the socket's buffer (the kernel drops past it): retry as a stub does
    for _ in range(5):
        with contextlib.suppress(dns.exception.Timeout):
            response = await h.ask(source, "open.test", timeout=2)
            break
    else:
        pytest.fail(f"no answer after the flood (seed {seed})")
    assert addresses(response) == ["11.22.0.1"], f"seed {seed}"
    assert h.auth.asked_for("evil.test") == 0, f"seed {seed}"
    internal = h.metric(
        "sandpod_lifecycle_dns_queries_total", transport="udp", outcome="internal_error"
    )
    assert internal == 0, f"seed {seed}"


async def test_stalled_tcp_clients_are_cut_and_bounded() -> None:
    """A TCP client that sends nothing is closed after the idle timeout; past the connection
    limit a new connection is closed at once; a query still gets through afterwards."""
    harness = await Harness.start(tcp_idle_timeout=0.5, tcp_connections=2)
    try:
        source = harness.sandbox(policy("public"))
        harness.auth.add("open.test", "A", 300, "11.22.0.1")
        stalled = [
            await asyncio.open_connection(harness.host, harness.port, local_addr=(source, 0))
            for _ in range(2)
        ]
        gauge = "sandpod_lifecycle_dns_tcp_connections"
        for _ in range(200):  # until the server has taken both (an event, polled)
            if harness.metric(gauge) == 2:
                break
            await asyncio.sleep(0.01)
        assert harness.metric(gauge) == 2
        reader, writer = await asyncio.open_connection(harness.host, harness.port)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed at once
        writer.close()
        assert harness.metric("sandpod_lifecycle_dns_dropped_total", limit="tcp_connections") == 1
        for reader, writer in stalled:
            assert await asyncio.wait_for(reader.read(), 5) == b""  # idle: closed
            writer.close()
        half = await asyncio.open_connection(harness.host, harness.port, local_addr=(source, 0))
        half[1].write(b"\x00\x40partial")  # a length, then less than it promised
        assert await asyncio.wait_for(half[0].read(), 5) == b""
        half[1].close()
        response = await harness.ask(source, "open.test", tcp=True)
        assert addresses(response) == ["11.22.0.1"]
    finally:
        await harness.close()


async def test_denial_events_are_rate_limited_but_all_counted() -> None:
    """A sandbox hammering a denied name raises at most ``event_burst`` events; the metric
    counts every refusal."""
    harness = await Harness.start(event_burst=3, event_rate=0.001)
    try:
        source = harness.sandbox(policy("allowlist", []))
        for i in range(20):
            assert rcode(await harness.ask(source, f"n{i}.evil.test")) == "REFUSED"
        assert len(harness.denials) == 3
        assert harness.metric("sandpod_lifecycle_network_denied_total", kind="dns") == 20
    finally:
        await harness.close()


async def test_sink_failure_is_servfail() -> None:
    """Allowlist: if the firewall cannot take the addresses, the client gets SERVFAIL, never
    an address it could not connect to."""
    sink = FakeSink()
    sink.fail = True
    harness = await Harness.start(sink=sink)
    try:
        harness.auth.add("open.test", "A", 300, "11.22.0.1")
        source = harness.sandbox(policy("allowlist", ["open.test"]))
        response = await harness.ask(source, "open.test")
        assert rcode(response) == "SERVFAIL"
        assert addresses(response) == []
    finally:
        await harness.close()


async def test_nxdomain_option_for_denied_names() -> None:
    """With denied_rcode NXDOMAIN, a denied name is NXDOMAIN (still with EDE Blocked)."""
    harness = await Harness.start(denied_rcode=dns.rcode.NXDOMAIN)
    try:
        source = harness.sandbox(policy("allowlist", []))
        response = await harness.ask(source, "evil.test")
        assert rcode(response) == "NXDOMAIN"
        assert (ede_of(response) or (0, ""))[0] == BLOCKED
    finally:
        await harness.close()


async def test_close_is_idempotent_and_frees_the_port() -> None:
    """close() twice is fine; the port is free afterwards (nothing left listening)."""
    harness = await Harness.start()
    host, port = harness.host, harness.port
    await harness.close()
    await harness.resolver.close()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as again:
        again.bind((host, port))


async def test_one_sandbox_cannot_take_every_upstream_slot() -> None:
    """A sandbox past its in-flight upstream lookups gets SERVFAIL at once, while another
    sandbox's lookup still goes upstream."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as blackhole:
        blackhole.bind(("127.0.0.1", 0))
        harness = await Harness.start(
            upstreams=(blackhole.getsockname(),),
            attempt_timeout=2.0,
            deadline=2.0,
            sandbox_inflight=2,
        )
        try:
            greedy = harness.sandbox(policy("public"))
            other = harness.sandbox(policy("public"))
            slow = [
                asyncio.create_task(harness.ask(greedy, f"n{i}.test", timeout=5)) for i in range(2)
            ]
            blackhole.setblocking(False)
            loop = asyncio.get_running_loop()
            for _ in range(2):  # both reached the upstream (which never answers)
                await asyncio.wait_for(loop.sock_recv(blackhole, 4096), 5)
            dropped = "sandpod_lifecycle_dns_dropped_total"
            busy = await harness.ask(greedy, "n3.test", timeout=5)  # the third: over the cap
            assert rcode(busy) == "SERVFAIL"
            assert harness.metric(dropped, limit="sandbox_inflight") == 1
            assert not any(task.done() for task in slow)  # the first two still wait upstream
            assert rcode(await harness.ask(other, "m.test", timeout=5)) == "SERVFAIL"
            assert harness.metric(dropped, limit="sandbox_inflight") == 1  # not refused: timed out
            assert [rcode(r) for r in await asyncio.gather(*slow)] == ["SERVFAIL", "SERVFAIL"]
        finally:
            await harness.close()


async def test_ipv6_listener() -> None:
    """The resolver listens on an IPv6 address too and knows a sandbox by its v6 source."""
    harness = await Harness.start()
    v6 = NodeResolver(
        ResolverSettings(upstreams=(harness.auth.address,)),
        [("::1", 0)],
        lookup={"::1": SandboxNet("sbx-v6", policy("allowlist", ["open.test"]))}.get,
        sink=FakeSink(),
        metrics=NetworkMetrics(CollectorRegistry()),
    )
    try:
        harness.auth.add("open.test", "A", 300, "11.22.0.1")
        await v6.start()
        host, port = v6.addresses[0]
        query = dns.message.make_query("open.test", "A")
        response = await dns.asyncquery.tcp(query, host, port=port, timeout=5)
        assert addresses(response) == ["11.22.0.1"]
        response = await dns.asyncquery.udp(query, host, port=port, timeout=5)
        assert addresses(response) == ["11.22.0.1"]
        assert v6.resolved_names("sbx-v6", "11.22.0.1") == {"open.test"}
    finally:
        await v6.close()
        await harness.close()


async def test_cached_answer_refreshes_the_sets_with_what_is_left(h: Harness) -> None:
    """Allowlist: an answer served from the cache is pushed to the sink again, with the
    seconds the cached answer has left (the set entry is refreshed, never outlived)."""
    source = h.sandbox(policy("allowlist", ["open.test"]))
    await h.ask(source, "open.test")
    h.clock.now += 100
    response = await h.ask(source, "open.test")
    assert response.answer[0].ttl == 200
    assert [c[2] for c in h.sink.calls] == [[("11.22.0.1", 300)], [("11.22.0.1", 200)]]
    assert h.auth.asked_for("open.test") == 1


async def test_one_question_from_many_sandboxes_goes_upstream_once() -> None:
    """Five sandboxes asking the same name while it is on its way upstream share the one
    lookup: the upstream is asked once, each gets the answer."""
    harness = await Harness.start(attempt_timeout=20.0, deadline=20.0)
    try:
        harness.auth.add("open.test", "A", 300, "11.22.0.1")
        harness.auth.holding = True
        sources = [harness.sandbox(policy("public")) for _ in range(5)]
        tasks = [asyncio.create_task(harness.ask(s, "open.test", timeout=20)) for s in sources]
        misses = "sandpod_lifecycle_dns_cache_total"
        for _ in range(1000):  # all five are past the cache, waiting (polled, with a bound)
            if harness.metric(misses, result="miss") == 5:
                break
            await asyncio.sleep(0.01)
        assert harness.metric(misses, result="miss") == 5
        harness.auth.release()
        responses = await asyncio.gather(*tasks)
        assert [addresses(r) for r in responses] == [["11.22.0.1"]] * 5
        assert harness.auth.asked_for("open.test") == 1
    finally:
        await harness.close()


async def test_forged_upstream_answers_are_ignored() -> None:
    """Answers from the upstream's own address with a wrong id, or the right id for another
    question, are not taken (nor cached): only the matching answer is."""
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as upstream:
        upstream.bind(("127.0.0.1", 0))
        upstream.setblocking(False)
        harness = await Harness.start(upstreams=(upstream.getsockname(),), deadline=5.0)
        source = harness.sandbox(policy("public"))
        asking = asyncio.create_task(harness.ask(source, "open.test", timeout=10))
        try:
            wire, resolver = await asyncio.wait_for(loop.sock_recvfrom(upstream, 4096), 10)
            query = dns.message.from_wire(wire)

            def answer(name: str, ident: int, address: str) -> bytes:
                forged = dns.message.make_response(dns.message.make_query(name, "A"))
                forged.id = ident
                forged.answer = [dns.rrset.from_text(name + ".", 300, "IN", "A", address)]
                return forged.to_wire()

            await loop.sock_sendto(
                upstream, answer("open.test", query.id ^ 1, "11.22.0.66"), resolver
            )
            await loop.sock_sendto(upstream, answer("other.test", query.id, "11.22.0.67"), resolver)
            await loop.sock_sendto(upstream, b"\x00junk", resolver)
            await loop.sock_sendto(upstream, answer("open.test", query.id, "11.22.0.1"), resolver)
            assert addresses(await asking) == ["11.22.0.1"]
            assert addresses(await harness.ask(source, "open.test")) == ["11.22.0.1"]  # cached
        finally:
            asking.cancel()
            await asyncio.gather(asking, return_exceptions=True)
            await harness.close()


async def test_policy_change_during_the_upstream_lookup_wins() -> None:
    """A policy update that lands while the upstream is answering is what the reply (and the
    firewall's sets) follow: the answer is refused and nothing is opened."""
    harness = await Harness.start(attempt_timeout=20.0, deadline=20.0)
    try:
        harness.auth.add("open.test", "A", 300, "11.22.0.1")
        harness.auth.holding = True
        source = harness.sandbox(policy("allowlist", ["open.test"]), "sbx-race")
        asking = asyncio.create_task(harness.ask(source, "open.test", timeout=20))
        for _ in range(1000):  # until the question is at the upstream (polled, bounded)
            if harness.auth.asked:
                break
            await asyncio.sleep(0.01)
        assert harness.auth.asked
        harness.sandboxes[source] = SandboxNet("sbx-race", policy("allowlist", ["other.test"]))
        harness.auth.release()
        assert rcode(await asking) == "REFUSED"
        assert harness.sink.calls == []
    finally:
        await harness.close()
