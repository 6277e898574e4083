"""The Kubernetes mode end to end, without a kubelet: lifecycle and pool services on the CRDs of a
real kube-apiserver, the ``kubernetes`` runtime making a Pod per Sandbox, and a fake kubelet
(tests/k8s/kubelet.py) running each Pod's execd locally against the test NATS.

The objects live in the ``default`` namespace (the SDK creates there); each test has its own
subject prefix, its services are scoped to the namespace, and everything is deleted at the end.
"""

from __future__ import annotations

import asyncio
import uuid

from kubernetes import client

from conftest import SESSION_DAEMON_PIDS
from k8s.cluster import NS, Cluster, ready
from sandpod import AsyncPools, AsyncSandbox
from sandpod_contract.pooling import POOL_LABEL
from sandpod_kube import KubeSettings
from sandpod_store import ObjectMeta, Resource
from svcprocs import ServiceProc


async def test_a_sandbox_runs_in_its_own_hardened_pod_until_its_lifetime_ends(
    cluster: Cluster,
) -> None:
    """A Sandbox created with the SDK gets a hardened Pod owned by it; it stays Pending until the
    Pod is Ready and execd answers, then runs commands; at its TTL the Pod is deleted."""
    template, name = f"kt-{uuid.uuid4().hex[:6]}", f"ks-{uuid.uuid4().hex[:8]}"
    await cluster.store.create(
        Resource(
            api_version="sandpod.dev/v1alpha1",
            kind="SandboxTemplate",
            metadata=ObjectMeta(name=template, namespace=NS),
            spec={
                "image": "python:3.12-slim",
                "runtimeClassName": "gvisor",
                "resources": {"cpu": "500m", "memory": "256Mi", "disk": "1Gi"},
                "env": [{"name": "GREETING", "value": "hello-from-the-template"}],
                "network": {"egress": ["10.1.0.0/16", "203.0.113.7:443", "example.org:443"]},
            },
        )
    )
    kubelet = cluster.kubelet
    kubelet.hold()  # the Pod will exist but not be Ready until released
    cluster.service(
        "sandpod_lifecycle",
        SANDPOD_RUNTIME="kubernetes",
        SANDPOD_RESYNC="0.5",
        SANDPOD_READY_TIMEOUT="30",
        SANDPOD_POD_NATS_NAMESPACE="nats-system",
        SANDPOD_POD_NATS_CIDRS="127.0.0.1/32",
    )
    await cluster.answering()
    async with asyncio.TaskGroup() as tg:
        creating = tg.create_task(
            AsyncSandbox.create(
                template,
                name=name,
                timeout=15,
                nats_url=cluster.nats.url,
                prefix=cluster.prefix,
            )
        )
        await kubelet.until("the Pod", lambda: name in kubelet.seen)
        pending = await cluster.store.get("Sandbox", NS, name)
        assert pending.status.get("phase") == "Pending" and not ready(pending)
        kubelet.release()
    sbx = creating.result()
    try:
        pod = kubelet.seen[name]
        sandbox = await cluster.store.get("Sandbox", NS, name)
        assert sandbox.status["phase"] == "Running" and ready(sandbox)
        isolated = {c["type"]: c for c in sandbox.status["conditions"]}["Isolated"]
        # No account seed here: every Pod shares the URL Secret, and the Sandbox says so.
        assert (isolated["status"], isolated["reason"]) == ("False", "Degraded")
        assert isolated["message"] == (
            "nats-credentials: shared by every sandbox Pod (set SANDPOD_NATS_ACCOUNT_SEED_FILE)"
        )
        owner = pod["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
            "Sandbox",
            name,
            sandbox.metadata.uid,
            True,
        )
        spec = pod["spec"]
        assert spec["runtimeClassName"] == "gvisor"
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["runAsNonRoot"] is True
        main, init = spec["containers"][0], spec["initContainers"][0]
        assert main["image"] == "python:3.12-slim"
        assert main["command"] == ["/opt/sandpod/python/bin/python3", "-m", "sandpod_execd"]
        assert init["command"] == ["cp", "-a", "/sandpod-bundle/.", "/opt/sandpod/"]
        assert main["resources"]["limits"] == {
            "cpu": "500m",
            "memory": "256Mi",
            "ephemeral-storage": "1Gi",
        }
        for c in (main, init):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["runAsNonRoot"] is True
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert sc["seccompProfile"]["type"] == "RuntimeDefault"
        nats_env = next(e for e in main["env"] if e["name"] == "SANDPOD_NATS_URL")
        assert nats_env["valueFrom"]["secretKeyRef"] == {"name": "sandpod-nats", "key": "url"}
        assert {"name": "sandpod", "mountPath": "/opt/sandpod"} in init["volumeMounts"]
        r = await sbx.exec("echo $GREETING")
        assert r.exit_code == 0 and r.stdout == "hello-from-the-template\n"
        await _check_network_policy(cluster.plane.settings, template)
        # TTL: the reconciler deletes the Pod (no garbage collector here), then the Sandbox.
        await kubelet.until("the Pod deleted", lambda: name in kubelet.stopped, timeout=60)
        await cluster.until("Sandbox", name, lambda o: o is None)
        assert kubelet.started == [name]
    finally:
        await sbx.close()


