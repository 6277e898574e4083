"""IPv6 egress of local sandboxes, attacked from inside real jails against a v6 fake internet.

The same bed as ``test_net_local.py`` (``netsbx.py`` jails with their own veth and chain,
``fakenet.py`` with ``ipv6=True``: "public" v6 servers in ``3fff::/20``, a ULA service, the
IPv6 metadata address fd00:ec2::254), plus the node's own parts where a test needs them (the
resolver on the gateway addresses answering from a fake authoritative server, the refusal log).
Probes run *inside* the sandboxes as their unprivileged user; where a protection is what stops
an attack, the test removes it once and shows the attack then works. Needs root and a host
with IPv6 (skipped, saying so, when it has none).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from netsbx import egress_runtime, make, ok, probe, reached
from prometheus_client import CollectorRegistry

from dnsauth import AuthServer
from fakenet import FakeNet
from sandpod_contract.network import NetworkPolicy
from sandpod_lifecycle.network.dnssettings import ResolverSettings
from sandpod_lifecycle.network.egress import Egress
from sandpod_lifecycle.network.ipv6 import host_support
from sandpod_lifecycle.network.metrics import NetworkMetrics
from sandpod_lifecycle.network.node import NodeNetwork, ProxyWiring, start_node_network
from sandpod_lifecycle.network.proxyconfig import ProxySettings
from sandpod_lifecycle.runtime.base import InstanceStatus
from sandpod_lifecycle.runtime.local import LocalRuntime

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0, reason="sandbox networking needs root (veth, nftables): run as root"
    ),
    pytest.mark.skipif(
        host_support() is not None, reason=f"no IPv6 on this host: {host_support()}"
    ),
]

PUBLIC = NetworkPolicy()
DEADLINE = 30.0


def v6(address: str, port: int) -> str:
    """A probe target (``netsbx.PROBE`` splits at the last colon: no brackets)."""
    return f"{address}:{port}"


@pytest.fixture
def fakenet() -> Iterator[FakeNet]:
    with FakeNet(ipv6=True) as net:
        yield net
    assert not net.leftovers()


@pytest.fixture
def state() -> Iterator[Path]:
    path = Path("/var/tmp") / f"sandpod-net6-test-{uuid.uuid4().hex[:8]}"
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


@pytest.fixture
async def node(
    state: Path, default_rootfs: Path | None
) -> AsyncIterator[tuple[LocalRuntime, Egress]]:
    if default_rootfs is None:
        pytest.skip("no default sandbox rootfs (mmdebstrap could not build it: see conftest)")
    async with egress_runtime(state, default_rootfs) as pair:
        assert pair[1].ipv6_off is None, pair[1].notes
        yield pair


class Events:
    """What the node published: (sandbox id, kind, destination), waitable."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []
        self._changed = asyncio.Condition()

    async def publish(self, sandbox_id: str, kind: str, dest: str, rule: str, count: int) -> None:
        async with self._changed:
            self.seen.append((sandbox_id, kind, dest))
            self._changed.notify_all()

    async def wait_for(self, event: tuple[str, str, str]) -> bool:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0), self._changed:
                await self._changed.wait_for(lambda: event in self.seen)
        return event in self.seen


@contextlib.asynccontextmanager
async def node_network(
    egress: Egress, upstream: tuple[str, int], state: Path | None = None
) -> AsyncIterator[tuple[NodeNetwork, Events]]:
    """The node's resolver (on both gateway addresses) and refusal log, as lifecycle starts
    them (and its egress proxy, with ``state``); every task it spawned is cancelled and
    awaited on exit."""
    events, tasks = Events(), set()

    def spawn(coro: Coroutine[Any, Any, None], name: str) -> None:
        tasks.add(asyncio.create_task(coro, name=name))

    net = await start_node_network(
        egress,
        ResolverSettings(upstreams=(upstream,), min_ttl=30),
        NetworkMetrics(CollectorRegistry()),
        publish=events.publish,
        spawn=spawn,
        proxy=None
        if state is None
        else ProxyWiring(ProxySettings(), state, egress.installation_id, CollectorRegistry()),
    )
    try:
        yield net, events
    finally:
        await net.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def host_addresses6() -> list[str]:
    out = subprocess.run(["ip", "-6", "-o", "addr"], capture_output=True, text=True).stdout
    found = [line.split()[3].split("/")[0] for line in out.splitlines()]
    return [a for a in found if not a.startswith("fe80:")]


