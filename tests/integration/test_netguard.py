"""The network guard (``python -m sandpod_lifecycle.network.podguard``) run for real in a network
namespace standing in for a sandbox Pod's, attacked from a process running as the sandbox uid.

The world (``guard_harness.py``): a namespace with a veth to the host and a default route, a
fake internet behind the host (``fakenet.py``: public addresses, 169.254.169.254, a private
10.x service), a test DNS server (``dnsauth.py``) on the veth's host end as the cluster DNS,
a host TCP service as NATS, and the real API server (envtest) reached through a relay on the
veth's host end as a Pod reaches its Service IP. The guard runs with only CAP_NET_ADMIN and
CAP_NET_BIND_SERVICE and authenticates with its Sandbox's own guard ServiceAccount token;
policy updates go where lifecycle writes them: the Sandbox's ``status.network``.

Protections removed to show the attack then works (``test_each_protection_fails_when_removed``):
the table (IP literal, /etc/hosts name, an outside resolver's answer, the metadata service all
reach their target) and the port-53 DNAT alone (a query to another server is then not answered
by the guard).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from netsbx import PROBE

from dnsauth import AuthServer
from fakenet import FakeNet
from guard_harness import PodNetns, Relay, create_sandbox, guard_token, set_policy
from k8s.envtest import ControlPlane
from sandpod_contract.network import NetworkPolicy
from sandpod_kube import KubeStore, ensure_namespace

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None or shutil.which("nft") is None,
    reason="needs root, setpriv and nft (run the suite as root, as CI does)",
)

PY = "/usr/bin/python3"  # the sandbox uid's interpreter (the venv may live under /root)
DNSQ = r"""
import random, socket, struct, sys
server, port, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
qid = random.randrange(65536)
q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
q += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0\0\1\0\1"
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(1.5)
try:
    s.sendto(q, (server, port))
    data = s.recv(4096)
    print(f"rcode={data[3] & 15} answers={struct.unpack('>H', data[6:8])[0]}")
except OSError as e:
    print("timeout:" + type(e).__name__)
