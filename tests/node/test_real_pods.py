"""Sandboxes as real Pods on a real node: kubelet, containerd, runc, CNI (tests/k8s/realnode.py).

The lifecycle runs as a host process against the node's API server (the Helm chart's own
installation is tests/node/test_helm_real.py); each Sandbox becomes a Pod the real kubelet starts
from the project's own images, and everything the test checks is observed from inside the
container or through the kubelet's own reports, never from a rendition of them.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from conftest import SESSION_DAEMON_PIDS
from k8s.cluster import NS, Cluster
from k8s.realnode import RealNode
from node.conftest import pod_env
from sandpod import AsyncSandbox
from sandpod_store import ObjectMeta, Resource

# A real node's Pods start in seconds, but the node itself takes ~40 s on first use.
pytestmark = pytest.mark.timeout(400)

STATUS = "grep -E '^(Uid|CapEff|CapBnd|CapPrm|Seccomp|NoNewPrivs):' /proc/self/status"


async def _template(cluster: Cluster, **spec: object) -> str:
    name = f"rt-{uuid.uuid4().hex[:6]}"
    await cluster.store.create(
        Resource(
            api_version="sandpod.dev/v1alpha1",
            kind="SandboxTemplate",
            metadata=ObjectMeta(name=name, namespace=NS),
            spec=dict(spec),
        )
    )
    return name


ATTACKS = {
    "mount": "mount -t tmpfs none /mnt",
    "raw socket": "python3 -c 'import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW)'",
    "chroot": "chroot / true",
    "setuid": "cp /bin/sh /tmp/sh && chmod u+s /tmp/sh && /tmp/sh -p -c 'id -u'",
}


async def attacks_fail(sbx: AsyncSandbox, uid: str, *, userns: bool) -> None:
    """What the hardening stops fails from inside; a setuid-root copy of sh stays ``uid``
    (``userns``: an unprivileged user namespace is refused too, as RuntimeDefault does)."""
    userns_attack = {"userns": "unshare --user --map-root-user true"} if userns else {}
    for what, command in {**ATTACKS, **userns_attack}.items():
        r = await sbx.exec(command)
        if what == "setuid":
            assert r.stdout.strip() == uid, (what, r)
        else:
            assert r.exit_code != 0, (what, r)


async def _running(cluster: Cluster, template: str) -> AsyncSandbox:
    cluster.service("sandpod_lifecycle", **pod_env())
    await cluster.answering()
    return await cluster.create(template)


async def test_the_pods_hardening_holds_from_inside_the_container(node_cluster: Cluster) -> None:
    """The securityContext the Pod asks for is what runc enforced: no root, no capability, the
    RuntimeDefault seccomp filter, no new privileges, no ServiceAccount token; and the attacks
    those stop fail from inside (mount, a user namespace, raw sockets, setuid root)."""
    sbx = await _running(node_cluster, await _template(node_cluster))
    try:
        status = dict(line.split(":\t", 1) for line in (await sbx.exec(STATUS)).stdout.splitlines())
        assert status["Uid"].split()[0] != "0"
        assert int(status["CapEff"], 16) == int(status["CapPrm"], 16) == 0
        assert int(status["CapBnd"], 16) == 0
        assert status["Seccomp"].strip() == "2"  # filter mode: runc loaded RuntimeDefault
        assert status["NoNewPrivs"].strip() == "1"
        where = await sbx.exec("cat /proc/1/cgroup; ls /var/run/secrets/kubernetes.io 2>&1")
        assert "kubepods" in where.stdout  # a container of the kubelet's, not a host process
        assert "No such file or directory" in where.stdout
        await attacks_fail(sbx, status["Uid"].split()[0], userns=True)
    finally:
        await sbx.kill()
        await sbx.close()


async def test_exec_streams_files_and_a_pty_reach_the_container_over_nats(
    node_cluster: Cluster,
) -> None:
    """execd in the container serves the whole exec model: byte-exact streams, the file API,
    background processes and a PTY, straight over NATS from the SDK."""
    sbx = await _running(node_cluster, await _template(node_cluster))
    try:
        payload = bytes(range(256)) * 4096  # 1 MiB, every byte value
        await sbx.fs.write("/workspace/blob", payload)
        assert await sbx.fs.read("/workspace/blob") == payload
        r = await sbx.exec("sha256sum /workspace/blob | cut -d' ' -f1")
        import hashlib

        assert r.stdout.strip() == hashlib.sha256(payload).hexdigest()
        async with sbx.exec_stream(["sh", "-c", "seq 1 20000"]) as stream:
            out = b"".join([c.data async for c in stream])
        assert out == "".join(f"{i}\n" for i in range(1, 20001)).encode()
        proc = await sbx.proc.start("sleep 0.2; echo bg > /workspace/bg", proc_id="bg")
        try:
            await proc.wait(timeout=30)
        finally:
            await proc.remove()
        assert await sbx.fs.read("/workspace/bg") == b"bg\n"
        term = await sbx.pty.open(["sh", "-c", "tty > /workspace/tty; stty size >> /workspace/tty"])
        async with term:
            await term.wait()
        lines = (await sbx.fs.read("/workspace/tty")).decode().splitlines()
        assert lines[0].startswith("/dev/pts/"), lines
    finally:
        await sbx.kill()
        await sbx.close()


async def test_a_deleted_sandbox_leaves_no_pod_and_its_ttl_is_kept(node_cluster: Cluster) -> None:
    """A Sandbox with a TTL is gone with its Pod when the TTL ends; the kubelet really stopped
    the container (the Pod object is gone only once the kubelet confirmed)."""
    template = await _template(node_cluster)
    node_cluster.service("sandpod_lifecycle", **pod_env())
    await node_cluster.answering()
    sbx = await node_cluster.create(template, timeout=20)
    name = sbx.id
    await sbx.close()
    await node_cluster.until("Sandbox", name, lambda o: o is None, timeout=120)
    from sandpod_kube import PodApi

    pods = PodApi(node_cluster.plane.settings)
    try:
        async with asyncio.timeout(60):
            while await pods.list(f"sandpod.dev/sandbox={name}", NS):
                await asyncio.sleep(0.2)
    finally:
        await pods.close()


async def test_a_kubelet_restart_does_not_lose_a_sandbox(
    node_cluster: Cluster, real_node: RealNode
) -> None:
    """The kubelet is restarted under a running sandbox (an upgrade, a crash): the container is
    containerd's and keeps running, the restarted kubelet adopts it (same Pod, same container,
    no restart), the Sandbox stays Ready with its files, and new sandboxes still start."""
    template = await _template(node_cluster)
    sbx = await _running(node_cluster, template)
    try:
        await sbx.fs.write("/workspace/kept", b"across the restart")
        before = await _container(node_cluster, sbx.id)
        await asyncio.to_thread(real_node.restart_kubelet)
        SESSION_DAEMON_PIDS.update(real_node.pids())
        assert await sbx.fs.read("/workspace/kept") == b"across the restart"
        after = await _container(node_cluster, sbx.id)
        assert after[:2] == before[:2], (before, after)  # same Pod uid, same container
        assert after[3] == 0  # never restarted
        sandbox = await node_cluster.store.get("Sandbox", NS, sbx.id)
        assert sandbox.status["phase"] == "Running"
        second = await node_cluster.create(template)
        assert (await second.exec("echo fresh")).stdout == "fresh\n"
        await second.kill()
        await second.close()
    finally:
        await sbx.kill()
        await sbx.close()


async def _container(cluster: Cluster, name: str) -> tuple[str, str, str, int]:
    """(Pod uid, sandbox container id, its state, restart count) as the API server has them."""
    from kubernetes import client

    with cluster.plane.settings.api_client() as api:
        pod = await asyncio.to_thread(client.CoreV1Api(api).read_namespaced_pod, name, NS)
    raw = pod.to_dict()
    (cs,) = [c for c in raw["status"]["container_statuses"] if c["name"] == "sandbox"]
    state = next(k for k, v in (cs["state"] or {}).items() if v)
    return raw["metadata"]["uid"], cs["container_id"], state, cs["restart_count"]


async def test_small_sandboxes_pack_a_node_as_their_template_says(
    node_cluster: Cluster, real_node: RealNode
) -> None:
    """The real scheduler counts a Pod as max(init container, containers): the execd-install
    init container must not make every sandbox ask for half a core. Ten sandboxes of 100m fit
    where four did (2 cores; scheduled = not Unschedulable). Memory is not what is packed: at
    128Mi one execd was once killed (137, reason Error) on a host at load 25, cause not found."""
    template = await _template(node_cluster, resources={"cpu": "100m", "memory": "256Mi"})
    node_cluster.service("sandpod_lifecycle", **pod_env())
    await node_cluster.answering()
    boxes = await asyncio.gather(*(node_cluster.create(template) for _ in range(10)))
    try:
        outs = await asyncio.gather(*(b.exec("echo ok") for b in boxes))
        assert [o.stdout for o in outs] == ["ok\n"] * 10
    finally:
        for b in boxes:
            await b.kill()
            await b.close()
