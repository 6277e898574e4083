"""The network guard in a real sandbox Pod on the real node (issue 15 part 5, issue 17 item 3).

The node's CNI (bridge) enforces no NetworkPolicy (``test_real_netpol.py`` runs an agent for its
own test only; README, "Networking on the real node"): here what stands between a sandbox Pod and
the network is the guard alone, the lifecycle image's ``sandpod_lifecycle.network.podguard`` as
a native sidecar the real kubelet starts (containerd, runc, the Pod's own network namespace,
CAP_NET_ADMIN only).

The "internet" is ``node/internet.py``: a namespace of the test's joined to the node's only,
serving HTTP on two "public" addresses; the names are the test's own DNS server
(``dnsauth.AuthServer``) on the host end of the node's link, the guard's upstream. Everything
is observed from inside the sandbox container through execd, and each refusal is shown to be
the guard's: the same probe from an unguarded sandbox Pod on the same node goes through.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from kubernetes import client

from conftest import NatsServer
from dnsauth import AuthServer
from k8s.cluster import NS, Cluster
from k8s.nodenet import KUBERNETES_SERVICE_IP
from k8s.realnode import RealNode, image
from node.conftest import pod_env
from node.internet import PROBE, PROBE_PY, NodeInternet, pod_ip
from sandpod import AsyncSandbox
from sandpod_contract.messages.sandboxes import NetworkEvent
from sandpod_kube.guardtrust import BUNDLE_FILE
from sandpod_lifecycle.network.secretstore import placeholder
from sandpod_store import ObjectMeta, Resource

pytestmark = pytest.mark.timeout(500)

GET = "python3 -c 'import sys, urllib.request as u; print(u.urlopen(sys.argv[1], timeout=3).read().decode())' "  # noqa: E501


@pytest.fixture
async def names(real_node: RealNode, internet: NodeInternet) -> AsyncIterator[AuthServer]:
    """The test's DNS on the host end of the node's link (Pods reach it; the guard forwards)."""
    assert real_node.net is not None
    auth = AuthServer(real_node.net.host_ip)
    auth.add("allowed.test", "A", 300, internet.public)
    auth.add("denied.test", "A", 300, internet.public2)
    await auth.start()
    try:
        yield auth
    finally:
        await auth.close()


def guard_env(node: RealNode, nats: NatsServer, dns: AuthServer) -> dict[str, str]:
    """``pod_env`` with the guard on: the lifecycle image as the guard's, the test DNS as the
    cluster DNS the guard forwards to, NATS where the node's Pods reach it."""
    assert node.net is not None
    return {
        **pod_env(),
        "SANDPOD_POD_NETGUARD": "true",
        "SANDPOD_POD_GUARD_IMAGE": image("sandpod-lifecycle"),
        "SANDPOD_POD_GUARD_DNS": f"{dns.host}:{dns.port}",
        "SANDPOD_POD_NATS_PORT": str(nats.port),
        "SANDPOD_POD_NATS_CIDRS": f"{node.net.host_ip}/32",
        "SANDPOD_POD_GUARD_API_CIDRS": f"{node.net.node_ip}/32",
    }


async def _template(cluster: Cluster, network: dict[str, object]) -> str:
    name = f"ng-{uuid.uuid4().hex[:6]}"
    await cluster.store.create(
        Resource(
            api_version="sandpod.dev/v1alpha1",
            kind="SandboxTemplate",
            metadata=ObjectMeta(name=name, namespace=NS),
            spec={"network": network},
        )
    )
    return name


async def _create(cluster: Cluster, template: str) -> AsyncSandbox:
    return await cluster.create(template)


async def _out(sbx: AsyncSandbox, command: str) -> str:
    return (await sbx.exec(command, timeout=30)).stdout.strip()


async def until(what: str, check: Callable[[], Awaitable[bool]], timeout: float) -> float:
    """Probe again and again (each a real attempt from the container) until ``check`` holds;
    returns the seconds it took. The timeout is the failure bound, not a measurement."""
    start = time.monotonic()
    try:
        async with asyncio.timeout(timeout):
            while not await check():
                pass
    except TimeoutError:
        raise AssertionError(f"not within {timeout:g}s: {what}") from None
    return time.monotonic() - start


