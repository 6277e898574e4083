"""Leader failover in Kubernetes mode: two real lifecycle replicas elect a leader on their Lease
(``<prefix>-lifecycle``); only the leader acts; SIGKILLed in the middle of creating sandboxes,
it is replaced by the standby within about the lease duration, and nothing is lost or doubled.

The services run as processes (tests/svcprocs.py) on the real API server with the fake kubelet
(tests/k8s/kubelet.py), a lease of ``LEASE_DURATION`` seconds (tests/k8s/cluster.py). Every wait
is on a real condition (the Lease's holder, a Sandbox's Ready condition, the kubelet's Pods).
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from k8s.cluster import LEASE_DURATION, NS, Cluster, ready
from sandpod import AsyncPools, AsyncSandbox
from sandpod_contract.pooling import POOL_LABEL
from sandpod_kube import PodApi
from sandpod_kube.podspec import INSTALLATION_LABEL
from sandpod_store import ObjectMeta, Resource
from svcprocs import ServiceProc


def read_lease(cluster: Cluster, name: str) -> dict[str, Any]:
    with cluster.plane.settings.api_client() as api_client:
        try:
            lease = client.CoordinationV1Api(api_client).read_namespaced_lease(name, NS)
        except client.exceptions.ApiException as exc:
            if exc.status == 404:
                return {}
            raise
        return dict(api_client.sanitize_for_serialization(lease)["spec"])


async def until_lease(
    cluster: Cluster,
    done: Callable[[dict[str, Any]], bool],
    timeout: float,
    what: str,
    service: str = "lifecycle",
) -> dict[str, Any]:
    """The service's Lease's spec once ``done(spec)``; polled with a deadline (the services
    write it every retry period)."""
    name = f"{cluster.prefix}-{service}"
    deadline = time.monotonic() + timeout
    while True:
        spec = await asyncio.to_thread(read_lease, cluster, name)
        if done(spec):
            return spec
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.replica}\n{p.tail(20)}" for p in cluster.procs)
            pytest.fail(f"Lease {name}: not {what} within {timeout:g}s; last: {spec}\n{logs}")
        await asyncio.sleep(0.05)


def logged(proc: ServiceProc, event: str) -> list[dict[str, Any]]:
    """The JSON log entries ``event`` of ``proc``."""
    entries = []
    for line in proc.log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("event") == event:
            entries.append(entry)
    return entries


def acted_on(proc: ServiceProc) -> set[str]:
    """Sandboxes this replica reconciled for real (any outcome but ``skipped``), from its log."""
    names = set()
    for line in proc.log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") == "reconcile_done" and entry.get("outcome") != "skipped":
            names.add(str(entry.get("sandbox", "")).partition("/")[2])
    return names


async def until_acted(proc: ServiceProc, names: list[str]) -> None:
    """Until ``proc`` logged a real reconcile of each of ``names`` (its status write comes just
    before the log line, so a Ready Sandbox may be a moment ahead of the log)."""
    deadline = time.monotonic() + 10
    while not set(names) <= acted_on(proc):
        if time.monotonic() > deadline:
            pytest.fail(f"{proc.replica} never reconciled {names}:\n{proc.tail(40)}")
        await asyncio.sleep(0.05)


async def make_sandbox(cluster: Cluster, template: str) -> AsyncSandbox:
    sbx = await AsyncSandbox.create(
        template, timeout=600, nats_url=cluster.nats.url, prefix=cluster.prefix
    )
    assert (await sbx.exec(f"echo {sbx.id}")).stdout == f"{sbx.id}\n"
    return sbx


async def test_a_killed_leader_is_replaced_and_no_sandbox_is_lost_or_doubled(
    cluster: Cluster,
) -> None:
    """Two lifecycle replicas: only the Lease's holder reconciles; SIGKILLed while Pods of new
    Sandboxes are starting, the standby takes the Lease (leaseTransitions + 1), finishes those
    Sandboxes on the Pods already made (one Pod each, owned by its Sandbox), and creates more."""
    template = f"kt-{uuid.uuid4().hex[:6]}"
    await cluster.store.create(
        Resource(
            api_version="sandpod.dev/v1alpha1",
            kind="SandboxTemplate",
            metadata=ObjectMeta(name=template, namespace=NS),
            spec={},
        )
    )
    env = {"SANDPOD_RUNTIME": "kubernetes", "SANDPOD_RESYNC": "30"}  # resync: the failover's
    replicas = {r: cluster.service("sandpod_lifecycle", r, **env) for r in ("lc-a", "lc-b")}
    await cluster.answering()
    lease = await until_lease(cluster, lambda s: bool(s.get("holderIdentity")), 30, "held")
    leader = replicas[lease["holderIdentity"]]
    standby = next(p for p in replicas.values() if p is not leader)

    # 1. Before: sandboxes run, reconciled by the leader alone.
    before = list(await asyncio.gather(*(make_sandbox(cluster, template) for _ in range(2))))
    for sbx in before:
        await sbx.close()
    names = [s.id for s in before]
    await until_acted(leader, names)
    assert acted_on(standby) == set(), standby.tail(40)

    # 2. Mid-work: new Sandboxes whose Pods the kubelet holds un-Ready; the leader is waiting
    #    for them when it dies.
    kubelet = cluster.kubelet
    kubelet.hold()
    mid = [f"kf-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    shutdown = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=10)
    for name in mid:
        await cluster.store.create(
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
    # (the held kubelet handles one Pod at a time: it sees the first, the others queue behind)
    await kubelet.until("a new Sandbox's Pod", lambda: any(n in kubelet.seen for n in mid))
    held = await asyncio.to_thread(read_lease, cluster, f"{cluster.prefix}-lifecycle")
    assert held["holderIdentity"] == leader.replica

    killed = time.monotonic()
    await asyncio.to_thread(leader.kill)
    kubelet.release()
    taken = await until_lease(
        cluster,
        lambda s: s.get("holderIdentity") == standby.replica,
        LEASE_DURATION * 5,
        f"taken by {standby.replica}",
    )
    failover = time.monotonic() - killed
    assert taken["leaseTransitions"] == held["leaseTransitions"] + 1
    for name in mid:
        await cluster.until("Sandbox", name, ready, timeout=60)
    settled = time.monotonic() - killed
    print(
        f"\nfailover: Lease taken {failover:.2f}s after SIGKILL, "
        f"in-flight sandboxes Ready {settled:.2f}s after (lease {LEASE_DURATION}s)"
    )
    await until_acted(standby, mid)

    # 3. After: creates work (the standby, now leader, is the only replica left).
    after = await make_sandbox(cluster, template)
    await after.close()

    # Nothing doubled: one Pod per Sandbox, owned by it, each started once and never replaced.
    every = [*names, *mid, after.id]
    pods = PodApi(cluster.plane.settings)
    try:
        found = await pods.list(f"{INSTALLATION_LABEL}={cluster.prefix}", NS)
    finally:
        await pods.close()
    assert sorted(p.name for p in found) == sorted(every)
    for pod in found:
        sandbox = await cluster.store.get("Sandbox", NS, pod.name)
        assert pod.owner_uid == sandbox.metadata.uid
        assert ready(sandbox)
    started = collections.Counter(kubelet.started)
    assert {n: started[n] for n in every} == dict.fromkeys(every, 1)
    assert not set(every) & set(kubelet.stopped)


async def test_a_stopped_leader_hands_over_at_once(cluster: Cluster) -> None:
    """SIGTERM to the leader (a rolling update): it releases its Lease on the way out, so with
    a 30 s lease the standby leads within a few retry periods, and creates keep working."""
    env = {
        "SANDPOD_RUNTIME": "kubernetes",
        "SANDPOD_LEADER_LEASE_DURATION": "30",
        "SANDPOD_LEADER_RENEW_DEADLINE": "20",
    }
    replicas = {r: cluster.service("sandpod_lifecycle", r, **env) for r in ("lc-a", "lc-b")}
    await cluster.answering()
    lease = await until_lease(cluster, lambda s: bool(s.get("holderIdentity")), 30, "held")
    leader = replicas[lease["holderIdentity"]]
    standby = next(p for p in replicas.values() if p is not leader)
    stopped = time.monotonic()
    await asyncio.to_thread(leader.stop)
    assert leader.proc.returncode == 0, leader.tail(40)
    await until_lease(
        cluster,
        lambda s: s.get("holderIdentity") == standby.replica,
        15,
        f"taken by {standby.replica} well within the 30 s lease",
    )
    print(f"\nhand-over after SIGTERM: {time.monotonic() - stopped:.2f}s (lease 30 s)")
    template = f"kt-{uuid.uuid4().hex[:6]}"
    await cluster.store.create(
        Resource(
            api_version="sandpod.dev/v1alpha1",
            kind="SandboxTemplate",
            metadata=ObjectMeta(name=template, namespace=NS),
            spec={},
        )
    )
    sbx = await make_sandbox(cluster, template)
    await sbx.close()
    await until_acted(standby, [sbx.id])


async def test_a_killed_pool_leader_is_replaced_and_the_pool_is_not_overfilled(
    cluster: Cluster,
) -> None:
    """Two pool replicas: only the holder of ``<prefix>-pool`` creates members; SIGKILLed, the
    standby takes the Lease, resyncs at once and fills the scaled-up pool to exactly its size."""
    cluster.service("sandpod_lifecycle", SANDPOD_RUNTIME="kubernetes", SANDPOD_RESYNC="0.5")
    # The periodic resync (120 s) is not what moves the work: the new leader's resync is.
    env = {"SANDPOD_POOL_RESYNC": "120"}
    replicas = {r: cluster.service("sandpod_pool", r, **env) for r in ("pool-a", "pool-b")}
    await cluster.answering()
    lease = await until_lease(
        cluster, lambda s: bool(s.get("holderIdentity")), 30, "held", service="pool"
    )
    leader = replicas[lease["holderIdentity"]]
    standby = next(p for p in replicas.values() if p is not leader)
    pools = await AsyncPools.connect(nats_url=cluster.nats.url, prefix=cluster.prefix)
    pool = f"kp-{uuid.uuid4().hex[:6]}"

    def available(n: int) -> Callable[[Resource | None], bool]:
        return lambda o: o is not None and o.status.get("availableReplicas") == n

    try:
        await pools.create(pool, replicas=2)
        await cluster.until("SandboxWarmPool", pool, available(2))
        assert logged(leader, "pool_members_created")
        assert logged(standby, "pool_members_created") == []
        killed = time.monotonic()
        await asyncio.to_thread(leader.kill)
        await pools.scale(pool, 3)  # answered by the standby; acted on once it leads
        await until_lease(
            cluster,
            lambda s: s.get("holderIdentity") == standby.replica,
            LEASE_DURATION * 5,
            "taken by the standby",
            service="pool",
        )
        print(f"\npool failover: Lease taken {time.monotonic() - killed:.2f}s after SIGKILL")
        await cluster.until("SandboxWarmPool", pool, available(3))
        members, _ = await cluster.store.list("Sandbox", NS, f"{POOL_LABEL}={pool}")
        assert len(members) == 3 and all(ready(m) for m in members)
        assert logged(standby, "pool_members_created")
    finally:
        await pools.close()