WAIT_LISTEN = r"""
import socket, sys, time
end = time.monotonic() + 10
while True:
    try:
        socket.create_connection((sys.argv[1], 8000), 1).close()
        break
    except OSError:
        if time.monotonic() > end:
            raise
        time.sleep(0.05)
"""


async def serve(status: InstanceStatus, address: str) -> None:
    """An HTTP server on port 8000 of every address of the sandbox, listening on return."""
    await ok(status, "setsid python3 -m http.server 8000 --bind :: >/dev/null 2>&1 < /dev/null &")
    await ok(status, ["python3", "-c", WAIT_LISTEN, address])


def link_local(egress: Egress, status: InstanceStatus) -> str:
    """The link-local address of the host end of the sandbox's veth (neighbour discovery)."""
    name = egress.link(status.sandbox_id)
    assert name is not None
    out = subprocess.run(
        ["ip", "-6", "-o", "addr", "show", "dev", name, "scope", "link"],
        capture_output=True,
        text=True,
    ).stdout
    return out.split()[3].split("/")[0]


@contextlib.contextmanager
def host_service6() -> Iterator[int]:
    """A TCP server of the host on ``::`` (every v6 address) answering ``host secret``."""
    sock = socket.socket(socket.AF_INET6)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("::", 0))
    sock.listen(16)
    sock.settimeout(0.2)
    stop = False

    def serve() -> None:
        while not stop:
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn, contextlib.suppress(OSError):
                conn.recv(1024)
                conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 12\r\n\r\nhost secret\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(sock.getsockname()[1])
    finally:
        stop = True
        thread.join()
        sock.close()


async def test_public_reaches_the_v6_internet_but_not_the_host_metadata_ula_or_other_sandboxes(
    node: tuple[LocalRuntime, Egress], fakenet: FakeNet
) -> None:
    """Under ``public`` a sandbox has its own v6 address and reaches the fake internet's v6
    servers (NAT66 out); a ULA service (special range), fd00:ec2::254, the host's own v6
    addresses (a service on ``::``, the v6 gateway too) and another sandbox's v6 address do
    not. Without the forward chain's hard denies the metadata server and the other sandbox
    answer; without the input chain's drop the host's service does."""
    rt, egress = node
    a, b = await make(rt, PUBLIC), await make(rt, PUBLIC)
    a6, b6 = egress.address6(a.sandbox_id), egress.address6(b.sandbox_id)
    assert a6 and b6 and a6 != b6 and egress.gateway6 is not None
    inside = await ok(a, "cat /proc/net/if_inet6")
    assert ipaddress.IPv6Address(a6).exploded.replace(":", "") in inside, inside
    assert " eth0" in inside and "fe80" not in inside, inside  # no link-local to talk to
    assert a.protections["egress_ipv6"] == "active"
    await serve(b, str(b6))
    with host_service6() as port:
        hosts = [*host_addresses6(), str(egress.gateway6), f"{link_local(egress, a)}%eth0"]
        forbidden = [
            *(v6(h, port) for h in hosts),
            v6(fakenet.metadata6, 80),
            v6(fakenet.private6, 80),
            v6(b6, 8000),
        ]
        good = [v6(fakenet.public6, 80), v6(fakenet.public6b, 80)]
        results = await probe(a, *good, *forbidden)
        assert results[good[0]] == "fakenet public6", results
        assert reached(results) == set(good), results
        assert egress.denied_counts()[a.sandbox_id] >= len(forbidden)
        # the attacks are real: without the input chain's drop the host's service answers ...
        fw = egress.firewall
        assert fw is not None
        fw.nft.run(f"flush chain inet {egress.table} input")
        gw = v6(str(egress.gateway6), port)
        assert (await probe(a, gw))[gw] == "host secret"
        # ... and without the forward chain, the metadata server and the other sandbox do
        fw.nft.run(f"flush chain inet {egress.table} forward")
        again = await probe(a, v6(fakenet.metadata6, 80), v6(b6, 8000))
        assert len(reached(again)) == 2, again