async def test_the_pods_guard_enforces_names_and_addresses_on_the_real_node(
    node_cluster: Cluster,
    real_node: RealNode,
    node_nats: NatsServer,
    internet: NodeInternet,
    names: AuthServer,
) -> None:
    """From inside a real sandbox container, under an allowlist of ``allowed.test``: the allowed
    name resolves and its server answers; ``denied.test`` is refused by the guard's resolver
    (never asked upstream); by IP literal its address, the node (API server, kubelet), the
    ``kubernetes`` Service and another sandbox Pod are unreachable -- each of which an
    unguarded Pod (or the node) on the same node reaches; a runtime ``network.update`` opens
    ``denied.test`` within the SDK's apply wait; the refusal reaches the Sandbox's
    ``network.denied`` events."""
    assert real_node.net is not None
    node = real_node.net
    forbidden = [
        (internet.public2, 80),  # denied.test's address, as an IP literal
        (node.node_ip, 6443),  # the node: its API server
        (node.node_ip, 10250),  # and its kubelet
        (KUBERNETES_SERVICE_IP, 443),  # the API server through its Service (kube-proxy)
    ]
    policy: dict[str, object] = {"mode": "allowlist", "allow": ["allowed.test"]}
    template = await _template(node_cluster, policy)
    plain = node_cluster.service("sandpod_lifecycle", **pod_env())
    await node_cluster.answering()
    open_box = await _create(node_cluster, template)
    try:  # the positive control: the bridge CNI lets a Pod without the guard reach all of it
        for host, port in forbidden:
            assert await _out(open_box, f"{PROBE}{host} {port}") == "reached", (host, port)
    finally:
        await open_box.kill()
        await open_box.close()
    plain.stop()

    node_cluster.service(
        "sandpod_lifecycle", "lifecycle1", **guard_env(real_node, node_nats, names)
    )
    await node_cluster.answering()
    sbx, peer = await asyncio.gather(*(_create(node_cluster, template) for _ in range(2)))
    try:
        await _names_and_addresses(sbx, internet, names, forbidden)
        await _another_pod(node_cluster, real_node, sbx, peer)
        await _refusal_event(sbx)
        view = await sbx.network.update(allow=["allowed.test", "denied.test"])
        assert view.applied, view
        took = await until(
            "denied.test opened by the update",
            lambda: _opened(sbx, internet.public2),
            timeout=10,  # the SDK's APPLY_WAIT: an applied update is in force by then
        )
        print(f"network.update applied -> in force in the Pod after {took * 1000:.0f} ms")
        assert await _out(sbx, GET + "http://denied.test/") == "fakenet public2"
    finally:
        for box in (sbx, peer):
            await box.kill()
            await box.close()


async def _names_and_addresses(
    sbx: AsyncSandbox,
    internet: NodeInternet,
    names: AuthServer,
    forbidden: list[tuple[str, int]],
) -> None:
    status = await _out(sbx, "grep -E '^(Uid|CapEff):' /proc/self/status")
    assert "\t0\t" not in status.splitlines()[0] and status.endswith("0000000000000000")
    answer = await _out(sbx, "getent ahostsv4 allowed.test | head -1")
    assert answer.split()[:2] == [internet.public, "STREAM"], answer
    assert await _out(sbx, GET + "http://allowed.test/") == "fakenet public"
    refused = await sbx.exec("getent ahostsv4 denied.test")
    assert refused.exit_code != 0 and refused.stdout == "", refused
    assert names.asked_for("denied.test") == 0, "a refused name never leaves the Pod"
    for host, port in forbidden:
        assert (await _out(sbx, f"{PROBE}{host} {port}")).startswith("refused:"), (host, port)


