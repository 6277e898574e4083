"""What a sandbox Pod reports reaches its Sandbox as a stable reason, on the real API server.

The fake kubelet (tests/k8s/kubelet.py) writes into ``pods/status`` what a scheduler or kubelet
writes when a Pod cannot start or dies. Transient problems (Unschedulable, ImagePullBackOff) keep
the one Pod and show ``Ready=False`` with the reason until the start deadline, then ``Failed``
with the same reason; terminal ones (CrashLoopBackOff, an exit code, OOMKilled, a deleted Pod)
fail the Sandbox at once and never start a second Pod.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from k8s.cluster import NS, Cluster, ready
from k8s.test_printer_columns import get_table
from sandpod import AsyncSandbox
from sandpod.errors import SandboxError
from sandpod_kube import PodApi
from sandpod_store import Resource


def _cond(obj: Resource | None, type_: str) -> dict[str, str]:
    conditions = (obj.status.get("conditions") or []) if obj is not None else []
    return next((c for c in conditions if c["type"] == type_), {})


def _reason_is(type_: str, reason: str, status: str = "False"):  # type: ignore[no-untyped-def]
    def done(obj: Resource | None) -> bool:
        cond = _cond(obj, type_)
        return cond.get("reason") == reason and cond.get("status") == status

    return done


def _lifecycle(cluster: Cluster, deadline: int = 300) -> None:
    cluster.service(
        "sandpod_lifecycle",
        SANDPOD_RUNTIME="kubernetes",
        SANDPOD_RESYNC="0.5",
        SANDPOD_READY_TIMEOUT="20",
        SANDPOD_POD_START_DEADLINE=str(deadline),
    )


async def _create_fails(cluster: Cluster, name: str, reason: str) -> SandboxError:
    """Create ``name`` with the SDK, which must fail naming ``reason``; the error."""
    with pytest.raises(SandboxError, match=reason) as info:
        await AsyncSandbox.create(
            name=name, wait=60, nats_url=cluster.nats.url, prefix=cluster.prefix
        )
    return info.value


async def _reason_column(cluster: Cluster, name: str) -> str:
    path = f"/apis/sandpod.dev/v1alpha1/namespaces/{NS}/sandboxes/{name}"
    table = await asyncio.to_thread(get_table, cluster.plane, path)
    columns = [c["name"] for c in table["columnDefinitions"]]
    (row,) = table["rows"]
    return str(row["cells"][columns.index("Reason")])


@pytest.mark.parametrize(
    ("fault", "reason", "says"),
    [
        ("unschedulable", "Unschedulable", "Insufficient memory"),
        ("image_pull", "ImagePullFailed", "image debian:bookworm-slim"),
    ],
)
async def test_a_transient_pod_problem_waits_with_the_reason_then_fails_at_the_deadline(
    cluster: Cluster, fault: str, reason: str, says: str
) -> None:
    """An unschedulable Pod (or one whose image cannot be pulled) leaves the Sandbox Pending with
    Ready=False, the reason and the Pod's message (also in the Reason printer column); the one
    Pod is kept (no re-create) until the start deadline, then the Sandbox is Failed with the
    same reason and the Pod is deleted."""
    cluster.kubelet.fault = fault
    _lifecycle(cluster, deadline=6)
    await cluster.answering()
    name = f"kf-{uuid.uuid4().hex[:8]}"
    async with asyncio.TaskGroup() as tg:
        creating = tg.create_task(_create_fails(cluster, name, reason))
        waiting = await cluster.until("Sandbox", name, _reason_is("Ready", reason))
        assert waiting is not None and waiting.status["phase"] == "Pending"
        assert says in _cond(waiting, "Ready")["message"]
        assert await _reason_column(cluster, name) == reason
        failed = await cluster.until("Sandbox", name, _reason_is("Failed", reason, "True"))
    assert reason in creating.result().message  # the SDK's create says why
    assert failed is not None and failed.status["phase"] == "Failed"
    assert "deadline 6s" in _cond(failed, "Failed")["message"]
    assert _cond(failed, "Ready")["reason"] == reason and not ready(failed)
    await cluster.kubelet.until("the Pod deleted", lambda: name not in cluster.kubelet.seen)
    assert len(cluster.kubelet.uids[name]) == 1  # one Pod, waited for: no create/delete storm
    assert cluster.kubelet.started == []


@pytest.mark.parametrize(
    ("fault", "reason", "says"),
    [("crash_loop", "CrashLoop", "last exit code 1"), ("exit", "ExecdExited", "exit code 3")],
)
async def test_a_pod_whose_execd_cannot_run_fails_the_sandbox_at_once(
    cluster: Cluster, fault: str, reason: str, says: str
) -> None:
    """A crash-looping container, or one that exited with a code, is terminal: the Sandbox is
    Failed with the reason and the Pod's words (the SDK's create says so), no second Pod."""
    cluster.kubelet.fault = fault
    _lifecycle(cluster)
    await cluster.answering()
    name = f"kc-{uuid.uuid4().hex[:8]}"
    await _create_fails(cluster, name, reason)
    failed = await cluster.store.get("Sandbox", NS, name)
    assert failed.status["phase"] == "Failed"
    assert says in _cond(failed, "Failed")["message"]
    assert await _reason_column(cluster, name) == reason
    await cluster.kubelet.until("the Pod deleted", lambda: name not in cluster.kubelet.seen)
    assert len(cluster.kubelet.uids[name]) == 1


async def test_an_oom_killed_pod_fails_its_running_sandbox_with_oomkilled(
    cluster: Cluster,
) -> None:
    """A running sandbox whose container is OOM-killed becomes Failed/OOMKilled (exit code 137
    in the message); its Pod is not replaced by a fresh, empty one."""
    _lifecycle(cluster)
    await cluster.answering()
    name = f"ko-{uuid.uuid4().hex[:8]}"
    async with await AsyncSandbox.create(
        name=name, nats_url=cluster.nats.url, prefix=cluster.prefix
    ) as sbx:
        assert (await sbx.exec("echo up")).stdout == "up\n"
        await cluster.kubelet.oom_kill(name)
        failed = await cluster.until("Sandbox", name, _reason_is("Failed", "OOMKilled", "True"))
    assert failed is not None and failed.status["phase"] == "Failed"
    assert "exit code 137" in _cond(failed, "Failed")["message"]
    assert await _reason_column(cluster, name) == "OOMKilled"
    await cluster.kubelet.until("the Pod deleted", lambda: name not in cluster.kubelet.seen)
    assert cluster.kubelet.started == [name] and len(cluster.kubelet.uids[name]) == 1


async def test_a_pod_deleted_under_a_running_sandbox_fails_it_with_poddeleted(
    cluster: Cluster,
) -> None:
    """Someone deletes the Pod of a running sandbox: the Sandbox is Failed/PodDeleted instead of
    quietly getting a new Pod with an empty workspace."""
    _lifecycle(cluster)
    await cluster.answering()
    name = f"kd-{uuid.uuid4().hex[:8]}"
    async with await AsyncSandbox.create(
        name=name, nats_url=cluster.nats.url, prefix=cluster.prefix
    ):
        pods = PodApi(cluster.plane.settings)
        try:
            await pods.delete(NS, name, 0)
        finally:
            await pods.close()
        failed = await cluster.until("Sandbox", name, _reason_is("Failed", "PodDeleted", "True"))
    assert failed is not None and failed.status["phase"] == "Failed"
    assert cluster.kubelet.started == [name] and len(cluster.kubelet.uids[name]) == 1
