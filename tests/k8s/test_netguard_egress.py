"""The Pod guard's egress proxy, header injection from a Kubernetes Secret, and IPv6, end to end
from the Pod spec: the real API server, the Pod runtime's driver, the fake kubelet running the
Pod's guard container (its env, its ServiceAccount's token) in a network namespace of the
Pod's own, and a fake internet (``fakenet.py``: HTTP and HTTPS with a test CA, IPv6 too).

Every attack runs as the sandbox container's uid inside the Pod's namespace, and each test
removes the protection it is about (the proxy's DNAT, the guard's table) to show the same
attack then succeeds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from conftest import NatsServer
from egress_harness import InternetCA, make_test_ca
from fakenet import FakeNet
from guard_harness import PodGuards, PodNetns, create_sandbox, guard_token, set_policy
from k8s.envtest import ControlPlane
from k8s.kubelet import FakeKubelet
from k8s.test_netguard_pod import SETTINGS, _nats_secret
from sandpod_bus import Bus, BusSettings
from sandpod_bus.transport import Inbound
from sandpod_contract.codec import decode
from sandpod_contract.messages.sandboxes import NetworkEvent
from sandpod_contract.network import NetworkPolicy
from sandpod_contract.resources import SandboxSpec, SandboxTemplateSpec
from sandpod_contract.subjects import Subjects
from sandpod_kube import KubeSettings, KubeStore, PodApi, StoreForbidden
from sandpod_kube.guardreport import write_report
from sandpod_kube.guardwatch import read_secret_keys
from sandpod_lifecycle.driver import Owner
from sandpod_lifecycle.events import Events
from sandpod_lifecycle.network.metrics import NetworkMetrics
from sandpod_lifecycle.network.podguard.report import GuardReport, Refusal
from sandpod_lifecycle.network.secretstore import placeholder
from sandpod_lifecycle.runtime.guardreports import follow_guard_reports
from sandpod_lifecycle.runtime.pod import GUARD_IPV4_ONLY, PodDriver

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None or shutil.which("nft") is None,
    reason="needs root, setpriv and nft (network namespaces, nftables): run as root, as CI does",
)

PY = "/usr/bin/python3"  # the sandbox uid's interpreter (the venv may live under /root)
NAMES = ["allowed.test", "denied.test", "api.example.test"]
# One request as the sandbox: connect to ADDR:PORT, say NAME (TLS SNI, or HTTP Host), send a
# header; prints the response body, or "refused:<error>".
CLIENT = r"""
import socket, ssl, sys
scheme, addr, port, name, header, cafile = sys.argv[1:7]
try:
    s = socket.create_connection((addr, int(port)), timeout=5)  # a name: the guard resolves
    if scheme == "https":
        ctx = ssl.create_default_context(cafile=cafile)
        s = ctx.wrap_socket(s, server_hostname=name)
    extra = f"Authorization: {header}\r\n" if header else ""
    s.sendall(f"GET /headers HTTP/1.1\r\nHost: {name}\r\n{extra}Connection: close\r\n\r\n".encode())
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    head, _, body = data.decode(errors="replace").partition("\r\n\r\n")
    print(body if " 200 " in head.split("\r\n")[0] else "refused:" + head.split("\r\n")[0])
except (OSError, ssl.SSLError) as e:
    print("refused:" + type(e).__name__ + ":" + str(e)[:80])
