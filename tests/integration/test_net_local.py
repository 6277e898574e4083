"""Sandbox egress of the local runtime, attacked from inside real jails against a fake internet.

Each test builds a fake internet (``tests/fakenet.py``: public-looking addresses outside
``SPECIAL_RANGES``, a metadata server at 169.254.169.254, a private 10.x service, a host service
on 0.0.0.0) and real jails with their own veth link and nftables chain (``netsbx.py``), runs
probes *inside* the sandboxes as their unprivileged user, and checks what answered. Where a
protection is what stops an attack, the test removes it once and shows the attack then works.
Needs root (veth, nftables, namespaces).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from netsbx import egress_runtime, leftovers, make, ok, probe, reached
from prometheus_client import CollectorRegistry

from fakenet import FakeNet
from sandpod_contract.network import NetworkPolicy
from sandpod_lifecycle.network.addressing import PoolExhausted, claimed_ids
from sandpod_lifecycle.network.denials import DenialWatch
from sandpod_lifecycle.network.egress import Egress, EgressSettings
from sandpod_lifecycle.network.metrics import NetworkMetrics
from sandpod_lifecycle.runtime.base import InstanceStatus
from sandpod_lifecycle.runtime.local import LocalRuntime

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="sandbox networking needs root (veth, nftables): run as root"
)

PUBLIC = NetworkPolicy()
DENY_ALL = NetworkPolicy.from_dict({"mode": "deny-all"})


@pytest.fixture
def fakenet() -> Iterator[FakeNet]:
    with FakeNet() as net:
        yield net
    assert not net.leftovers()


@pytest.fixture
def state() -> Iterator[Path]:
    path = Path("/var/tmp") / f"sandpod-net-test-{uuid.uuid4().hex[:8]}"
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


@pytest.fixture
async def node(
    state: Path, default_rootfs: Path | None
) -> AsyncIterator[tuple[LocalRuntime, Egress]]:
    if default_rootfs is None:
        pytest.skip("no default sandbox rootfs (mmdebstrap could not build it: see conftest)")
    async with egress_runtime(state, default_rootfs) as pair:
        yield pair


def host_addresses() -> list[str]:
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    return [line.split()[3].split("/")[0] for line in out.splitlines()]


async def test_public_reaches_the_internet_but_not_host_metadata_private_or_other_sandboxes(
    node: tuple[LocalRuntime, Egress], fakenet: FakeNet
) -> None:
    """Under ``public`` the fake internet answers by IP; the host's service (bound to 0.0.0.0,
    tried on every host address and the gateway), the metadata server, a private service and
    another sandbox's listening port do not."""
    rt, egress = node
    a, b = await make(rt, PUBLIC), await make(rt, PUBLIC)
    assert a.address and b.address and a.address != b.address
    await ok(b, "setsid python3 -m http.server 8000 --bind 0.0.0.0 >/dev/null 2>&1 < /dev/null &")
    port = fakenet.host_service()
    hosts = [*host_addresses(), str(egress.gateway)]
    forbidden = [
        *(f"{h}:{port}" for h in hosts),
        f"{fakenet.metadata}:80",
        f"{fakenet.private}:80",
        f"{b.address}:8000",
    ]
    results = await probe(a, f"{fakenet.public}:80", f"{fakenet.public2}:80", *forbidden)
    assert results[f"{fakenet.public}:80"] == "fakenet public"
    assert results[f"{fakenet.public2}:80"] == "fakenet public2"
    assert reached(results) == {f"{fakenet.public}:80", f"{fakenet.public2}:80"}, results
    # every refused attempt counted for the sandbox (host ones too): at least one SYN each
    assert egress.denied_counts()[a.sandbox_id] >= len(forbidden)
    # the attacks are real: from the host (root = the gateway uid here) both answer ...
    assert "connected" in (await _host_probe(f"{b.address}:8000", uid=0))
    # ... and without the input chain's drop, the sandbox reaches the host's service
    egress.firewall.nft.run(f"flush chain inet {egress.table} input")  # type: ignore[union-attr]
    again = await probe(a, f"{egress.gateway}:{port}")
    assert again[f"{egress.gateway}:{port}"] == "host secret", again
    # ... and without the forward chain, the metadata server, the private service and the
    # other sandbox answer too
    egress.firewall.nft.run(f"flush chain inet {egress.table} forward")  # type: ignore[union-attr]
    again = await probe(a, f"{fakenet.metadata}:80", f"{fakenet.private}:80", f"{b.address}:8000")
    assert len(reached(again)) == 3, again