async def _check_network_policy(settings: KubeSettings, template: str) -> None:
    with settings.api_client() as api_client:
        policy = await asyncio.to_thread(
            client.NetworkingV1Api(api_client).read_namespaced_network_policy,
            f"sandpod-template-{template}",
            NS,
        )
    spec = policy.spec
    assert spec is not None and spec.pod_selector is not None and spec.egress
    assert spec.pod_selector.match_labels == {"sandpod.dev/template": template}
    assert spec.policy_types == ["Ingress", "Egress"] and not spec.ingress
    assert spec.egress[0].to
    nats = spec.egress[0].to[0]
    assert nats.namespace_selector is not None and nats.pod_selector is not None
    assert nats.namespace_selector.match_labels == {"kubernetes.io/metadata.name": "nats-system"}
    assert nats.pod_selector.match_labels == {"app.kubernetes.io/name": "nats"}
    rules = [
        (
            [p.ip_block.cidr for p in r.to or [] if p.ip_block],
            [(p.protocol, p.port) for p in r.ports or []],
        )
        for r in spec.egress
    ]
    assert rules == [
        (["127.0.0.1/32"], [("TCP", 4222)]),  # NATS, always: its pods, and its address
        ([], [("UDP", 53), ("TCP", 53)]),  # DNS, since the template allows egress
        (["10.1.0.0/16"], []),
        (["203.0.113.7/32"], [("TCP", 443)]),
    ]  # example.org:443 is a host name: not expressible, logged by the lifecycle


async def test_a_warm_pool_on_kubernetes_keeps_real_sandboxes_with_pods_and_a_claim_binds_one(
    cluster: Cluster,
) -> None:
    """The pool service on the CRDs fills a pool with Sandbox objects whose Pods run execd, and a
    claim binds one of those members (warm), whose commands see the claim's env."""
    cluster.service("sandpod_lifecycle", SANDPOD_RUNTIME="kubernetes", SANDPOD_RESYNC="0.5")
    cluster.service("sandpod_pool", SANDPOD_POOL_RESYNC="0.3")
    await cluster.answering()
    pools = await AsyncPools.connect(nats_url=cluster.nats.url, prefix=cluster.prefix)
    pool = f"kp-{uuid.uuid4().hex[:6]}"
    try:
        await pools.create(pool, replicas=2)
        await cluster.until(
            "SandboxWarmPool",
            pool,
            lambda o: o is not None and o.status.get("availableReplicas") == 2,
        )
        members, _ = await cluster.store.list("Sandbox", NS, f"{POOL_LABEL}={pool}")
        names = {m.metadata.name for m in members}
        assert len(names) == 2 and all(ready(m) for m in members)
        assert names <= set(cluster.kubelet.started)  # each member is a Pod running execd
        sbx = await AsyncSandbox.claim(
            pool,
            env={"AGENT": "a-17"},
            timeout=600,
            nats_url=cluster.nats.url,
            prefix=cluster.prefix,
        )
        try:
            assert sbx.claim_info is not None and sbx.claim_info.warm
            assert sbx.claim_info.bound_reason == "WarmPoolBind" and sbx.id in names
            # The claim's status is written just after the reply (in the background).
            await cluster.until(
                "SandboxClaim",
                sbx.claim_info.name,
                lambda o: o is not None and o.status.get("sandbox") == sbx.id,
            )
            r = await sbx.exec("echo $AGENT")
            assert r.stdout == "a-17\n"
        finally:
            await sbx.close()
    finally:
        await pools.close()