"""


@dataclasses.dataclass
class PodWorld:
    plane: ControlPlane
    store: KubeStore
    driver: PodDriver
    namespace: str
    name: str
    pod: PodNetns
    net: FakeNet
    internet: InternetCA
    root: Path  # the guard's files (its log, its CA dir, the trust file)
    uid: int
    api_url: str  # the API server as the Pod reaches it
    shared: Path  # files the sandbox uid may read (what the Pod mounts for it)

    async def request(
        self, scheme: str, addr: str, name: str, header: str = "", cafile: str = ""
    ) -> str:
        port = "443" if scheme == "https" else "80"
        argv = (PY, "-c", CLIENT, scheme, addr, port, name, header, cafile or self.ica)
        code, out = await self.pod.as_sandbox(self.uid, *argv)
        assert code == 0, out
        return out.strip()

    @property
    def ica(self) -> str:
        return str(self.shared / "internet-ca.pem")

    async def policy(self, raw: dict[str, object]) -> NetworkPolicy:
        """What lifecycle does on an update: ``apply_network``, then status.network."""
        policy = NetworkPolicy.from_dict(raw)
        await self.driver.apply_network(self.name, policy)
        await set_policy(self.store, self.namespace, self.name, policy)
        return policy

    def log(self) -> str:
        return "\n".join((self.root / "guard.log").read_text().splitlines()[-40:])


@pytest.fixture
def internet(tmp_path: Path) -> InternetCA:
    return make_test_ca(tmp_path / "internet", NAMES)


@pytest.fixture
def fakenet(internet: InternetCA) -> Iterator[FakeNet]:
    with FakeNet(tls_cert=internet.cert_file, ipv6=True) as net:
        yield net


@pytest.fixture
async def world(
    kube_apiserver: ControlPlane,
    namespace: str,
    tmp_path: Path,
    fakenet: FakeNet,
    internet: InternetCA,
) -> AsyncIterator[PodWorld]:
    """A sandbox Pod with the guard, under allowlist allowed.test + api.example.test (the
    latter injected from the Kubernetes Secret ``tok``, key ``value``)."""
    await asyncio.to_thread(_setup_namespace, kube_apiserver, namespace)
    store = await KubeStore.connect(kube_apiserver.settings)
    sandbox = await create_sandbox(store, namespace, f"sbx-{uuid.uuid4().hex[:8]}")
    name = sandbox.metadata.name
    policy = NetworkPolicy.from_dict(INJECTING)
    await set_policy(store, namespace, name, policy)
    template = SandboxTemplateSpec(network=policy)

    async def templates(_namespace: str, _name: str | None) -> SandboxTemplateSpec:
        return template

    api = PodApi(kube_apiserver.settings)
    driver = PodDriver(
        api, SETTINGS, installation="ig", ready_timeout=60, namespace=namespace, templates=templates
    )
    records = [
        ("allowed.test", fakenet.public),
        ("denied.test", fakenet.public2),
        ("api.example.test", fakenet.public2),
    ]
    guards = PodGuards(
        kube_apiserver.settings, kube_apiserver.port, kube_apiserver.ca_file, tmp_path, records
    )
    guards.env["SANDPOD_EGRESS_UPSTREAM_CA_FILE"] = str(internet.ca_file)
    guards.ipv6 = True
    kubelet = FakeKubelet(kube_apiserver.settings, namespace, tmp_path / "kubelet")
    kubelet.run_execd = False  # execd would run on the host, outside the Pod's netns
    kubelet.guard_runner = guards
    shared = Path(tempfile.mkdtemp(prefix="sp-pod-shared-"))  # readable by the sandbox uid
    shared.chmod(0o755)
    (shared / "internet-ca.pem").write_text(internet.ca_file.read_text())
    (shared / "internet-ca.pem").chmod(0o644)
    try:
        async with kubelet:
            await driver.ensure(
                name, SandboxSpec(), template, Owner(namespace, sandbox.metadata.uid)
            )
            world = PodWorld(
                kube_apiserver,
                store,
                driver,
                namespace,
                name,
                guards.netns[name],
                fakenet,
                internet,
                tmp_path / name,
                SETTINGS.run_as_user,
                guards.api_urls[name],
                shared,
            )
            yield world
            await driver.destroy(name)
    finally:
        await guards.close()
        await api.close()
        await store.close()
        shutil.rmtree(shared, ignore_errors=True)


SECRET = f"s3cr3t-{uuid.uuid4().hex}"
INJECTING = {
    "mode": "allowlist",
    "allow": ["allowed.test", "api.example.test"],
    "inject": [{"domain": "api.example.test", "secret": "tok/value"}],
}


def _setup_namespace(plane: ControlPlane, namespace: str) -> None:
    """The default ServiceAccount (admission wants it), the NATS URL Secret, and the Secret
    the injection names."""
    with plane.settings.api_client() as api_client:
        core = client.CoreV1Api(api_client)
        core.create_namespaced_service_account(
            namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="default"))
        )
        core.create_namespaced_secret(
            namespace,
            client.V1Secret(
                metadata=client.V1ObjectMeta(name="tok"), string_data={"value": SECRET}
            ),
        )
    _nats_secret(plane, namespace)


async def test_the_pods_proxy_checks_sni_and_host_and_fails_open_without_it(
    world: PodWorld,
) -> None:
    """On allowed.test's address: HTTP with Host allowed.test reaches the server; Host
    denied.test, no Host (an IP literal) and TLS with SNI denied.test are refused by the
    guard's proxy. With the proxy's DNAT removed, the same forbidden Host and SNI get through
    (the address is allowed): it is the proxy that stops them."""
    w, public, at = world, world.net.public, "allowed.test"  # connect there (the guard resolves)
    assert "Host: allowed.test" in await w.request("http", at, "allowed.test")
    assert (await w.request("http", at, "denied.test")).startswith("refused:HTTP/1.1 403")
    assert (await w.request("http", public, public)).startswith("refused:HTTP/1.1 403")
    assert (await w.request("https", at, "denied.test")).startswith("refused:SSLError")
    assert "Host: allowed.test" in await w.request("https", at, "allowed.test")
    assert w.pod.nft("flush", "chain", "inet", "sandpod_guard", "nat_0").returncode == 0
    assert "Host: denied.test" in await w.request("http", at, "denied.test")
    assert "Host: denied.test" in await w.request("https", at, "denied.test")


async def test_a_secret_from_a_kubernetes_secret_is_injected_and_never_readable(
    world: PodWorld,
) -> None:
    """api.example.test (HTTP and HTTPS, the latter through the guard's authority, which the
    sandbox trusts from the trust file) reaches the server with the Secret's value in place of
    the placeholder; the sandbox process finds the value nowhere: not in its environment, not
    in the guard's /proc files, not through the API server (it has no token; anonymous is
    refused), not on the allowed server it could echo headers from."""
    w = world
    trust = w.root / "trust" / "egress.pem"
    shared = w.shared / "egress.pem"  # the Pod's read-only trust mount, here
    shared.write_text(trust.read_text())
    shared.chmod(0o644)
    bearer = f"Bearer {placeholder('tok/value')}"
    for scheme, ca in (("http", ""), ("https", str(shared))):
        seen = await w.request(scheme, "api.example.test", "api.example.test", bearer, ca)
        assert f"Authorization: Bearer {SECRET}" in seen, (scheme, seen, w.log())
        assert placeholder("tok/value") not in seen
    own = await w.request("https", "api.example.test", "api.example.test", bearer)
    assert own.startswith("refused:SSLCertVerification"), "the sandbox sees the guard's cert"
    plain = await w.request("http", "allowed.test", "allowed.test", bearer)
    assert SECRET not in plain and placeholder("tok/value") in plain, "no injection elsewhere"
    guard = w.pod.guard
    assert guard is not None
    snoop = SNOOP.replace("PID", str(guard.pid)).replace("SECRET", SECRET)
    code, out = await w.pod.as_sandbox(w.uid, PY, "-c", snoop)
    assert code == 0 and out.split() == ["env:clean", "environ:denied", "mem:denied"], out
    anonymous = ANON.replace("NS", w.namespace)
    code, out = await w.pod.as_sandbox(w.uid, PY, "-c", anonymous, w.api_url)
    assert code == 0 and out.strip() in ("401", "403", "unreachable"), out
    code, out = await asyncio.to_thread(_run_on_host, anonymous, w.api_url)  # reached: refused
    assert code == 0 and out.strip() in ("401", "403"), out
    # the positive control: the guard's credential (and only it) reads the Secret
    assert await _secret_as_guard(w) == SECRET


SNOOP = r"""
import os
print("env:" + ("leak" if any("SECRET" in v for v in os.environ.values()) else "clean"))
for part in ("environ", "mem"):
    try:
        with open(f"/proc/PID/{part}", "rb") as f:
            print(part + (":leak" if b"SECRET" in f.read(1 << 20) else ":read"))
    except OSError:
        print(part + ":denied")
