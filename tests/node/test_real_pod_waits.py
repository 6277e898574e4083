"""Pods the real scheduler or kubelet will not start, and an execd that cannot reach NATS.

The fast layer's test kubelet writes ``Unschedulable`` (the scheduler's words), a Pod Ready
whose execd is silent, and (in its words) fails at once on a missing Secret; here the real
kube-scheduler, kubelet and container say it: a Pod asking for more CPU than the node has,
a Pod whose env names a Secret that does not exist (the kubelet keeps it
``CreateContainerConfigError`` and retries), and a container whose execd finds no NATS at the
URL its Secret gives.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from kubernetes import client

from k8s.cluster import NS, Cluster
from k8s.realnode import RealNode
from node.conftest import pod_env
from node.test_real_pod_failures import _cond
from node.test_real_pods import _template
from sandpod.errors import SandboxError
from sandpod_kube import PodApi
from sandpod_store import Resource

# A real node's Pods start in seconds, but the node itself takes ~40 s on first use.
pytestmark = pytest.mark.timeout(400)

DEADLINE = 45  # SANDPOD_POD_START_DEADLINE: longer than the kubelet takes to say why, loaded


def _reason_is(type_: str, reason: str, status: str = "False"):  # type: ignore[no-untyped-def]
    def done(obj: Resource | None) -> bool:
        cond = _cond(obj, type_)
        return cond.get("reason") == reason and cond.get("status") == status

    return done


async def _pod_uids(cluster: Cluster, name: str) -> set[str]:
    pods = PodApi(cluster.plane.settings)
    try:
        return {p.uid for p in await pods.list(f"sandpod.dev/sandbox={name}", NS)}
    finally:
        await pods.close()


async def _waits_then_fails(cluster: Cluster, template: str, reason: str) -> tuple[str, str]:
    """Create a sandbox of ``template``: Pending with Ready=False/``reason`` while its one Pod
    is kept, then Failed/``reason`` at the start deadline; (Ready's message, Failed's)."""
    name = f"rw-{uuid.uuid4().hex[:8]}"
    seen: set[str] = set()
    async with asyncio.TaskGroup() as tg:
        creating = tg.create_task(_create_fails(cluster, template, name, reason))
        waiting = await cluster.until("Sandbox", name, _reason_is("Ready", reason), timeout=90)
        assert waiting is not None and waiting.status["phase"] == "Pending", waiting
        seen |= await _pod_uids(cluster, name)
        failed = await cluster.until(
            "Sandbox", name, _reason_is("Failed", reason, "True"), timeout=120
        )
        seen |= await _pod_uids(cluster, name)
    assert reason in creating.result().message  # the SDK's create says why
    assert failed is not None and failed.status["phase"] == "Failed"
    message = _cond(failed, "Failed")["message"]
    assert f"deadline {DEADLINE}s" in message
    assert len(seen) == 1, seen  # one Pod, waited for: no create/delete storm
    return _cond(waiting, "Ready")["message"], message


async def _create_fails(cluster: Cluster, template: str, name: str, reason: str) -> SandboxError:
    with pytest.raises(SandboxError, match=reason) as info:
        await cluster.create(template, name=name)
    return info.value


async def test_a_pod_no_node_fits_is_unschedulable_until_the_deadline(
    node_cluster: Cluster,
) -> None:
    """A template asking for 64 CPUs: the real kube-scheduler leaves the Pod Pending with
    PodScheduled=False/Unschedulable and says why (Insufficient cpu); the Sandbox waits with
    that reason, then fails with it at the start deadline."""
    template = await _template(node_cluster, resources={"cpu": "64", "memory": "128Mi"})
    node_cluster.service("sandpod_lifecycle", **pod_env(), SANDPOD_POD_START_DEADLINE=str(DEADLINE))
    await node_cluster.answering()
    waiting, failed = await _waits_then_fails(node_cluster, template, "Unschedulable")
    assert "Insufficient cpu" in waiting and "Insufficient cpu" in failed, (waiting, failed)


async def test_a_pod_whose_secret_is_missing_is_containerconfigerror_until_the_deadline(
    node_cluster: Cluster,
) -> None:
    """The Pod's env names a Secret that does not exist (here the NATS URL Secret): the real
    kubelet keeps the container in CreateContainerConfigError, naming the Secret, and retries;
    the Sandbox waits with ContainerConfigError, then fails with it at the start deadline."""
    missing = f"absent-{uuid.uuid4().hex[:6]}"
    template = await _template(node_cluster)
    node_cluster.service(
        "sandpod_lifecycle",
        **pod_env(),
        SANDPOD_POD_START_DEADLINE=str(DEADLINE),
        SANDPOD_POD_NATS_SECRET=missing,
    )
    await node_cluster.answering()
    waiting, failed = await _waits_then_fails(node_cluster, template, "ContainerConfigError")
    assert f'secret "{missing}" not found' in waiting and missing in failed, (waiting, failed)


async def test_an_execd_that_finds_no_nats_is_execdexited_with_its_words(
    node_cluster: Cluster, real_node: RealNode
) -> None:
    """The NATS URL Secret names a port nobody listens on (the node's link, port 1): the
    container starts (the Pod is Ready a moment) but execd never answers; it gives up after its
    connect timeout and exits, the kubelet keeps what it last logged as the termination
    message, and the Sandbox is Failed/ExecdExited saying so -- not left Pending forever."""
    assert real_node.net is not None
    secret = f"nowhere-{uuid.uuid4().hex[:6]}"
    body = client.V1Secret(
        metadata=client.V1ObjectMeta(name=secret),
        string_data={"url": f"nats://{real_node.net.host_ip}:1"},
    )
    with node_cluster.plane.settings.api_client() as api:
        await asyncio.to_thread(client.CoreV1Api(api).create_namespaced_secret, NS, body)
    try:
        template = await _template(node_cluster)
        node_cluster.service("sandpod_lifecycle", **pod_env(), SANDPOD_POD_NATS_SECRET=secret)
        await node_cluster.answering()
        name = f"rn-{uuid.uuid4().hex[:8]}"
        error = await _create_fails(node_cluster, template, name, "ExecdExited")
        failed = await node_cluster.store.get("Sandbox", NS, name)
        assert failed.status["phase"] == "Failed"
        message = _cond(failed, "Failed")["message"]
        assert "exit code" in message and str(real_node.net.host_ip) in message, message
        assert "ExecdExited" in error.message
        assert len(await _pod_uids(node_cluster, name)) <= 1
    finally:
        with node_cluster.plane.settings.api_client() as api:
            await asyncio.to_thread(client.CoreV1Api(api).delete_namespaced_secret, secret, NS)