"""


def allowlist(*names: str) -> NetworkPolicy:
    return NetworkPolicy.from_dict({"mode": "allowlist", "allow": list(names)})


@dataclass
class World:
    pod: PodNetns
    net: FakeNet
    auth: AuthServer
    store: KubeStore
    namespace: str
    sandbox: str
    uid: int
    nats_port: int
    log: Path

    async def probe(self, *targets: str) -> dict[str, str]:
        code, out = await self.pod.as_sandbox(self.uid, PY, "-c", PROBE, *targets)
        assert code == 0, out
        result: dict[str, str] = json.loads(out)
        return result

    async def reaches(self, target: str) -> bool:
        return not (await self.probe(target))[target].startswith("refused:")

    async def resolves(self, name: str) -> bool:
        code, _ = await self.pod.as_sandbox(self.uid, "getent", "ahostsv4", name)
        return code == 0

    async def ask(self, server: str, port: int, name: str) -> str:
        return (await self.pod.as_sandbox(self.uid, PY, "-c", DNSQ, server, str(port), name))[1]

    async def policy(self, policy: NetworkPolicy) -> None:
        await set_policy(self.store, self.namespace, self.sandbox, policy)

    def log_tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])


async def until(what: str, check: Callable[[], Awaitable[bool]], timeout: float = 15) -> None:
    """Wait for an effect: ``check`` again and again (each a real probe) until it holds."""
    try:
        async with asyncio.timeout(timeout):
            while not await check():
                pass
    except TimeoutError:
        raise AssertionError(f"not within {timeout:g}s: {what}") from None


@pytest.fixture
async def world(kube_apiserver: ControlPlane, tmp_path: Path) -> AsyncIterator[World]:
    namespace = f"g-{uuid.uuid4().hex[:10]}"
    await asyncio.to_thread(ensure_namespace, kube_apiserver.settings, namespace)
    store = await KubeStore.connect(kube_apiserver.settings)
    pod, net = PodNetns(), FakeNet()
    auth = AuthServer()
    relay: Relay | None = None
    try:
        net.create()
        pod.create()
        auth.host = pod.gateway
        auth.add("allowed.test", "A", 300, net.public)
        auth.add("denied.test", "A", 300, net.public2)
        await auth.start()
        relay = Relay(pod.gateway, ("127.0.0.1", kube_apiserver.port))
        await relay.start()
        name = f"sbx-{uuid.uuid4().hex[:8]}"
        sandbox = await create_sandbox(store, namespace, name)
        token = tmp_path / "token"
        token.write_text(await guard_token(kube_apiserver.settings, sandbox))
        uid = random.randint(31000, 39000)
        world = World(pod, net, auth, store, namespace, name, uid, net.host_service(), tmp_path)
        world.log = tmp_path / "guard.log"
        await world.policy(allowlist("allowed.test"))
        ready = tmp_path / "ready"
        pod.start_guard(
            {
                "SANDPOD_SANDBOX_ID": name,
                "SANDPOD_GUARD_NAMESPACE": namespace,
                "SANDPOD_GUARD_SANDBOX_UID": str(uid),
                "SANDPOD_NATS_URL": f"nats://{pod.gateway}:{world.nats_port}",
                "SANDPOD_DNS_UPSTREAMS": f"{auth.host}:{auth.port}",
                "SANDPOD_KUBE_SERVER": f"https://{pod.gateway}:{relay.port}",
                "SANDPOD_KUBE_CA_FILE": str(kube_apiserver.ca_file),
                "SANDPOD_KUBE_TOKEN_FILE": str(token),
                "SANDPOD_KUBE_TLS_SERVER_NAME": "localhost",
                "SANDPOD_GUARD_READY_FILE": str(ready),
            },
            world.log,
        )
        async with asyncio.timeout(60):
            while not ready.exists():
                assert pod.guard is not None and pod.guard.poll() is None, world.log_tail()
                await asyncio.sleep(0.05)  # a file appearing: no event to wait on
        await until("the allowlist is in force", lambda: world.resolves("allowed.test"))
        yield world
        # in a thread: the relay on this loop must serve the guard's last API calls meanwhile
        assert await asyncio.to_thread(pod.stop_guard) == 0, world.log_tail()
    finally:
        pod.remove()
        if relay is not None:
            await relay.close()
        await auth.close()
        net.close()
        await store.close()


async def test_allowlist_opens_only_what_the_guard_resolved(world: World) -> None:
    """Allowed name: resolves and connects; denied name: refused at DNS (never asked
    upstream) and its address refused at connect; IP literal, /etc/hosts and outside
    resolvers get nowhere; metadata refused; NATS reachable."""
    w, net = world, world.net
    assert await w.resolves("allowed.test")
    assert await w.reaches(f"{net.public}:80")
    assert not await w.resolves("denied.test")
    assert w.auth.asked_for("denied.test") == 0
    assert not await w.reaches(f"{net.public2}:80"), "an IP literal"
    (w.pod.etc / "hosts").write_text(f"127.0.0.1 localhost\n{net.public2} sneaky.test\n")
    assert not await w.reaches("sneaky.test:80"), "a name from /etc/hosts"
    assert (await w.ask(w.pod.gateway, w.auth.port, "denied.test")).startswith("timeout")
    assert (await w.ask(net.public, 53, "denied.test")).startswith("rcode=5"), "DNAT: guard"
    assert w.auth.asked_for("denied.test") == 0
    assert not await w.reaches(f"{net.metadata}:80")
    assert await w.reaches(f"{w.pod.gateway}:{w.nats_port}"), "NATS"
    # A process of the Pod under another uid than the sandbox's (an image's USER, a setuid
    # leftover) is filtered all the same: only the guard's own uid 0 is not.
    code, out = await w.pod.as_sandbox(w.uid + 1, PY, "-c", PROBE, f"{net.public2}:80")
    assert code == 0 and "refused:" in out, out


async def test_public_mode_keeps_the_hard_denies(world: World) -> None:
    """Public: any public address, but never the metadata service nor a private range; NATS
    (a private address) stays reachable."""
    w, net = world, world.net
    await w.policy(NetworkPolicy())
    await until("public mode", lambda: w.reaches(f"{net.public2}:80"))
    got = await w.probe(f"{net.metadata}:80", f"{net.private}:80", f"{w.pod.gateway}:{w.nats_port}")
    assert got[f"{net.metadata}:80"].startswith("refused:")
    assert got[f"{net.private}:80"].startswith("refused:")
    assert not got[f"{w.pod.gateway}:{w.nats_port}"].startswith("refused:")


async def test_a_live_update_applies_both_ways(world: World) -> None:
    """An update of the Sandbox's status.network reaches the guard: a name allowed resolves
    and connects, taken back it is refused again; deny-all keeps NATS."""
    w, net = world, world.net
    assert not await w.resolves("denied.test")
    await w.policy(allowlist("allowed.test", "denied.test"))
    await until("denied.test allowed", lambda: w.resolves("denied.test"))
    assert await w.reaches(f"{net.public2}:80")
    await w.policy(allowlist("allowed.test"))

    async def refused() -> bool:
        return not await w.resolves("denied.test") and not await w.reaches(f"{net.public2}:80")

    await until("denied.test refused again", refused)
    await w.policy(NetworkPolicy.from_dict({"mode": "deny-all"}))
    await until("deny-all", lambda: _not(w.resolves("allowed.test")))
    assert not await w.reaches(f"{net.public}:80")
    assert await w.reaches(f"{w.pod.gateway}:{w.nats_port}"), "NATS under deny-all"


async def _not(check: Awaitable[bool]) -> bool:
    return not await check


async def test_each_protection_fails_when_removed(world: World) -> None:
    """The attacks of the first test succeed once the guard's table is gone (so it is the
    table that stops them); without the DNAT alone, a query to another server is not the
    guard's to answer."""
    w, net = world, world.net
    w.pod.nft("delete", "chain", "inet", "sandpod_guard", "nat_out")  # the DNAT only
    assert (await w.ask(net.public, 53, "denied.test")).startswith("timeout"), "no DNAT"
    assert not await w.reaches(f"{net.public2}:80")  # the filter is still in force
    assert w.pod.nft("delete", "table", "inet", "sandpod_guard").returncode == 0
    assert await w.reaches(f"{net.public2}:80"), "an IP literal"
    (w.pod.etc / "hosts").write_text(f"127.0.0.1 localhost\n{net.public2} sneaky.test\n")
    assert await w.reaches("sneaky.test:80"), "a name from /etc/hosts"
    assert (await w.ask(w.pod.gateway, w.auth.port, "denied.test")).startswith("rcode=0 ")
    assert await w.reaches(f"{net.metadata}:80"), "the metadata service"