async def _another_pod(
    cluster: Cluster, node: RealNode, sbx: AsyncSandbox, peer: AsyncSandbox
) -> None:
    """``peer`` listens on its Pod's address; the node reaches it (so the bridge delivers and
    no ingress rule stops it: see the README), ``sbx``'s guard keeps ``sbx`` from it."""
    assert node.net is not None
    address = await asyncio.to_thread(pod_ip, cluster, peer.id)
    server = await peer.proc.start("python3 -m http.server 8000", proc_id="listener")
    try:
        await server.wait_for_port(8000, timeout=30)
        from_node = await asyncio.to_thread(
            subprocess.run,
            [*node.net.enter(), sys.executable, "-c", PROBE_PY, address, "8000"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert from_node.stdout.strip() == "reached", from_node
        assert (await _out(sbx, f"{PROBE}{address} 8000")).startswith("refused:")
    finally:
        await server.kill()
        await server.remove()


async def _refusal_event(sbx: AsyncSandbox) -> None:
    """A refused lookup becomes a ``network.denied`` event of the Sandbox (guard -> report
    ConfigMap -> lifecycle -> NATS): each probe a real refused lookup, until one arrives."""
    events = sbx.network.events()
    seen: asyncio.Future[NetworkEvent] = asyncio.get_running_loop().create_future()

    async def collect() -> None:
        async for event in events:
            if event.type == "denied" and event.destination == "denied.test":
                seen.set_result(event)
                return

    collector = asyncio.create_task(collect())
    try:
        await until("a network.denied event of denied.test", lambda: _refused_again(sbx, seen), 60)
        event = seen.result()
        assert event.kind == "dns" and event.name == sbx.id, event
    finally:
        collector.cancel()
        await asyncio.gather(collector, return_exceptions=True)
        await events.aclose()  # type: ignore[attr-defined]


async def _refused_again(sbx: AsyncSandbox, seen: asyncio.Future[NetworkEvent]) -> bool:
    if seen.done():
        return True
    await sbx.exec("getent ahostsv4 denied.test")
    return seen.done()


async def _opened(sbx: AsyncSandbox, address: str) -> bool:
    r = await sbx.exec("getent ahostsv4 denied.test | head -1")
    return r.stdout.startswith(address)


HTTPS = (
    "python3 -c 'import sys, urllib.request as u, urllib.error as e\n"
    "try: print(u.urlopen(sys.argv[1], timeout=10).status)\n"
    "except e.HTTPError as x: print(x.code)\n"
    'except e.URLError as x: print("failed:", x.reason)\' '
)


async def test_an_injecting_pods_commands_trust_the_guard_for_that_domain_by_default(
    node_cluster: Cluster,
    real_node: RealNode,
    node_nats: NatsServer,
    internet: NodeInternet,
    names: AuthServer,
) -> None:
    """A template injecting a Kubernetes Secret's value as a header for ``api.test``: in the
    real Pod, the commands' environment holds the placeholder, never the value; HTTPS to
    ``api.test`` with the client's *default* trust completes the TLS handshake with the guard's
    interception certificate (the guard then answers 502: the fake internet has no port 443),
    because the init container ``trust-bundle`` merged the image's CA bundle with the guard's
    authority. The control: the image's own bundle alone refuses that certificate. A second
    sandbox of a template without the injection trusts no Sandpod authority until
    ``network.update`` adds it; then the same HTTPS goes through with the default trust."""
    names.add("api.test", "A", 300, internet.public)
    value, tok = f"s3cr3t-{uuid.uuid4().hex}", f"tok{uuid.uuid4().hex[:6]}"
    body = client.V1Secret(metadata=client.V1ObjectMeta(name=tok), string_data={"value": value})
    with node_cluster.plane.settings.api_client() as api:
        await asyncio.to_thread(client.CoreV1Api(api).create_namespaced_secret, NS, body)
    policy: dict[str, object] = {
        "mode": "allowlist",
        "allow": ["api.test:443"],
        "inject": [{"domain": "api.test", "secret": f"{tok}/value"}],
    }
    template = await _template(node_cluster, policy)
    node_cluster.service("sandpod_lifecycle", **guard_env(real_node, node_nats, names))
    await node_cluster.answering()
    sbx = await _create(node_cluster, template)
    try:
        env = await _out(sbx, "env")
        want = f"SANDPOD_SECRET_{tok.upper()}_VALUE={placeholder(f'{tok}/value')}"
        assert want in env.splitlines(), env
        assert value not in env
        system = int(await _out(sbx, "grep -c 'BEGIN CERT' /etc/ssl/certs/ca-certificates.crt"))
        assert await _out(sbx, "echo $SSL_CERT_FILE") == BUNDLE_FILE

        async def merged() -> bool:  # the guard's authority arrives with its first policy
            count = await _out(sbx, "grep -c 'BEGIN CERT' $SSL_CERT_FILE")
            return int(count) == system + 1

        await until("the guard's authority in the merged bundle", merged, timeout=30)
        assert await _out(sbx, HTTPS + "https://api.test/") == "502"
        alone = await _out(
            sbx, "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt " + HTTPS + "https://api.test/"
        )
        assert alone.startswith("failed:") and "CERTIFICATE_VERIFY_FAILED" in alone, alone
    finally:
        await sbx.kill()
        await sbx.close()
    plain = await _template(node_cluster, {"mode": "allowlist", "allow": ["api.test:443"]})
    later = await _create(node_cluster, plain)
    try:
        assert await _out(later, "echo $SSL_CERT_FILE") == BUNDLE_FILE
        count = "grep -c 'BEGIN CERT' $SSL_CERT_FILE"
        assert int(await _out(later, count)) == system, "no injection: no Sandpod authority"
        await later.network.update(inject=policy["inject"])  # type: ignore[arg-type]

        async def trusted() -> bool:
            return int(await _out(later, count)) == system + 1

        await until("the authority of the injection added at runtime", trusted, timeout=30)
        assert await _out(later, HTTPS + "https://api.test/") == "502"
    finally:
        await later.kill()
        await later.close()