async def test_a_ready_pod_whose_execd_does_not_answer_leaves_the_sandbox_pending(
    cluster: Cluster,
) -> None:
    """A Sandbox applied straight to the API server (as kubectl would) is not Ready while its Pod
    is Ready but execd is silent; its Pod is replaced, and once execd answers it is Ready."""
    kubelet = cluster.kubelet
    kubelet.run_execd = False
    cluster.service(
        "sandpod_lifecycle",
        SANDPOD_RUNTIME="kubernetes",
        SANDPOD_RESYNC="0.5",
        SANDPOD_READY_TIMEOUT="8",
    )
    name = f"ks-{uuid.uuid4().hex[:8]}"
    await cluster.store.create(
        Resource(
            api_version="sandpod.dev/v1alpha1",
            kind="Sandbox",
            metadata=ObjectMeta(name=name, namespace=NS),
            spec={"shutdownTime": "2099-01-01T00:00:00Z"},
        )
    )

    def silent(obj: Resource | None) -> bool:
        conditions = (obj.status.get("conditions") or []) if obj is not None else []
        return any(
            (c["type"], c["status"]) == ("Ready", "False")
            and "execd did not answer" in c.get("message", "")
            for c in conditions
        )

    stuck = await cluster.until("Sandbox", name, silent)
    assert stuck is not None and stuck.status["phase"] == "Pending"
    assert name not in kubelet.execds  # the Pod was Ready; only execd was missing
    kubelet.run_execd = True
    await cluster.until("Sandbox", name, ready)
    assert kubelet.started == [name]
    async with await AsyncSandbox.connect(
        name, nats_url=cluster.nats.url, prefix=cluster.prefix
    ) as sbx:
        assert (await sbx.exec("echo up")).stdout == "up\n"


async def test_a_restarted_lifecycle_adopts_running_pods_and_a_kill_deletes_the_pod(
    cluster: Cluster,
) -> None:
    """State lives on the API server: a new lifecycle process adopts the running Pod (no second
    execd), and killing the sandbox through the SDK deletes its Pod and then the Sandbox."""
    lifecycle = cluster.service(
        "sandpod_lifecycle", SANDPOD_RUNTIME="kubernetes", SANDPOD_RESYNC="0.5"
    )
    await cluster.answering()
    sbx = await AsyncSandbox.create(timeout=600, nats_url=cluster.nats.url, prefix=cluster.prefix)
    try:
        before = await cluster.store.get("Sandbox", NS, sbx.id)
        lifecycle.restart()
        await cluster.answering()
        assert (await sbx.exec("echo still-here")).stdout == "still-here\n"
        # A full resync of the new replica has passed once it has renewed the sandbox's lease:
        # wait for a status write of its own, or a resync period's worth of reconciles.
        await asyncio.wait_for(_resynced(lifecycle), 30)
        after = await cluster.store.get("Sandbox", NS, sbx.id)
        assert after.status["phase"] == "Running" and ready(after)
        assert after.metadata.uid == before.metadata.uid
        assert cluster.kubelet.started == [sbx.id]  # adopted: the Pod was never re-created
        await sbx.kill()
        await cluster.kubelet.until("the Pod deleted", lambda: sbx.id in cluster.kubelet.stopped)
        await cluster.until("Sandbox", sbx.id, lambda o: o is None)
    finally:
        await sbx.close()


async def _resynced(proc: ServiceProc) -> None:
    """Until the replica's log shows a reconcile pass finished after its start."""
    while '"reconcile_done"' not in proc.log.read_text().split('"lifecycle_ready"')[-1]:
        await asyncio.sleep(0.1)


async def test_the_lifecycle_keeps_working_across_an_api_server_crash(cluster: Cluster) -> None:
    """After kube-apiserver is stopped and restarted, the running sandbox still answers and a new
    Sandbox becomes Ready in its Pod: the reconciler's watch re-lists and carries on."""
    cluster.service("sandpod_lifecycle", SANDPOD_RUNTIME="kubernetes", SANDPOD_RESYNC="0.5")
    await cluster.answering()
    first = await AsyncSandbox.create(timeout=600, nats_url=cluster.nats.url, prefix=cluster.prefix)
    try:
        await asyncio.to_thread(cluster.plane.restart_apiserver)
        SESSION_DAEMON_PIDS.add(cluster.plane.procs[-1].pid)  # the session's, not a leak
        second = await AsyncSandbox.create(
            timeout=600, nats_url=cluster.nats.url, prefix=cluster.prefix
        )
        try:
            assert (await second.exec("echo after")).stdout == "after\n"
            assert (await first.exec("echo before")).stdout == "before\n"
            assert cluster.kubelet.started == [first.id, second.id]
        finally:
            await second.close()
    finally:
        await first.close()