"""
ANON = r"""
import ssl, sys, urllib.request, urllib.error
ctx = ssl.create_default_context()
ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
try:
    url = sys.argv[1] + "/api/v1/namespaces/NS/secrets/tok"
    urllib.request.urlopen(url, context=ctx, timeout=3)
    print("200")
except urllib.error.HTTPError as e:
    print(e.code)
except (urllib.error.URLError, OSError):
    print("unreachable")
"""


def _run_on_host(script: str, *args: str) -> tuple[int, str]:
    done = subprocess.run([PY, "-c", script, *args], capture_output=True, text=True, timeout=30)
    return done.returncode, done.stdout


async def _secret_as_guard(w: PodWorld) -> str:
    """What the guard's own token (the kubelet's projection of its ServiceAccount) reads."""
    token = (w.root / "token").read_text()
    as_guard = KubeSettings(host=w.plane.url, ca_file=str(w.plane.ca_file), token=token)
    return (await read_secret_keys(as_guard, w.namespace, "tok"))["value"]


async def test_ipv6_is_refused_in_the_pod_and_said_so(world: PodWorld) -> None:
    """The Pod has IPv6 (dual stack); as the sandbox uid, even under ``public``: a global v6
    server, the v6 metadata address, a ULA (the node's end of the veth), its link-local
    address, and the v4 metadata service through a v4-mapped address are all refused; the
    guard counts the v6 refusals; status.network says IPv4 only. Without the guard's table the
    same v6 destinations are reached."""
    w, net = world, world.net
    enforcement = await w.driver.apply_network(w.name, await w.policy({"mode": "public"}))
    assert GUARD_IPV4_ONLY in enforcement.reason
    server = _HostServer(w.pod.host_if)
    try:
        targets = [
            f"[{net.public6}]:80",
            f"[{net.metadata6}]:80",
            f"[{w.pod.gateway6}]:{server.port}",
            f"[{server.link_local}%{w.pod.peer_if}]:{server.port}",
            f"[::ffff:{net.metadata}]:80",
        ]
        got = await _probe(w, targets)
        assert all(v.startswith("refused:") for v in got.values()), got
        counted = w.pod.nft("list", "counter", "inet", "sandpod_guard", "denied6").stdout
        assert "packets 0 " not in counted, counted
        assert w.pod.nft("delete", "table", "inet", "sandpod_guard").returncode == 0
        got = await _probe(w, targets[:4])
        assert not any(v.startswith("refused:") for v in got.values()), got
    finally:
        server.close()


PROBE6 = r"""
import json, socket, sys
out = {}
for t in sys.argv[1:]:
    host, port = t.rsplit(":", 1)
    host = host.strip("[]")
    try:
        info = socket.getaddrinfo(host, int(port), socket.AF_INET6, socket.SOCK_STREAM)[0]
        s = socket.socket(socket.AF_INET6)
        s.settimeout(3)
        s.connect(info[4])
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        out[t] = s.recv(200).decode(errors="replace").split("\r\n\r\n")[-1].strip() or "connected"
        s.close()
    except OSError as e:
        out[t] = "refused:" + type(e).__name__
print(json.dumps(out))
"""


async def _probe(w: PodWorld, targets: list[str]) -> dict[str, str]:
    code, out = await w.pod.as_sandbox(w.uid, PY, "-c", PROBE6, *targets)
    assert code == 0, out
    result: dict[str, str] = json.loads(out)
    return result


class _HostServer:
    """A TCP service on the host, on every address (v6 and v4-mapped): the node the Pod must
    not reach over IPv6. Answers each connection with a line."""

    def __init__(self, host_if: str) -> None:
        self.sock = socket.socket(socket.AF_INET6)
        self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        self.sock.bind(("::", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.link_local = _link_local(host_if)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"HTTP/1.0 200 OK\r\n\r\nnode")

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._thread.join(10)


def _link_local(ifname: str) -> str:
    for line in Path("/proc/net/if_inet6").read_text().splitlines():
        raw, _, _, scope, _, name = line.split()
        if name == ifname and scope == "20":
            return ":".join(raw[i : i + 4] for i in range(0, 32, 4))
    raise AssertionError(f"no link-local address on {ifname}")


async def test_refusals_in_the_pod_become_the_sandboxs_events_and_cannot_be_forged(
    world: PodWorld, nats: NatsServer
) -> None:
    """A refused lookup (dns), a refused Host (sni, the proxy) and a refused IP literal
    (connect, the table's drop counter) inside the Pod reach the sandbox's ``network.denied``
    events on the real event stream, and ``sandpod_lifecycle_network_denied_total``, through
    the guard's report ConfigMap and lifecycle's reader. Another sandbox's guard credential
    cannot write this sandbox's report (403), and what it writes to its own is published under
    its own name only."""
    w = world
    bus = await Bus.connect(BusSettings(url=nats.url))
    subjects = Subjects(f"pg{uuid.uuid4().hex[:6]}")
    events = Events(bus, subjects, stream=subjects.storage("events"))
    await events.setup()
    seen: asyncio.Queue[tuple[str, NetworkEvent]] = asyncio.Queue()

    async def on_event(msg: Inbound) -> None:
        await seen.put((msg.subject, decode(NetworkEvent, msg.data)))

    sub = await bus.subscribe(subjects.events_all(), on_event)
    registry = CollectorRegistry()
    metrics = NetworkMetrics(registry)
    reader = asyncio.create_task(
        follow_guard_reports(w.plane.settings, w.namespace, events, metrics.denied)
    )
    try:
        code, _ = await w.pod.as_sandbox(w.uid, "getent", "ahostsv4", "denied.test")
        assert code != 0
        assert (await w.request("http", "allowed.test", "denied.test")).startswith("refused:")
        assert (await w.request("http", w.net.public2, "x")).startswith("refused:Timeout")
        want = {("dns", "denied.test"), ("sni", "denied.test:80"), ("connect", "")}
        got: set[tuple[str, str]] = set()
        while not want <= got:
            try:
                subject, event = await asyncio.wait_for(seen.get(), 30)
            except TimeoutError:
                raise AssertionError(f"events seen: {got}, want {want}") from None
            assert subject == subjects.event("network", w.name, "denied"), subject
            got.add((event.kind, event.destination))
        for kind in ("dns", "sni", "connect"):
            value = registry.get_sample_value(
                "sandpod_lifecycle_network_denied_total", {"kind": kind}
            )
            assert value is not None and value >= 1, (kind, value)
        await _forgery_refused(w, subjects, seen)
    finally:
        reader.cancel()  # its watch thread is joined on the way out (up to 10 s)
        await asyncio.gather(reader, return_exceptions=True)
        await sub.drain()
        await bus.close()


async def _forgery_refused(
    w: PodWorld, subjects: Subjects, seen: asyncio.Queue[tuple[str, NetworkEvent]]
) -> None:
    """B's guard token: A's report is forbidden; B's own report is published as B's."""
    b = await create_sandbox(w.store, w.namespace, f"sbx-b-{uuid.uuid4().hex[:6]}")
    token_b = await guard_token(w.plane.settings, b)
    as_b = KubeSettings(host=w.plane.url, ca_file=str(w.plane.ca_file), token=token_b)
    forged = GuardReport(99, (Refusal("connect", "203.0.113.9:443", "forged"),), {"connect": 1})
    with pytest.raises(StoreForbidden):
        await write_report(as_b, w.namespace, w.name, forged.to_json())
    await write_report(as_b, w.namespace, b.metadata.name, forged.to_json())
    async with asyncio.timeout(30):
        while True:
            subject, event = await seen.get()
            if event.destination == "203.0.113.9:443":
                break
            assert subject == subjects.event("network", w.name, "denied")  # A's real ones
    assert subject == subjects.event("network", b.metadata.name, "denied"), subject


async def test_an_injection_added_at_runtime_reaches_the_guard_and_its_credential(
    world: PodWorld,
) -> None:
    """A policy update that injects from another Secret (``tok2``): lifecycle's
    ``apply_network`` grants the guard that Secret and takes ``tok`` away; the next request
    carries the new value; the old Secret is no longer readable with the guard's token."""
    w = world
    other = f"other-{uuid.uuid4().hex}"
    await asyncio.to_thread(_secret, w, "tok2", other)
    raw: dict[str, object] = {
        **INJECTING,
        "inject": [{"domain": "api.example.test", "secret": "tok2/value"}],
    }
    await w.policy(raw)
    bearer = f"Bearer {placeholder('tok2/value')}"

    async def injected() -> bool:
        seen = await w.request("http", "api.example.test", "api.example.test", bearer)
        return f"Authorization: Bearer {other}" in seen

    async with asyncio.timeout(30):
        while not await injected():
            pass
    with pytest.raises(StoreForbidden):
        await _secret_as_guard(w)  # tok: no longer granted


def _secret(w: PodWorld, name: str, value: str) -> None:
    with w.plane.settings.api_client() as api_client:
        client.CoreV1Api(api_client).create_namespaced_secret(
            w.namespace,
            client.V1Secret(metadata=client.V1ObjectMeta(name=name), string_data={"value": value}),
        )