async def test_an_allow_all_policy_still_refuses_the_v6_hard_denies_and_reports_them(
    node: tuple[LocalRuntime, Egress], fakenet: FakeNet
) -> None:
    """An allowlist opening every address (``::/0``, ``0.0.0.0/0``) reaches a ULA service, but
    not fd00:ec2::254, another sandbox's v6 address nor the host's v6 gateway: the refusals of
    the first and the last are ``network.denied`` events naming the v6 destination (NFLOG,
    read as lifecycle does).
    Without the hard denies in the sandbox's chain and the forward chain, the metadata
    server answers."""
    rt, egress = node
    everything = NetworkPolicy.from_dict({"mode": "allowlist", "allow": ["::/0", "0.0.0.0/0"]})
    a, b = await make(rt, everything), await make(rt, everything)
    b6 = egress.address6(b.sandbox_id)
    assert b6 is not None and egress.gateway6 is not None
    await serve(b, b6)
    forbidden = [v6(fakenet.metadata6, 80), v6(b6, 8000), v6(str(egress.gateway6), 8000)]
    async with node_network(egress, ("127.0.0.1", 9)) as (_, events):
        results = await probe(a, v6(fakenet.private6, 80), *forbidden)
        assert reached(results) == {v6(fakenet.private6, 80)}, results
        # (the other sandbox's address is refused unlogged, as in IPv4: the forward chain
        # drops every new connection *into* a sandbox before it looks at where it came from)
        for target in (f"[{fakenet.metadata6}]:80/tcp", f"[{egress.gateway6}]:8000/tcp"):
            event = (a.sandbox_id, "connect", target)
            for _ in range(int(DEADLINE)):  # the log is rate-limited: refire until it comes
                if await events.wait_for(event):
                    break
                await probe(a, target.removesuffix("/tcp").replace("[", "").replace("]", ""))
            assert event in events.seen, events.seen
    fw = egress.firewall
    assert fw is not None
    chain = "sbx_" + str(egress.link(a.sandbox_id)).rsplit("-", 1)[1]
    rules = fw.nft.json(f"list chain inet {egress.table} {chain}")
    handle = next(r["rule"]["handle"] for r in rules if "rule" in r and "hard6" in str(r["rule"]))
    fw.nft.run(f"delete rule inet {egress.table} {chain} handle {handle}")
    fw.nft.run(f"flush chain inet {egress.table} forward")
    again = await probe(a, v6(fakenet.metadata6, 80))
    assert again[v6(fakenet.metadata6, 80)] == "fakenet metadata6", again


async def test_an_ipv4_allowlist_refuses_all_ipv6_and_a_v6_cidr_opens_only_itself(
    node: tuple[LocalRuntime, Egress], fakenet: FakeNet
) -> None:
    """An allowlist of IPv4 CIDRs only (one covering the v4 fake internet) reaches no v6
    address; one allowing ``public6/128`` on port 80 reaches that and not its neighbour; a
    live update to the v4-only policy revokes it at once, an open connection too (which,
    without the chain's generation check, would go on)."""
    rt, egress = node
    v4_only = NetworkPolicy.from_dict(
        {"mode": "allowlist", "allow": [f"{fakenet.public_net}", "10.0.0.0/8"]}
    )
    s = await make(rt, v4_only)
    targets = [v6(fakenet.public6, 80), v6(fakenet.public6b, 80), v6(fakenet.private6, 80)]
    results = await probe(s, f"{fakenet.public}:80", *targets)
    assert reached(results) == {f"{fakenet.public}:80"}, results
    one = NetworkPolicy.from_dict({"mode": "allowlist", "allow": [f"[{fakenet.public6}/128]:80"]})
    await rt.apply_network(s.sandbox_id, one)
    assert reached(await probe(s, *targets)) == {v6(fakenet.public6, 80)}
    assert await _held(rt, s, fakenet.public6, v4_only) == "refused:TimeoutError"
    # without the policy generation (an established connection accepted whatever the policy
    # it was accepted under), the revoked connection would go on
    await rt.apply_network(s.sandbox_id, one)
    fw = egress.firewall
    assert fw is not None
    chain = "sbx_" + str(egress.link(s.sandbox_id)).rsplit("-", 1)[1]

    def unmarked() -> None:
        fw.nft.run(f"insert rule inet {egress.table} {chain} ct state established accept")

    assert await _held(rt, s, fakenet.public6, v4_only, unmarked) == "fakenet public6"


HELD = r"""
import socket, sys, time
s = socket.create_connection((sys.argv[1], 80), timeout=3)
print("open", flush=True)
sys.stdin.readline()
try:
    s.sendall(b"GET / HTTP/1.0\r\n\r\n")
    print(s.recv(200).decode().split("\r\n\r\n", 1)[-1].strip() or "empty", flush=True)
except OSError as e:
    print("refused:" + type(e).__name__, flush=True)
"""


