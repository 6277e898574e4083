"""Containers that keep dying, as the real kubelet handles them, mapped to the exact reason.

A sandbox Pod has ``restartPolicy: Never`` (``sandpod_kube.podspec``: a dead execd is a new
Pod, the reconciler's call), so the kubelet never restarts execd: an execd that exits is
``ExecdExited`` (the container terminated, with its exit code), never ``CrashLoop``. The one
container the kubelet does restart with back-off is a native sidecar (an init container with
``restartPolicy: Always``): the network guard. A guard that cannot start crash-loops for real
-- the kubelet restarts it 10 s, 20 s, 40 s... apart and says ``CrashLoopBackOff`` in the
Pod's ``initContainerStatuses`` -- and that is ``CrashLoop``.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from k8s.cluster import NS, Cluster
from k8s.realnode import RealNode, image
from node.conftest import pod_env
from node.test_real_pod_failures import _cond, _failed_with
from node.test_real_pods import _template
from sandpod.errors import SandboxError
from sandpod_kube import PodApi

# A real node's Pods start in seconds, but the node itself takes ~40 s on first use.
pytestmark = pytest.mark.timeout(400)


async def _raw_pod(cluster: Cluster, name: str) -> dict[str, Any]:
    """The Pod as the API server has it (what the kubelet wrote)."""
    from kubernetes import client

    with cluster.plane.settings.api_client() as api:
        pod = await asyncio.to_thread(client.CoreV1Api(api).read_namespaced_pod, name, NS)
        raw: dict[str, Any] = api.sanitize_for_serialization(pod)
        return raw


async def test_an_execd_that_exits_is_execdexited_and_never_restarted(
    node_cluster: Cluster,
) -> None:
    """execd (PID 1 of its container) is told to stop from inside by the sandbox's own command:
    it exits cleanly, the real kubelet reports the container terminated and does not restart
    it (restartPolicy Never), and the Sandbox is Failed/ExecdExited with the exit code."""
    template = await _template(node_cluster)
    node_cluster.service("sandpod_lifecycle", **pod_env())
    await node_cluster.answering()
    name = f"re-{uuid.uuid4().hex[:8]}"
    sbx = await node_cluster.create(template, name=name)
    try:
        uid = (await _raw_pod(node_cluster, name))["metadata"]["uid"]
        pid1 = await sbx.exec("tr '\\0' ' ' < /proc/1/cmdline")
        assert "-m sandpod_execd" in pid1.stdout, pid1  # execd is the container's PID 1
        await sbx.proc.start(["sh", "-c", "kill -TERM 1"], proc_id="stop-execd")
        failed = await node_cluster.until("Sandbox", name, _failed_with("ExecdExited"), timeout=120)
    finally:
        await sbx.close()
    assert failed is not None and failed.status["phase"] == "Failed"
    assert "terminated: exit code 0 (Completed)" in _cond(failed, "Failed")["message"]
    raw = await _raw_pod(node_cluster, name)
    (cs,) = raw["status"]["containerStatuses"]
    assert raw["metadata"]["uid"] == uid  # the same Pod, not replaced
    assert cs["restartCount"] == 0 and cs["state"].get("terminated"), cs
    assert cs["state"]["terminated"]["reason"] == "Completed"  # SIGTERM: execd's clean exit
    # (phase: the kubelet may still say Running here, with Ready=False/PodCompleted, before it
    # tears the Pod sandbox down: the reason comes from the container, never from the phase)


async def test_a_sidecar_the_kubelet_restarts_with_back_off_is_crashloop(
    node_cluster: Cluster, real_node: RealNode
) -> None:
    """The network guard's image cannot run it (the base image has no Sandpod): the real
    kubelet restarts the sidecar with back-off and reports CrashLoopBackOff; the sandbox
    container never starts; the Sandbox is Failed/CrashLoop naming the guard container and
    its last exit, long before the start deadline, and no second Pod is made."""
    assert real_node.net is not None
    template = await _template(node_cluster)
    node_cluster.service(
        "sandpod_lifecycle",
        **pod_env(),
        SANDPOD_POD_NETGUARD="true",
        SANDPOD_POD_GUARD_IMAGE=image("sandpod-base"),
        SANDPOD_POD_GUARD_DNS=real_node.net.host_ip,
        SANDPOD_POD_START_DEADLINE="600",
    )
    await node_cluster.answering()
    name = f"rc-{uuid.uuid4().hex[:8]}"
    with pytest.raises(SandboxError, match="CrashLoop"):
        await node_cluster.create(template, name=name)
    failed = await node_cluster.store.get("Sandbox", NS, name)
    assert failed.status["phase"] == "Failed", failed.status
    cond = _cond(failed, "Failed")
    assert cond["reason"] == "CrashLoop", cond
    assert "container netguard: CrashLoopBackOff (last exit code" in cond["message"], cond
    pods = PodApi(node_cluster.plane.settings)
    try:
        (pod,) = await pods.list(f"sandpod.dev/sandbox={name}", NS)
    finally:
        await pods.close()
    raw = await _raw_pod(node_cluster, name)
    (guard,) = [c for c in raw["status"]["initContainerStatuses"] if c["name"] == "netguard"]
    assert guard["name"] == "netguard" and guard["restartCount"] >= 1, guard
    (main,) = raw["status"]["containerStatuses"]
    assert not main["state"].get("running"), main  # it never started
    assert pod.uid == raw["metadata"]["uid"]
