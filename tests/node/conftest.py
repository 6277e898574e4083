"""Fixtures for tests on a real node (tests/k8s/realnode.py): kubelet, containerd, runc, CNI.

``real_node`` starts once per session, on first use, and fails (never skips) with what to run
when a part is missing. ``node_nats`` is a NATS on the host end of the node's link, the address
Pods reach; ``node_cluster`` is a Kubernetes-mode installation on the node (the test starts the
services it needs, as host processes) whose sandboxes are real Pods. ``node_operator_nats`` and
``op_node_cluster`` are the same in NATS operator mode: every service as its own user, every
sandbox Pod with its own JWT in a Secret the real kubelet mounts (tests/node/test_real_creds.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path

import pytest

from conftest import SESSION_DAEMON_PIDS, NatsServer
from k8s.cluster import NS, Cluster, cluster_setup
from k8s.envtest import REPO, crd_manifests
from k8s.realnode import RealNode, image, missing_parts
from node.internet import NodeInternet
from operator_nats import OperatorNats, kubernetes_service_users
from sandpod_kube import KubeStore, apply_crds

IMAGES = REPO / "build" / "images"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test on the real node carries what the node saw: its Pods, recent events and the
    kubelet's and containerd's last lines (a Pod that never got Ready says why there)."""
    report = yield
    node = next(
        (v for v in getattr(item, "funcargs", {}).values() if isinstance(v, RealNode)), None
    )
    if node is None or not report.failed or call.when == "teardown":
        return report
    kubeconfig = node.dir / "admin.kubeconfig"
    for title, argv in (
        ("pods", ["get", "pods", "-A", "-o", "wide"]),
        ("events", ["get", "events", "-A", "--sort-by=.lastTimestamp"]),
    ):
        try:
            done = subprocess.run(
                ["kubectl", f"--kubeconfig={kubeconfig}", *argv],
                capture_output=True,
                text=True,
                check=False,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            report.sections.append((f"real node: {title}", f"kubectl: {exc}"))
            continue
        lines = (done.stdout + done.stderr).splitlines()[-40:]
        report.sections.append((f"real node: {title}", "\n".join(lines)))
    for component in ("kubelet", "containerd"):
        report.sections.append((f"real node: {component} log", node.log_tail(component, 30)))
    return report


@pytest.fixture(scope="session")
def real_node() -> Iterator[RealNode]:
    if problem := missing_parts(IMAGES):
        pytest.fail(problem)
    node = RealNode(Path(tempfile.mkdtemp(prefix="sandpod-node-", dir="/var/tmp")), IMAGES)
    manifests = crd_manifests()
    try:
        node.start()
        apply_crds(node.settings, manifests)
    except Exception as exc:
        node.stop()
        shutil.rmtree(node.dir, ignore_errors=True)
        pytest.fail(f"the real node did not come up: {exc}")
    SESSION_DAEMON_PIDS.update(node.pids())
    yield node
    node.stop()
    shutil.rmtree(node.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def node_nats(
    real_node: RealNode, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NatsServer]:
    assert real_node.net is not None
    server = NatsServer(tmp_path_factory.mktemp("node-nats"), host=real_node.net.host_ip)
    server.start()
    assert server.proc is not None
    SESSION_DAEMON_PIDS.add(server.proc.pid)
    yield server
    server.stop()


@pytest.fixture
async def node_cluster(
    real_node: RealNode, node_nats: NatsServer, tmp_path: Path
) -> AsyncIterator[Cluster]:
    """Lifecycle and pool (as the test starts them) on the node's API server; Pods are real."""
    assert real_node.plane is not None
    await asyncio.to_thread(cluster_setup, real_node.settings, node_nats.url)
    c = Cluster(real_node.plane, node_nats, tmp_path)
    c.store = await KubeStore.connect(real_node.settings)
    try:
        yield c
    finally:
        await c.cleanup()
        await c.store.close()


@pytest.fixture(scope="session")
def node_operator_nats(
    real_node: RealNode, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorNats]:
    """An operator-mode NATS on the host end of the node's link, its monitoring on loopback."""
    assert real_node.net is not None
    op = OperatorNats(tmp_path_factory.mktemp("node-op-nats"), real_node.net.host_ip, monitor=True)
    op.server.start()
    assert op.server.proc is not None
    SESSION_DAEMON_PIDS.add(op.server.proc.pid)
    yield op
    op.server.stop()


@dataclasses.dataclass
class OpCluster:
    """``cluster``'s services connect as their own users; ``seed`` is the account seed file
    lifecycle mints sandbox creds with; ``client_creds`` is what the test's SDK connects with."""

    cluster: Cluster
    nats: OperatorNats
    seed: Path
    client_creds: Path


@pytest.fixture
async def op_node_cluster(
    real_node: RealNode,
    node_operator_nats: OperatorNats,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[OpCluster]:
    """``node_cluster`` on the operator-mode NATS: the services as least-privilege users, the
    SDK as the client user (``SANDPOD_NATS_CREDS``), sandbox Pods with their own creds."""
    assert real_node.plane is not None
    await asyncio.to_thread(cluster_setup, real_node.settings, node_operator_nats.url)
    c = Cluster(real_node.plane, node_operator_nats.server, tmp_path)
    c.store = await KubeStore.connect(real_node.settings)
    client_creds, seed = kubernetes_service_users(
        node_operator_nats, c.prefix, c.credentials, tmp_path
    )
    monkeypatch.setenv("SANDPOD_NATS_CREDS", str(client_creds))  # the SDK (not execd)
    try:
        yield OpCluster(c, node_operator_nats, seed, client_creds)
    finally:
        await c.cleanup()
        await c.store.close()


@pytest.fixture
async def internet(real_node: RealNode) -> AsyncIterator[NodeInternet]:
    """A fake internet joined to the node's netns only (``node/internet.py``), gone after."""
    assert real_node.net is not None
    net = NodeInternet(real_node.net)
    await asyncio.to_thread(net.create)
    try:
        yield net
    finally:
        await asyncio.to_thread(net.close)
    assert net.leftovers() == []


def pod_env() -> dict[str, str]:
    """The Pod runtime's settings for the node's images."""
    return {
        "SANDPOD_RUNTIME": "kubernetes",
        "SANDPOD_POD_EXECD_IMAGE": image("sandpod-execd"),
        "SANDPOD_POD_DEFAULT_IMAGE": image("sandpod-base"),
        "SANDPOD_RESYNC": "0.5",
        "SANDPOD_READY_TIMEOUT": "240",  # a node's first Pod on a cold, loaded machine
    }


__all__ = [
    "IMAGES",
    "NS",
    "OpCluster",
    "internet",
    "node_cluster",
    "node_nats",
    "node_operator_nats",
    "op_node_cluster",
    "pod_env",
    "real_node",
]