async def _held(
    rt: LocalRuntime,
    s: InstanceStatus,
    host: str,
    policy: NetworkPolicy,
    then: Callable[[], None] = lambda: None,
) -> str:
    """Open a connection to ``host``:80 from the sandbox, apply ``policy`` (then call
    ``then``), then use it."""
    assert s.holder_pid is not None
    proc = await asyncio.create_subprocess_exec(
        "nsenter",
        f"--target={s.holder_pid}",
        "--net",
        "--setuid=65534",
        "--setgid=65534",
        "--",
        "python3",
        "-c",
        HELD,
        host,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    assert (await proc.stdout.readline()).strip() == b"open"
    await rt.apply_network(s.sandbox_id, policy)
    then()
    proc.stdin.write(b"go\n")
    await proc.stdin.drain()
    line = (await proc.stdout.readline()).decode().strip()
    await proc.wait()
    return line


async def test_a_name_rules_aaaa_answers_open_only_for_it_and_a_denied_name_gets_none(
    node: tuple[LocalRuntime, Egress], fakenet: FakeNet
) -> None:
    """The node resolver (asked on the v4 gateway, as resolv.conf says, and on the v6 one,
    where port-53 traffic to any v6 server is sent) answers an allowed name's AAAA and opens
    that address in the rule's v6 set before replying: a connection to it works, on the
    rule's port only; an AAAA query for a name the policy does not allow is REFUSED and its
    address stays shut (a sandbox that learnt it elsewhere cannot use it)."""
    rt, egress = node
    auth = AuthServer()
    await auth.start()
    auth.add("api.example.test", "AAAA", 60, fakenet.public6)
    auth.add("other.example.test", "AAAA", 60, fakenet.public6b)
    policy = NetworkPolicy.from_dict({"mode": "allowlist", "allow": ["api.example.test:80"]})
    try:
        async with node_network(egress, auth.address):
            s = await make(rt, policy)
            assert reached(await probe(s, v6(fakenet.public6, 80))) == set()  # not yet asked
            answers = await ok(
                s,
                [
                    "python3",
                    "-c",
                    LOOKUP,
                    "api.example.test",
                    "other.example.test",
                    str(egress.gateway),
                    "2001:4860:4860::8888",  # any v6 server: DNAT'ed to the node resolver
                ],
            )
            assert answers.split() == [
                f"api.example.test@{egress.gateway}:{fakenet.public6}",
                f"other.example.test@{egress.gateway}:REFUSED",
                f"api.example.test@2001:4860:4860::8888:{fakenet.public6}",
                "other.example.test@2001:4860:4860::8888:REFUSED",
            ], answers
            assert auth.asked_for("other.example.test") == 0
            results = await probe(s, v6(fakenet.public6, 80), v6(fakenet.public6b, 80))
            assert reached(results) == {v6(fakenet.public6, 80)}, results
            assert (
                "refused:" in (await probe(s, v6(fakenet.public6, 8080)))[v6(fakenet.public6, 8080)]
            )
    finally:
        await auth.close()


# AAAA queries over UDP (dnspython-free: the sandbox's python has only the standard library)
LOOKUP = r"""
import socket, struct, sys, random
names, servers = sys.argv[1:3], sys.argv[3:]
def ask(name, server):
    qid = random.randrange(65536)
    q = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    q += struct.pack("!HH", 28, 1)
    fam = socket.AF_INET6 if ":" in server else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_DGRAM)
    s.settimeout(3)
    for attempt in range(3):  # UDP: a stub resolver sends again (a loaded CI host lost one)
        s.sendto(q, (server, 53))
        try:
            r = s.recv(4096)
            break
        except TimeoutError:
            if attempt == 2:
                raise
    rcode = r[3] & 15
    if rcode:
        return {5: "REFUSED", 3: "NXDOMAIN", 2: "SERVFAIL"}.get(rcode, str(rcode))
    an = struct.unpack("!H", r[6:8])[0]
    i = len(q)
    out = []
    for _ in range(an):
        while r[i] and r[i] < 192:
            i += r[i] + 1
        i += 2 if r[i] >= 192 else 1
        t, _, _, ln = struct.unpack("!HHIH", r[i:i + 10])
        i += 10
        if t == 28:
            out.append(socket.inet_ntop(socket.AF_INET6, r[i:i + ln]))
        i += ln
    return ",".join(out) or "NODATA"
for server in servers:
    for name in names:
        print(f"{name}@{server}:{ask(name, server)}")
"""


SPOOF6 = r"""
import socket, sys
target = (sys.argv[1], int(sys.argv[2]))
for src in sys.argv[4:]:
    u = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    u.setsockopt(socket.IPPROTO_IPV6, 75, 1)  # IPV6_TRANSPARENT: send from any address (root)
    u.bind((src, 0))
    u.sendto(("spoofed-from-" + src).encode(), target)
socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).sendto(sys.argv[3].encode(), target)
"""


async def test_a_spoofed_v6_source_never_leaves(
    node: tuple[LocalRuntime, Egress], fakenet: FakeNet
) -> None:
    """Root inside the sandbox's network namespace (one step past what its user can do: no
    raw sockets, no CAP_NET_ADMIN) sends UDP datagrams from another sandbox's v6 address and a
    public one with IPV6_TRANSPARENT: they never arrive, its honest one does; without the
    chain's ``ip6 saddr`` check they arrive too (IPv6 has no reverse-path filter)."""
    rt, egress = node
    a, b = await make(rt, PUBLIC), await make(rt, PUBLIC)
    b6 = egress.address6(b.sandbox_id)
    assert b6 is not None and a.holder_pid is not None
    sources = [b6, "3fff:999::99"]

    def log() -> str:
        return fakenet.exec("curl", "-s", f"http://[{fakenet.public6}]/udp").stdout

    async def send(honest: str) -> None:
        proc = await asyncio.create_subprocess_exec(
            "nsenter",
            f"--target={a.holder_pid}",
            "--net",
            "--",
            "python3",
            "-c",
            SPOOF6,
            fakenet.public6,
            str(fakenet.udp_port),
            honest,
            *sources,
        )
        assert await proc.wait() == 0
        deadline = time.monotonic() + 5
        while honest not in log():
            assert time.monotonic() < deadline, f"{honest} never arrived: {log()!r}"
            await asyncio.sleep(0.05)

    await send("root-honest")
    assert "spoofed" not in log(), log()
    fw = egress.firewall
    assert fw is not None
    chain = "sbx_" + str(egress.link(a.sandbox_id)).rsplit("-", 1)[1]
    rules = fw.nft.json(f"list chain inet {egress.table} {chain}")
    handle = next(
        r["rule"]["handle"]
        for r in rules
        if "rule" in r and "saddr" in str(r["rule"]) and "ip6" in str(r["rule"])
    )
    fw.nft.run(f"delete rule inet {egress.table} {chain} handle {handle}")
    await send("root-honest-2")
    assert "spoofed-from-3fff:999::99" in log(), log()


async def test_two_installations_side_by_side_keep_their_v6_apart(
    tmp_path: Path, default_rootfs: Path | None, fakenet: FakeNet
) -> None:
    """A second installation on the host claims another /64 and table;
    each one's sandbox reaches the v6 internet and neither reaches the other's v6 address."""
    if default_rootfs is None:
        pytest.skip("no default sandbox rootfs (mmdebstrap could not build it: see conftest)")
    s1, s2 = (Path(f"/var/tmp/sandpod-net6-{x}-{uuid.uuid4().hex[:6]}") for x in "ab")
    try:
        async with egress_runtime(s1, default_rootfs) as (rt1, e1):
            (s2 / "x").mkdir(parents=True)
            async with egress_runtime(s2, default_rootfs) as (rt2, e2):
                assert e1.plan.slice6 is not None and e2.plan.slice6 is not None
                assert not e1.plan.slice6.overlaps(e2.plan.slice6)
                a, b = await make(rt1, PUBLIC), await make(rt2, PUBLIC)
                a6, b6 = e1.address6(a.sandbox_id), e2.address6(b.sandbox_id)
                assert a6 and b6
                await serve(b, b6)
                await serve(a, a6)
                ra = await probe(a, v6(fakenet.public6, 80), v6(b6, 8000))
                rb = await probe(b, v6(fakenet.public6, 80), v6(a6, 8000))
                assert reached(ra) == {v6(fakenet.public6, 80)}, ra
                assert reached(rb) == {v6(fakenet.public6, 80)}, rb
    finally:
        subprocess.run(["rm", "-rf", str(s1), str(s2)], check=False)


HOLD = r"""
import socket, sys
held, out = [], []
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        held.append(socket.create_connection((host, int(port)), timeout=1.5))
        out.append("open")
    except OSError:
        out.append("refused")
print(" ".join(out))
"""


async def test_the_connection_limit_counts_both_families_together(
    node: tuple[LocalRuntime, Egress], fakenet: FakeNet
) -> None:
    """``limits.maxConnections: 3`` with two IPv4 connections held: one IPv6 connection
    opens, the next does not (a per-family count would let three of each through)."""
    rt, _ = node
    limited = NetworkPolicy.from_dict({"limits": {"maxConnections": 3}})
    s = await make(rt, limited)
    four = 2 * [f"{fakenet.public}:80"] + 2 * [v6(fakenet.public6, 80)]
    assert (await ok(s, ["python3", "-c", HOLD, *four])).split() == 3 * ["open"] + ["refused"]
    six = 4 * [v6(fakenet.public6, 80)]
    assert (await ok(s, ["python3", "-c", HOLD, *six])).split() == 3 * ["open"] + ["refused"]


PROXIED = r"""
import socket, sys
address, host = sys.argv[1], sys.argv[2]
try:
    s = socket.create_connection((address, 80), timeout=5)
    s.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    data = b""
    while chunk := s.recv(4096):
        data += chunk
    print(data.decode(errors="replace").split("\r\n\r\n", 1)[-1].strip() or "empty")
except OSError as e:
    print("refused:" + type(e).__name__)
"""


async def test_a_name_rules_v6_address_goes_through_the_egress_proxy(
    state: Path, default_rootfs: Path | None, fakenet: FakeNet
) -> None:
    """With the egress proxy on, a name rule's AAAA address on port 80 is DNAT'ed to the
    proxy's v6 listener, which checks the Host header against what the resolver answered this
    sandbox: the allowed name reaches the server, another Host on the same address does not
    (sent directly, the same request would be served)."""
    if default_rootfs is None:
        pytest.skip("no default sandbox rootfs (mmdebstrap could not build it: see conftest)")
    auth = AuthServer()
    await auth.start()
    auth.add("api.example.test", "AAAA", 60, fakenet.public6)
    policy = NetworkPolicy.from_dict({"mode": "allowlist", "allow": ["api.example.test:80"]})
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    try:
        async with (
            egress_runtime(state, default_rootfs, proxy_port=port) as (rt, egress),
            node_network(egress, auth.address, state) as (net, _),
        ):
            assert net.proxy is not None
            s = await make(rt, policy)
            lookup = ["python3", "-c", LOOKUP, "api.example.test", "x", str(egress.gateway)]
            assert fakenet.public6 in await ok(s, lookup)
            good = await ok(s, ["python3", "-c", PROXIED, fakenet.public6, "api.example.test"])
            assert good.strip() == "fakenet public6", good
            bad = await ok(s, ["python3", "-c", PROXIED, fakenet.public6, "other.example.test"])
            assert "fakenet" not in bad, bad
            # the same request straight to the server (what the DNAT prevents) is served
            direct = fakenet.exec("python3", "-c", PROXIED, fakenet.public6, "other.example.test")
            assert direct.stdout.strip() == "fakenet public6", direct
    finally:
        await auth.close()


async def test_ipv6_off_gives_ipv4_only_and_says_so(
    state: Path, default_rootfs: Path | None, fakenet: FakeNet
) -> None:
    """``SANDPOD_NET_IPV6=off``: no v6 range is claimed, the sandbox's ``egress_ipv6``
    protection and notes say IPv4 only, it has no global v6 address and reaches no v6
    server, while IPv4 works."""
    if default_rootfs is None:
        pytest.skip("no default sandbox rootfs (mmdebstrap could not build it: see conftest)")
    async with egress_runtime(state, default_rootfs, ipv6=False) as (rt, egress):
        assert egress.plan.slice6 is None and egress.gateway6 is None
        assert any("IPv4 egress only" in n for n in egress.notes), egress.notes
        s = await make(rt, PUBLIC)
        assert s.protections["egress_ipv6"].startswith("off:"), s.protections
        assert any("IPv4 egress only" in n for n in s.notes), s.notes
        assert egress.address6(s.sandbox_id) is None
        results = await probe(s, f"{fakenet.public}:80", v6(fakenet.public6, 80))
        assert reached(results) == {f"{fakenet.public}:80"}, results