SERVE = r"""
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(4)
print("listening", flush=True)
for _ in range(int(sys.argv[2])):
    c, _ = s.accept()
    c.sendall(b"sandbox hello")
    c.close()
"""


async def test_connections_to_the_sandbox_get_their_replies(world: World) -> None:
    """A preview-style connection from outside to a port the sandbox listens on is answered
    under an allowlist (replies are not egress), while the sandbox still cannot open one
    to that same peer."""
    w = world
    port = random.randint(20000, 29000)
    server = asyncio.create_task(w.pod.as_sandbox(w.uid, PY, "-c", SERVE, str(port), "1"))
    try:

        async def answered() -> bool:
            try:
                reader, writer = await asyncio.open_connection(w.pod.address, port)
                async with asyncio.timeout(5):
                    data = await reader.read()
                writer.close()
            except OSError:
                return False  # not listening yet
            return data == b"sandbox hello"

        await until("the sandbox's server answered", answered)
        assert not await w.reaches(f"{w.pod.gateway}:{w.auth.port}"), "no egress to that peer"
    finally:
        await asyncio.wait_for(server, 30)


@pytest.mark.parametrize(
    ("caps", "missing"),
    [("-all,+net_bind_service", "nftables"), ("-all,+net_admin", "cannot listen")],
)
async def test_the_guard_needs_both_of_its_capabilities(
    tmp_path: Path, caps: str, missing: str
) -> None:
    """Without CAP_NET_ADMIN it cannot install its table, without CAP_NET_BIND_SERVICE it
    cannot answer on port 53: either way it exits 1 and never writes its ready file (so the
    Pod's sandbox container would never start unguarded)."""
    pod = PodNetns()
    try:
        pod.create()
        ready, log = tmp_path / "ready", tmp_path / "guard.log"
        env = {
            "SANDPOD_SANDBOX_ID": "sbx-caps",
            "SANDPOD_GUARD_NAMESPACE": "ns",
            "SANDPOD_GUARD_SANDBOX_UID": "31000",
            "SANDPOD_NATS_URL": f"nats://{pod.gateway}:4222",
            "SANDPOD_DNS_UPSTREAMS": f"{pod.gateway}:53",
            "SANDPOD_KUBE_SERVER": f"https://{pod.gateway}:6443",
            "SANDPOD_GUARD_READY_FILE": str(ready),
        }
        pod.start_guard(env, log, caps=caps)
        assert pod.guard is not None
        code = await asyncio.to_thread(pod.guard.wait, 60)
        assert code == 1 and not ready.exists()
        assert "guard_cannot_enforce" in log.read_text() and missing in log.read_text()
    finally:
        pod.remove()


async def test_what_a_network_policy_cannot_say_is_enforced(world: World) -> None:
    """A deny rule with a port closes that port only, and a deny name is refused at DNS in
    public mode: both beyond a NetworkPolicy, both the guard's."""
    w, net = world, world.net
    await w.policy(NetworkPolicy.from_dict({"deny": [f"{net.public}:8080", "denied.test"]}))
    await until("public mode", lambda: w.reaches(f"{net.public2}:80"))
    got = await w.probe(f"{net.public}:80", f"{net.public}:8080")
    assert got[f"{net.public}:80"] == "fakenet public"
    assert got[f"{net.public}:8080"].startswith("refused:")
    assert not await w.resolves("denied.test") and await w.resolves("allowed.test")