async def _host_probe(target: str, uid: int) -> str:
    host, port = target.rsplit(":", 1)
    script = (
        "import socket,sys\n"
        "try:\n"
        f" socket.create_connection(({host!r}, {port}), timeout=1.5).close(); print('connected')\n"
        "except OSError as e: print('refused:' + type(e).__name__)\n"
    )
    proc = await asyncio.create_subprocess_exec(
        "python3",
        "-c",
        script,
        user=uid,
        group=uid if uid else 0,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    return out.decode().strip()


async def test_only_the_gateway_uid_may_connect_into_a_sandbox(
    node: tuple[LocalRuntime, Egress],
) -> None:
    """Another local user (uid 65534) cannot open a connection to a sandbox's listening port;
    the gateway's uid (root here) can. Without the output chain's rule, the other user can."""
    rt, egress = node
    b = await make(rt, PUBLIC)
    await ok(b, "setsid python3 -m http.server 8000 --bind 0.0.0.0 >/dev/null 2>&1 < /dev/null &")
    target = f"{b.address}:8000"
    deadline = time.monotonic() + 10
    while (await _host_probe(target, 0)) != "connected":
        assert time.monotonic() < deadline, "the sandbox's server never listened"
        await asyncio.sleep(0.05)
    assert (await _host_probe(target, 65534)).startswith("refused:")
    egress.firewall.nft.run(f"flush chain inet {egress.table} output")  # type: ignore[union-attr]
    assert await _host_probe(target, 65534) == "connected"


async def test_deny_all_reaches_nothing_and_the_refusals_are_counted(
    node: tuple[LocalRuntime, Egress], fakenet: FakeNet
) -> None:
    """``deny-all``: not the fake internet, not the host, not the metadata server; the
    sandbox's refused packets are reported (event callback) and counted in the metric."""
    rt, egress = node
    s = await make(rt, DENY_ALL)
    port = fakenet.host_service()
    reports: list[tuple[str, str, int]] = []

    async def report(sandbox_id: str, kind: str, count: int) -> None:
        reports.append((sandbox_id, kind, count))

    registry = CollectorRegistry()
    watch = DenialWatch(egress.denied_counts, report, NetworkMetrics(registry))
    await watch.step()
    results = await probe(
        s, f"{fakenet.public}:80", f"{fakenet.metadata}:80", f"{egress.gateway}:{port}"
    )
    assert reached(results) == set(), results
    # the refusals in the sandbox's own chain are counted, reported once, and in the metric
    grown = await watch.step()
    assert list(grown) == [s.sandbox_id] and grown[s.sandbox_id] >= 1
    assert reports == [(s.sandbox_id, "connect", grown[s.sandbox_id])]
    metric = registry.get_sample_value(
        "sandpod_lifecycle_network_denied_total", {"kind": "connect"}
    )
    assert metric == grown[s.sandbox_id]
    assert await watch.step() == {}


async def test_an_allowlist_cidr_opens_that_and_nothing_else(
    node: tuple[LocalRuntime, Egress], fakenet: FakeNet
) -> None:
    """``allowlist`` with one /32 on port 80: that address answers; its neighbour does not.
    Rules naming the metadata service's range and the sandbox pool open neither (hard denies);
    without the hard-deny set they would."""
    rt, egress = node
    b = await make(rt, PUBLIC)
    await ok(b, "setsid python3 -m http.server 8000 >/dev/null 2>&1 < /dev/null &")
    policy = NetworkPolicy.from_dict(
        {
            "mode": "allowlist",
            "allow": [f"{fakenet.public}:80", "169.254.0.0/16", str(egress.settings.pool)],
        }
    )
    s = await make(rt, policy)
    targets = [
        f"{fakenet.public}:80",
        f"{fakenet.public}:8080",  # the allowed address on another port
        f"{fakenet.public2}:80",
        f"{fakenet.metadata}:80",
    ]
    results = await probe(s, *targets, f"{b.address}:8000")
    assert reached(results) == {f"{fakenet.public}:80"}, results
    fw = egress.firewall
    assert fw is not None
    fw.nft.run(f"flush set inet {egress.table} hard4")
    results = await probe(s, *targets, f"{b.address}:8000")
    assert results[f"{fakenet.metadata}:80"] == "fakenet metadata", results
    # another sandbox stays shut even then: nothing forwards a new connection into a sandbox
    assert results[f"{b.address}:8000"].startswith("refused:"), results


HELD = r"""
import os, socket, sys, time
c = socket.create_connection((sys.argv[1], 80), timeout=2)
open("/workspace/connected", "w").close()
while not os.path.exists("/workspace/go"):
    time.sleep(0.01)
try:
    c.sendall(b"GET / HTTP/1.0\r\n\r\n")
    print(c.recv(200).decode().split("\r\n\r\n", 1)[-1].strip() or "closed")
except OSError as e:
    print("refused:" + type(e).__name__)
"""


async def _held(rt: LocalRuntime, s: InstanceStatus, target: str, policy: NetworkPolicy) -> str:
    """A connection opened before ``policy`` is applied, used after: what it got back."""
    assert s.workspace is not None
    for f in ("connected", "go"):
        (s.workspace / f).unlink(missing_ok=True)
    task = asyncio.ensure_future(ok(s, ["python3", "-c", HELD, target]))
    try:
        deadline = time.monotonic() + 10
        while not (s.workspace / "connected").exists():
            assert time.monotonic() < deadline and not task.done(), "never connected"
            await asyncio.sleep(0.01)
        await rt.apply_network(s.sandbox_id, policy)
        (s.workspace / "go").touch()
        return (await task).strip()
    finally:
        task.cancel()


async def test_a_live_policy_update_takes_effect_both_ways(
    node: tuple[LocalRuntime, Egress], fakenet: FakeNet
) -> None:
    """``apply_network`` swaps the chain in one batch: public -> deny-all refuses the next
    connection, deny-all -> public lets it through again; nothing restarts (the same holder).
    A connection opened before a revocation is cut too (its next packet is judged by the new
    policy), and one opened before an update that still allows it keeps working."""
    rt, _ = node
    s = await make(rt, PUBLIC)
    target = f"{fakenet.public}:80"
    first = await probe(s, target)  # at once: the link must carry traffic when create returns
    assert reached(first) == {target}, first
    for policy, want in ((DENY_ALL, set()), (PUBLIC, {target})):
        t0 = time.perf_counter()
        await rt.apply_network(s.sandbox_id, policy)
        took = time.perf_counter() - t0
        print(f"apply_network -> {policy.mode.value}: {took * 1000:.2f} ms")
        got = await probe(s, target)
        assert reached(got) == want, (policy.mode.value, got)
    assert (await rt.inspect(s.sandbox_id)).holder_pid == s.holder_pid
    still = NetworkPolicy.from_dict({"mode": "allowlist", "allow": [f"{fakenet.public}/32"]})
    assert await _held(rt, s, fakenet.public, still) == "fakenet public"
    assert (await _held(rt, s, fakenet.public, DENY_ALL)).startswith("refused:")


async def test_resolved_addresses_open_a_name_rule_until_their_ttl(
    node: tuple[LocalRuntime, Egress], fakenet: FakeNet
) -> None:
    """The resolver's API: ``add_resolved`` opens an allowlisted name's address (only on the
    rule's port) for its TTL; an address of no rule, or a rule not in force, stays shut."""
    rt, egress = node
    policy = NetworkPolicy.from_dict({"mode": "allowlist", "allow": ["api.example.test:80"]})
    s = await make(rt, policy)
    target = f"{fakenet.public}:80"
    assert reached(await probe(s, target)) == set()
    assert egress.sandbox_by_address(s.address or "") == (s.sandbox_id, policy)
    for _ in range(5):  # a probe slower than the 2 s TTL (a loaded machine) proves nothing: again
        added = time.monotonic()
        assert egress.add_resolved(s.sandbox_id, policy.allow[0], [(fakenet.public, 2)]) == 1
        got = reached(await probe(s, target))
        if time.monotonic() - added < 2:
            break
        await asyncio.sleep(2.5)  # the element's own TTL: let it go before adding it afresh
    else:
        pytest.fail("five probes each took longer than the address's 2 s TTL: machine too slow")
    assert got == {target}
    assert reached(await probe(s, f"{fakenet.public2}:80")) == set()  # an address of no rule
    from sandpod_lifecycle.network.firewall import UnknownRule

    with pytest.raises(UnknownRule):
        egress.add_resolved(s.sandbox_id, "other.example.test", [(fakenet.public2, 60)])
    deadline = time.monotonic() + 10
    while reached(await probe(s, target)):  # the element times out after 2 s
        assert time.monotonic() < deadline, "the resolved address never expired"
        await asyncio.sleep(0.2)


SPOOF = r"""
import socket, sys, fcntl, struct, errno
out = []
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
req = struct.pack("16sH2s4s8s", b"eth0", socket.AF_INET, b"\0\0", socket.inet_aton("11.1.1.1"), b"")
for name, code in (("SIOCSIFADDR", 0x8916), ("SIOCSIFFLAGS", 0x8914)):
    try:
        fcntl.ioctl(s, code, req)
        out.append(name + ":allowed")
    except OSError as e:
        out.append(name + ":" + errno.errorcode[e.errno])
try:
    r = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
    out.append("raw:allowed")
except OSError as e:
    out.append("raw:" + errno.errorcode[e.errno])
target = (sys.argv[1], int(sys.argv[2]))
for src in sys.argv[3:]:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.setsockopt(socket.SOL_IP, 15, 1)  # IP_FREEBIND: bind an address that is not ours
    try:
        u.bind((src, 0))
        u.sendto(("spoofed-from-" + src).encode(), target)
        out.append("sent")
    except OSError as e:
        out.append("spoof:" + errno.errorcode[e.errno])
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.sendto(b"honest", target)
print(" ".join(out))
"""


async def test_a_sandbox_cannot_readdress_itself_nor_spoof_its_source(
    node: tuple[LocalRuntime, Egress], fakenet: FakeNet
) -> None:
    """Code in the sandbox cannot change its address or link (no CAP_NET_ADMIN: EPERM), open a
    raw socket, nor send with another source (IP_FREEBIND binds one, the kernel refuses to
    route it). One step further -- root *inside* the sandbox's network namespace, sending with
    IP_TRANSPARENT -- spoofed datagrams (another sandbox's address, public ones) still never
    leave (the chain's source check); its honest one does, and without that check so do they."""
    rt, egress = node
    a, b = await make(rt, PUBLIC), await make(rt, PUBLIC)
    sources = [b.address or "", fakenet.public2, "11.99.99.99"]
    out = await ok(a, ["python3", "-c", SPOOF, fakenet.public, str(fakenet.udp_port), *sources])
    words = out.split()
    assert words[:3] == ["SIOCSIFADDR:EPERM", "SIOCSIFFLAGS:EPERM", "raw:EPERM"], out
    assert all(w.startswith("spoof:E") for w in words[3:]) and len(words) == 6, out

    def log() -> str:
        return fakenet.exec("curl", "-s", f"http://{fakenet.public}/udp").stdout

    async def arrived(word: str) -> None:
        deadline = time.monotonic() + 5
        while word not in log():
            assert time.monotonic() < deadline, f"{word} never arrived: {log()!r}"
            await asyncio.sleep(0.05)

    await arrived("honest")
    assert a.holder_pid is not None
    await _root_spoof(a.holder_pid, fakenet, sources, "root-honest")
    await arrived("root-honest")
    assert "spoofed" not in log(), log()
    # without the source check in the sandbox's chain, the same spoofed datagrams get out
    fw = egress.firewall
    assert fw is not None
    index = int(egress.links.links()[0].rsplit("-", 1)[1])
    chain = fw.nft.json(f"list chain inet {egress.table} sbx_{index}")
    handle = next(
        r["rule"]["handle"] for r in chain if "rule" in r and "saddr" in str(r["rule"]["expr"])
    )
    fw.nft.run(f"delete rule inet {egress.table} sbx_{index} handle {handle}")
    await _root_spoof(a.holder_pid, fakenet, sources, "root-honest-2")
    await arrived("root-honest-2")
    await arrived("spoofed-from-11.99.99.99")


ROOT_SPOOF = r"""
import socket, sys
target = (sys.argv[1], int(sys.argv[2]))
for src in sys.argv[4:]:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.setsockopt(socket.SOL_IP, 19, 1)  # IP_TRANSPARENT: send from any address (root)
    u.bind((src, 0))
    u.sendto(("spoofed-from-" + src).encode(), target)
socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(sys.argv[3].encode(), target)
"""


async def _root_spoof(holder: int, net: FakeNet, sources: list[str], honest: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        "nsenter",
        f"--target={holder}",
        "--net",
        "--",
        "python3",
        "-c",
        ROOT_SPOOF,
        net.public,
        str(net.udp_port),
        honest,
        *sources,
    )
    assert await proc.wait() == 0


async def test_teardown_leaves_no_link_table_or_route(
    state: Path, default_rootfs: Path | None, fakenet: FakeNet
) -> None:
    """Destroying a sandbox removes its link and chain; stopping the egress removes the
    table and the gateway link; a crashed run's leftovers go at the next start."""
    if default_rootfs is None:
        pytest.skip("no default sandbox rootfs (mmdebstrap could not build it: see conftest)")
    async with egress_runtime(state, default_rootfs) as (rt, egress):
        s = await make(rt, PUBLIC)
        name = egress.links.sandbox(1)
        assert Path("/sys/class/net", name).exists()
        await rt.destroy(s.sandbox_id)
        assert not Path("/sys/class/net", name).exists()
        assert egress.firewall is not None and egress.firewall.chains() == []
        # a crash: the sandbox's link and chain exist but its record says so; a fresh start
        # (a new lifecycle) of the same installation cleans what no live sandbox owns
        s = await make(rt, PUBLIC)
        await rt.destroy(s.sandbox_id)  # (its link gone with it)
        egress.firewall.apply("ghost", egress.plan.sandbox(7), egress.links.sandbox(7), PUBLIC)
        again = Egress(egress.settings, egress.installation_id, state, state / "net")
        await again.start()
        assert again.firewall is not None and again.firewall.chains() == []
    assert not leftovers(egress)


async def test_two_installations_side_by_side_do_not_collide(
    tmp_path: Path, default_rootfs: Path | None, fakenet: FakeNet
) -> None:
    """Two installations get distinct slices, tables and link names; each one's sandbox
    reaches the internet and neither reaches the other's."""
    if default_rootfs is None:
        pytest.skip("no default sandbox rootfs (mmdebstrap could not build it: see conftest)")
    s1, s2 = (
        Path(f"/var/tmp/sandpod-net-a-{uuid.uuid4().hex[:6]}"),
        Path(f"/var/tmp/sandpod-net-b-{uuid.uuid4().hex[:6]}"),
    )
    try:
        async with egress_runtime(s1, default_rootfs) as (rt1, e1):
            (s2 / "x").mkdir(parents=True)
            # the same registry: a second installation on the host claims the next slice
            async with egress_runtime(s2, default_rootfs) as (rt2, e2):
                assert e1.plan.slice != e2.plan.slice and e1.table != e2.table
                a, b = await make(rt1, PUBLIC), await make(rt2, PUBLIC)
                await ok(b, "setsid python3 -m http.server 8000 >/dev/null 2>&1 </dev/null &")
                ra = await probe(a, f"{fakenet.public}:80", f"{b.address}:8000")
                rb = await probe(b, f"{fakenet.public}:80", f"{a.address}:22")
                assert reached(ra) == {f"{fakenet.public}:80"}, ra
                assert reached(rb) == {f"{fakenet.public}:80"}, rb
    finally:
        subprocess.run(["rm", "-rf", str(s1), str(s2)], check=False)


HOLD = r"""
import socket, sys
held, out = [], []
for i in range(int(sys.argv[3])):
    try:
        held.append(socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.5))
        out.append("open")
    except OSError:
        out.append("refused")
print(" ".join(out))
"""


async def test_connection_and_bandwidth_limits_hold(
    node: tuple[LocalRuntime, Egress], fakenet: FakeNet
) -> None:
    """``limits.maxConnections`` 2: a third simultaneous connection is refused (nft ``ct
    count``); ``limits.bandwidthBytesPerSecond``: a download faster than the limit is shaped
    (the host end's token bucket counts overlimits) and still completes."""
    rt, egress = node
    policy = NetworkPolicy.from_dict(
        {"limits": {"maxConnections": 2, "bandwidthBytesPerSecond": 2_000_000}}
    )
    s = await make(rt, policy)
    out = await ok(s, ["python3", "-c", HOLD, fakenet.public, "80", "3"])
    assert out.split() == ["open", "open", "refused"], out
    size = 3_000_000
    got = await ok(s, f"curl -s -m 20 http://{fakenet.public}/bytes/{size} | wc -c")
    assert int(got) == size
    name = egress.links.sandbox(int(egress.links.links()[0].rsplit("-", 1)[1]))
    stats = json.loads(
        subprocess.run(
            ["tc", "-s", "-j", "qdisc", "show", "dev", name, "root"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    tbf = next(q for q in stats if q["kind"] == "tbf")
    assert tbf["options"]["rate"] == 2_000_000 and tbf["overlimits"] > 0, tbf
    unlimited = NetworkPolicy()
    await rt.apply_network(s.sandbox_id, unlimited)
    out = await ok(s, ["python3", "-c", HOLD, fakenet.public, "80", "3"])
    assert out.split() == ["open", "open", "open"], out


DNS_PROBE = r"""
import socket, sys
out = []
for target in sys.argv[1:]:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(2)
    try:
        u.sendto(b"query", (target, 53))
        out.append(target + "=" + u.recv(100).decode())
    except OSError as e:
        out.append(target + "=" + type(e).__name__)
print(" ".join(out))
print(open("/etc/resolv.conf").read())
"""


async def test_every_dns_packet_goes_to_the_node_resolver(
    node: tuple[LocalRuntime, Egress], fakenet: FakeNet
) -> None:
    """``/etc/resolv.conf`` names the gateway address; a query to any resolver (hard-coded
    public ones of the fake internet, the gateway) is answered by whatever listens on the
    gateway's port 53 (the node resolver), which sees the sandbox's own address as the source
    -- under ``deny-all`` too (the resolver refuses names there). Without the DNAT, the query
    goes to the public address (where nothing listens)."""
    rt, egress = node
    gateway = str(egress.gateway)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((gateway, 53))
    sock.setblocking(False)
    seen: list[str] = []

    def answer() -> None:
        with contextlib.suppress(BlockingIOError):
            while True:
                _, addr = sock.recvfrom(100)
                seen.append(addr[0])
                sock.sendto(b"answer-from-node-resolver", addr)

    loop = asyncio.get_running_loop()
    loop.add_reader(sock.fileno(), answer)
    try:
        made = []
        for policy in (PUBLIC, DENY_ALL):
            s = await make(rt, policy)
            made.append(s)
            targets = (fakenet.public, fakenet.public2, gateway)
            out = await ok(s, ["python3", "-c", DNS_PROBE, *targets])
            first, conf = out.split("\n", 1)
            assert first.split() == [f"{t}=answer-from-node-resolver" for t in targets], out
            assert f"nameserver {gateway}" in conf
            assert seen[-3:] == [s.address] * 3
        fw = egress.firewall
        assert fw is not None
        fw.nft.run(f"flush chain inet {egress.table} prerouting")
        out = await ok(made[0], ["python3", "-c", DNS_PROBE, fakenet.public])
        assert out.split()[0] == f"{fakenet.public}=TimeoutError", out
        log = fakenet.exec("curl", "-s", f"http://{fakenet.public}/udp").stdout
        assert "query" in log, log  # it went to the public address itself
    finally:
        loop.remove_reader(sock.fileno())
        sock.close()


async def test_a_dead_installations_table_and_links_are_removed_by_the_next_one(
    tmp_path: Path,
) -> None:
    """An installation that crashed leaves a table and links nobody else would remove: the
    next installation starting on the host (same registry) removes them when the dead one's
    state dir is gone (and takes back its slice), or when no lifecycle of it runs (its
    liveness lock is free) and no sandbox of it is left; never while it runs."""
    registry = tmp_path / "net-ranges.json"
    dirs = [tmp_path / name for name in ("gone", "crashed", "running", "next")]
    for d in dirs:
        d.mkdir()
    gone, crashed, running, new = (
        Egress(EgressSettings(registry=registry), uuid.uuid4().hex[:10], d, d) for d in dirs
    )
    try:
        for egress in (gone, crashed, running):
            await egress.start()  # ... and none stops: crashes
            assert leftovers(egress)  # its table and gateway link
        subprocess.run(["rm", "-rf", str(dirs[0])], check=True)
        assert crashed._alive is not None
        os.close(crashed._alive)  # its process died: the kernel drops the lock
        crashed._alive = None
        await new.start()
        assert leftovers(gone) == [] and leftovers(crashed) == []
        assert leftovers(running)  # alive: untouched
        held = set(claimed_ids(registry))
        assert crashed.installation_id not in held and gone.installation_id not in held
        assert {running.installation_id, new.installation_id} <= held
        alive = tmp_path / "net-alive"
        assert not (alive / f"{crashed.installation_id}.lock").exists()
        assert (alive / f"{running.installation_id}.lock").exists()
        await new.stop()
        assert leftovers(new) == []
    finally:
        for egress in (gone, crashed, running, new):
            await egress.stop()


async def test_dead_installations_never_exhaust_the_address_pool(tmp_path: Path) -> None:
    """A pool of two slices: installations that crashed (their state dirs kept, as a test run
    or a stopped ``sandpod up`` keeps them) do not use it up; each new one takes back a dead
    one's slice. Two running ones still fill it: a third is refused by name."""
    octet = 64 + int(uuid.uuid4().hex[:2], 16) % 64
    pool = ipaddress.IPv4Network(f"10.{octet}.{32 * (uuid.uuid4().int % 8)}.0/19")
    registry = tmp_path / "net-ranges.json"

    def installation(name: str) -> Egress:
        (tmp_path / name).mkdir()
        settings = EgressSettings(pool=pool, registry=registry, ipv6=False)
        return Egress(settings, uuid.uuid4().hex[:10], tmp_path / name, tmp_path / name)

    started: list[Egress] = []
    try:
        for n in range(4):  # each one crashes: its lock dropped, its state dir kept
            egress = installation(f"crashed{n}")
            await egress.start()
            started.append(egress)
            assert egress.plan.slice.subnet_of(pool)
            assert egress._alive is not None
            os.close(egress._alive)
            egress._alive = None
        one, two, three = installation("one"), installation("two"), installation("three")
        for egress in (one, two):
            await egress.start()
            started.append(egress)
        assert one.plan.slice != two.plan.slice
        assert set(claimed_ids(registry)) == {one.installation_id, two.installation_id}
        started.append(three)
        with pytest.raises(PoolExhausted, match="SANDPOD_NET_POOL"):
            await three.start()
    finally:
        for egress in started:
            await egress.stop()
