"""The control plane's promises on real Pods: a warm pool of Pods and a claim from it, and a
lifecycle leader SIGKILLed while the kubelet is starting Pods (one Pod per Sandbox after).
"""

from __future__ import annotations

import asyncio
import datetime
import time
import uuid

import pytest
from kubernetes import client

from k8s.cluster import LEASE_DURATION, NS, Cluster, ready
from k8s.test_failover import read_lease, until_lease
from node.conftest import pod_env
from node.test_real_pods import _template
from sandpod import AsyncPools, AsyncSandbox
from sandpod_kube import PodApi
from sandpod_kube.podspec import INSTALLATION_LABEL
from sandpod_store import ObjectMeta, Resource

pytestmark = pytest.mark.timeout(500)

SMALL = {"cpu": "100m", "memory": "128Mi"}


async def _pods(cluster: Cluster) -> dict[str, str]:
    """Pod name -> uid of this installation's Pods, as the API server has them."""
    pods = PodApi(cluster.plane.settings)
    try:
        return {
            p.name: p.uid for p in await pods.list(f"{INSTALLATION_LABEL}={cluster.prefix}", NS)
        }
    finally:
        await pods.close()


async def test_a_claim_binds_a_warm_pod_and_the_pool_refills(node_cluster: Cluster) -> None:
    """A pool of two real Pods; a claim binds one of them (WarmPoolBind: no new Pod for the
    claim), execs in it, and the pool makes a new member to stay at two."""
    template = await _template(node_cluster, resources=SMALL)
    node_cluster.service("sandpod_lifecycle", **pod_env())
    node_cluster.service("sandpod_pool", SANDPOD_POOL_RESYNC="1")
    await node_cluster.answering()
    pools = await AsyncPools.connect(nats_url=node_cluster.nats.url, prefix=node_cluster.prefix)
    try:
        await pools.create("warm", template=template, replicas=2)
        async with asyncio.timeout(240):
            while (await pools.get("warm")).ready < 2:
                await asyncio.sleep(0.5)
        warm = await _pods(node_cluster)
        sbx = await AsyncSandbox.claim(
            "warm", wait=60, nats_url=node_cluster.nats.url, prefix=node_cluster.prefix
        )
        try:
            assert sbx.claim_info is not None
            assert sbx.claim_info.bound_reason == "WarmPoolBind", sbx.claim_info
            assert sbx.id in warm  # a Pod that was already running, not a new one
            assert warm[sbx.id] == (await _pods(node_cluster))[sbx.id]
            assert (await sbx.exec("cat /proc/1/cgroup | grep -c kubepods")).exit_code == 0
            async with asyncio.timeout(240):  # refilled: two free members again
                while (await pools.get("warm")).ready < 2:
                    await asyncio.sleep(0.5)
        finally:
            await sbx.kill()
            await sbx.close()
        await pools.delete("warm")
    finally:
        await pools.close()


async def test_a_leader_killed_while_pods_start_leaves_one_pod_per_sandbox(
    node_cluster: Cluster,
) -> None:
    """Two lifecycle replicas; Sandboxes are created, and while the kubelet is still starting
    their Pods the leader is SIGKILLed. The standby takes the Lease and finishes them: every
    Sandbox Ready on exactly one Pod, the one first made for it (same uid), never replaced."""
    template = await _template(node_cluster, resources=SMALL)
    env = {**pod_env(), "SANDPOD_RESYNC": "30"}  # resync: the failover's, not a pass's
    replicas = {r: node_cluster.service("sandpod_lifecycle", r, **env) for r in ("lc-a", "lc-b")}
    await node_cluster.answering()
    lease = await until_lease(node_cluster, lambda s: bool(s.get("holderIdentity")), 30, "held")
    leader = replicas[lease["holderIdentity"]]
    standby = next(p for p in replicas.values() if p is not leader)
    names = [f"rf-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    shutdown = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=10)
    for name in names:
        await node_cluster.store.create(
            Resource(
                api_version="sandpod.dev/v1alpha1",
                kind="Sandbox",
                metadata=ObjectMeta(name=name, namespace=NS),
                spec={
                    "templateRef": {"name": template},
                    "shutdownTime": shutdown.strftime("%Y-%m-%dT%H:%M:%SZ"),
                },
            )
        )
    async with asyncio.timeout(60):  # the leader has made a Pod the kubelet is starting
        while not (first := await _pods(node_cluster)):
            await asyncio.sleep(0.05)
    held = await asyncio.to_thread(read_lease, node_cluster, f"{node_cluster.prefix}-lifecycle")
    assert held["holderIdentity"] == leader.replica
    killed = time.monotonic()
    await asyncio.to_thread(leader.kill)
    await until_lease(
        node_cluster,
        lambda s: s.get("holderIdentity") == standby.replica,
        LEASE_DURATION * 5,
        f"taken by {standby.replica}",
    )
    for name in names:
        await node_cluster.until("Sandbox", name, ready, timeout=240)
    print(f"\nreal node failover: all Ready {time.monotonic() - killed:.1f}s after the SIGKILL")
    after = await _pods(node_cluster)
    assert sorted(after) == sorted(names)  # one Pod each, nothing doubled or lost
    for name, uid in first.items():
        assert after[name] == uid  # the Pod made before the kill was finished, not replaced
    with node_cluster.plane.settings.api_client() as api:
        core = client.CoreV1Api(api)
        for name in names:
            pod = (await asyncio.to_thread(core.read_namespaced_pod, name, NS)).to_dict()
            (cs,) = [c for c in pod["status"]["container_statuses"] if c["name"] == "sandbox"]
            assert cs["restart_count"] == 0 and cs["state"]["running"], cs
