"""Pod failures produced by the real kubelet and containerd reach the Sandbox as stable reasons.

The fast layer (tests/k8s/test_pod_failures.py) writes into ``pods/status`` what it believes a
kubelet writes; here the kubelet writes it: an image no registry serves, a container the kernel
OOM-kills, an image execd cannot run in, a Pod deleted under a running sandbox.
"""

from __future__ import annotations

import uuid

import pytest

from k8s.cluster import NS, Cluster
from k8s.realnode import image
from node.conftest import pod_env
from node.test_real_pods import _template
from sandpod import AsyncSandbox
from sandpod.errors import SandboxError
from sandpod_kube import PodApi
from sandpod_store import Resource

# A real node's Pods start in seconds, but the node itself takes ~40 s on first use.
pytestmark = pytest.mark.timeout(400)


def _cond(obj: Resource | None, type_: str) -> dict[str, str]:
    conditions = (obj.status.get("conditions") or []) if obj is not None else []
    return next((c for c in conditions if c["type"] == type_), {})


def _failed_with(reason: str):  # type: ignore[no-untyped-def]
    def done(obj: Resource | None) -> bool:
        cond = _cond(obj, "Failed")
        return cond.get("reason") == reason and cond.get("status") == "True"

    return done


async def _started(cluster: Cluster, template: str, name: str) -> AsyncSandbox:
    """The lifecycle started, then sandbox ``name`` of ``template``, Ready."""
    _lifecycle(cluster)
    await cluster.answering()
    return await cluster.create(template, name=name)


def _lifecycle(cluster: Cluster, deadline: int = 300) -> None:
    cluster.service("sandpod_lifecycle", **pod_env(), SANDPOD_POD_START_DEADLINE=str(deadline))


async def test_an_image_no_registry_serves_is_imagepullfailed(node_cluster: Cluster) -> None:
    """The kubelet's ErrImagePull / ImagePullBackOff: Pending with the reason while it retries,
    then Failed/ImagePullFailed at the start deadline, naming the image."""
    missing = "sandpod.local/no-such-image:0.1.0"
    template = await _template(node_cluster, image=missing)
    _lifecycle(node_cluster, deadline=20)
    await node_cluster.answering()
    name = f"ri-{uuid.uuid4().hex[:8]}"
    with pytest.raises(SandboxError, match="ImagePullFailed"):
        await node_cluster.create(template, name=name, wait=120)
    failed = await node_cluster.until("Sandbox", name, _failed_with("ImagePullFailed"))
    assert failed is not None and failed.status["phase"] == "Failed"
    assert missing in _cond(failed, "Failed")["message"]


async def test_a_container_the_kernel_oom_kills_is_oomkilled(node_cluster: Cluster) -> None:
    """Memory the sandbox fills in /dev/shm is charged to its cgroup but belongs to no process:
    at the limit the kernel kills the largest process, execd, and containerd reports the OOM.
    The Sandbox becomes Failed/OOMKilled (exit code 137), its Pod not replaced."""
    template = await _template(node_cluster, resources={"memory": "72Mi"})
    name = f"ro-{uuid.uuid4().hex[:8]}"
    sbx = await _started(node_cluster, template, name)
    try:
        assert (await sbx.exec("echo up")).stdout == "up\n"
        with pytest.raises(SandboxError):  # execd dies under the command
            await sbx.exec("dd if=/dev/zero of=/dev/shm/fill bs=1M count=63; sleep 30", timeout=60)
        failed = await node_cluster.until("Sandbox", name, _failed_with("OOMKilled"), timeout=90)
    finally:
        await sbx.close()
    assert failed is not None and failed.status["phase"] == "Failed"
    assert "137" in _cond(failed, "Failed")["message"]


async def test_an_image_execd_cannot_run_in_fails_the_sandbox_at_once(
    node_cluster: Cluster,
) -> None:
    """An image without a libc (the NATS image: one static binary) cannot start the bundle's
    interpreter: runc fails the container start, the kubelet says so, and the Sandbox is Failed
    at once with the kubelet's words, no second Pod."""
    template = await _template(node_cluster, image=image("sandpod-nats"))
    _lifecycle(node_cluster)
    await node_cluster.answering()
    name = f"rx-{uuid.uuid4().hex[:8]}"
    with pytest.raises(SandboxError) as info:
        await node_cluster.create(template, name=name)
    failed = await node_cluster.store.get("Sandbox", NS, name)
    assert failed.status["phase"] == "Failed", failed.status
    reason = _cond(failed, "Failed")["reason"]
    # restartPolicy Never: the kubelet never restarts it, so never CrashLoop (that is a
    # restarted container's: tests/node/test_real_crash_loops.py)
    assert reason == "ExecdExited", failed.status
    assert reason in info.value.message


async def test_a_pod_deleted_under_a_running_sandbox_is_poddeleted(node_cluster: Cluster) -> None:
    """kubectl delete pod on a running sandbox: the kubelet stops the container and the Sandbox
    is Failed/PodDeleted rather than quietly restarted with an empty workspace."""
    template = await _template(node_cluster)
    name = f"rd-{uuid.uuid4().hex[:8]}"
    sbx = await _started(node_cluster, template, name)
    try:
        pods = PodApi(node_cluster.plane.settings)
        try:
            await pods.delete(NS, name, 0)
        finally:
            await pods.close()
        failed = await node_cluster.until("Sandbox", name, _failed_with("PodDeleted"))
    finally:
        await sbx.close()
    assert failed is not None and failed.status["phase"] == "Failed"
