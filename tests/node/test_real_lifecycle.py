"""Pause/resume, idleness and hibernation of sandboxes that are real Pods (tests/k8s/realnode.py).

The fast layer (tests/k8s/test_pod_pause.py, tests/k8s/test_pod_snapshots.py) runs each Pod's
execd as a host process of the test kubelet; here execd runs in a container runc started, as
the Pod's uid, in the kubelet's cgroup, so what pause freezes and what hibernation deletes are
the real thing. Everything is observed through the sandbox's own execd or the API server.

Time inside the container is the node's kernel clock, read through execd (``/proc/uptime``):
"the counter did not move" is checked across an interval the node itself measured, and the
same interval is first shown to be long enough for the running counter to move.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from conftest import SESSION_DAEMON_PIDS
from k8s.cluster import NS, Cluster
from k8s.realnode import RealNode
from node.conftest import pod_env
from node.test_real_pods import _template
from sandpod import AsyncSandbox
from sandpod.errors import SandboxPaused
from sandpod_kube import PodApi, delete_all

# A real node's Pods start in seconds, but the node itself takes ~40 s on first use.
pytestmark = pytest.mark.timeout(400)

# The shell writes its own pid, then a counter, into /workspace (the Pod's emptyDir); each value
# replaces the last by a rename, so a read (paused anywhere in the loop, or not) sees a whole one.
LOOP = (
    "echo $$ > /workspace/pid; i=0; "
    "while :; do i=$((i+1)); echo $i > /workspace/n.new; mv /workspace/n.new /workspace/n; "
    "sleep 0.02; done"
)
INTERVAL = 1.0  # seconds of the node's clock: the running counter moves ~20 times in it


async def _poll(what: str, done: Callable[[], Awaitable[bool]], timeout: float = 90) -> None:
    """Until ``done()`` (each probe is a request to execd or the API server)."""
    try:
        async with asyncio.timeout(timeout):
            while not await done():
                await asyncio.sleep(0.05)
    except TimeoutError:
        pytest.fail(f"never: {what} (after {timeout}s)")


async def _count(sbx: AsyncSandbox) -> int:
    return int((await sbx.fs.read("/workspace/n")).decode())


async def _uptime(sbx: AsyncSandbox) -> float:
    """The node kernel's clock, read by execd in the container (not a command: paused or not)."""
    return float((await sbx.fs.read("/proc/uptime")).decode().split()[0])


async def _across_interval(sbx: AsyncSandbox) -> tuple[int, int]:
    """The counter before and after ``INTERVAL`` seconds of the node's clock."""
    start, before = await _uptime(sbx), await _count(sbx)

    async def elapsed() -> bool:
        return await _uptime(sbx) >= start + INTERVAL

    await _poll("the node's clock advanced", elapsed)
    return before, await _count(sbx)


async def test_pause_stops_a_real_pods_commands_and_resume_continues_the_same_process(
    node_cluster: Cluster,
) -> None:
    """Sandbox.pause() on a Pod: execd in the container stops its commands' trees (the Paused
    condition names the mechanism it could use there), the counter stands still across an
    interval in which it moved before, execd still answers (ping, file reads) and refuses new
    commands with sandbox.paused, the Sandbox is Paused in the API server; resume() continues
    the same process (same pid) from where it stopped, in the same Pod."""
    node_cluster.service("sandpod_lifecycle", **pod_env())
    await node_cluster.answering()
    sbx = await node_cluster.create(await _template(node_cluster))
    try:
        pod_before = await node_cluster.pod_uids(sbx.id)
        proc = await sbx.proc.start(["sh", "-c", LOOP], proc_id="counter")

        async def counting() -> bool:
            return await sbx.fs.exists("/workspace/n") and await _count(sbx) > 2

        await _poll("the counter runs", counting)
        pid = int((await sbx.fs.read("/workspace/pid")).decode())
        assert pid == proc.pid
        before, after = await _across_interval(sbx)
        assert after > before + 5, (before, after)  # the interval is long enough to see it move

        info = await sbx.pause()
        assert info.phase == "Paused"
        paused = info.condition("Paused") or {}
        assert paused.get("status") == "True", paused
        # no writable cgroup for execd in the container (runc mounts the cgroup fs read-only,
        # on v1 as on v2; this host is v1): execd stops its commands by SIGSTOP
        assert paused.get("reason") == "SignalStopped", paused
        stat = (await sbx.fs.read(f"/proc/{pid}/stat")).decode()
        assert stat.rsplit(")", 1)[1].split()[0] == "T", stat  # stopped, as the kernel says
        frozen, still = await _across_interval(sbx)
        assert frozen == still, (frozen, still)
        with pytest.raises(SandboxPaused):
            await sbx.exec("echo hi")
        await sbx.ping()  # execd itself is not stopped
        stored = await node_cluster.store.get("Sandbox", NS, sbx.id)
        assert stored.status["phase"] == "Paused"

        info = await sbx.resume()
        assert info.phase == "Running"
        assert (info.condition("Paused") or {}).get("status") == "False"

        async def moved_on() -> bool:
            return await _count(sbx) > still

        await _poll("the counter continues", moved_on)
        assert (await sbx.proc.status("counter")).pid == pid
        r = await sbx.exec(f"cat /workspace/pid; kill -0 {pid} && echo alive")
        assert r.stdout == f"{pid}\nalive\n", r
        assert still < await _count(sbx) < still + 500  # continued, not started again from 0
        assert await node_cluster.pod_uids(sbx.id) == pod_before  # the same Pod throughout
        await sbx.proc.kill("counter")
    finally:
        await sbx.kill()
        await sbx.close()


async def _any_pod(cluster: Cluster, name: str) -> bool:
    """Whether any Pod of the sandbox exists, even one being deleted."""
    pods = PodApi(cluster.plane.settings)
    try:
        return any(p.name == name for p in await pods.list(f"sandpod.dev/sandbox={name}", NS))
    finally:
        await pods.close()


async def test_an_idle_real_pod_sandbox_is_deleted_then_its_pod(node_cluster: Cluster) -> None:
    """idlePolicy Delete (the default): a sandbox nobody uses for its idle timeout is deleted,
    then its Pod, once the real kubelet stopped the container; a busy one is kept meanwhile."""
    template = await _template(node_cluster)
    node_cluster.service("sandpod_lifecycle", **pod_env())
    await node_cluster.answering()
    sbx = await node_cluster.create(template, idle_timeout=3)
    name = sbx.id
    try:
        assert (await sbx.exec("echo used")).stdout == "used\n"
        assert await node_cluster.pod_uids(name)
        gone = await node_cluster.until("Sandbox", name, lambda o: o is None, timeout=120)
        assert gone is None

        async def no_pod() -> bool:
            return not await _any_pod(node_cluster, name)

        await _poll("the Pod is gone", no_pod, timeout=60)
    finally:
        await sbx.close()


async def test_an_idle_real_pod_sandbox_hibernates_and_exec_wakes_it_in_a_new_pod(
    node_cluster: Cluster,
) -> None:
    """idlePolicy Hibernate: idle, the sandbox's files go through execd into its hibernation
    snapshot in the object store, its Pod is deleted (the kubelet stopped it) while the
    Sandbox stays, Hibernated (FilesOnly); the next exec wakes it in a new real Pod, whose
    fresh emptyDir gets the files back, modes and content included, and whose container's root
    filesystem gets what the sandbox wrote outside /workspace (/var/tmp)."""
    template = await _template(node_cluster)
    node_cluster.service("sandpod_lifecycle", **pod_env())
    await node_cluster.answering()
    sbx = await node_cluster.create(template, idle_timeout=4, idle_policy="Hibernate")
    try:
        r = await sbx.exec(
            "/workspace",
            [
                "sh",
                "-c",
                "mkdir -p keep/empty && echo kept > keep/f && chmod 0604 keep/f && "
                "head -c 200000 /dev/urandom > keep/blob && echo outside > /var/tmp/kept && "
                "sha256sum keep/blob",
            ],
        )
        assert r.exit_code == 0, r
        digest = r.stdout.split()[0]
        before = await node_cluster.pod_uids(sbx.id)
        assert len(before) == 1

        async def hibernated() -> bool:
            return (await sbx.describe()).phase == "Hibernated"

        await _poll("Hibernated", hibernated, timeout=120)

        async def no_pod() -> bool:
            return not await _any_pod(node_cluster, sbx.id)

        await _poll("the Pod is gone", no_pod, timeout=60)
        listed = await AsyncSandbox.list(nats_url=node_cluster.nats.url, prefix=node_cluster.prefix)
        assert [x.phase for x in listed if x.name == sbx.id] == ["Hibernated"]
        cond = (await sbx.describe()).condition("Hibernated") or {}
        assert (cond.get("status"), cond.get("reason")) == ("True", "FilesOnly")

        woke = await sbx.exec(
            "/workspace",
            [
                "sh",
                "-c",
                "cat keep/f; stat -c %a keep/f; ls keep; sha256sum keep/blob; cat /var/tmp/kept",
            ],
        )
        expected = f"kept\n604\nblob\nempty\nf\n{digest}  keep/blob\noutside\n"
        assert woke.stdout == expected, woke
        after = await node_cluster.pod_uids(sbx.id)
        assert len(after) == 1 and after != before
        assert (await sbx.describe()).phase == "Running"
    finally:
        await sbx.kill()
        await sbx.close()
        await asyncio.to_thread(delete_all, node_cluster.plane.settings, "SandboxSnapshot", [NS])


async def test_a_real_pod_sandbox_outlives_an_api_server_restart_and_new_ones_start(
    node_cluster: Cluster, real_node: RealNode
) -> None:
    """kube-apiserver is stopped and started again (etcd keeps the data) under a running
    sandbox: its container keeps running and execd answers throughout (the data plane does not
    go through the API server), and afterwards the real kubelet and the lifecycle, having
    re-watched, start a new sandbox's Pod. The first sandbox is still the same Pod."""
    assert real_node.plane is not None
    template = await _template(node_cluster)
    node_cluster.service("sandpod_lifecycle", **pod_env())
    await node_cluster.answering()
    first = await node_cluster.create(template)
    try:
        await first.fs.write("/workspace/kept", b"across the restart")
        before = await node_cluster.pod_uids(first.id)
        restart = asyncio.create_task(asyncio.to_thread(real_node.plane.restart_apiserver))
        while not restart.done():  # execd answers while the API server is down and coming up
            assert (await first.exec("cat /workspace/kept")).stdout == "across the restart"
        await restart
        SESSION_DAEMON_PIDS.update(real_node.pids())  # the new API server: the session's
        second = await node_cluster.create(template)
        try:
            assert (await second.exec("echo after")).stdout == "after\n"
        finally:
            await second.kill()
            await second.close()
        assert await node_cluster.pod_uids(first.id) == before
        assert (await first.exec("cat /workspace/kept")).stdout == "across the restart"
    finally:
        await first.kill()
        await first.close()
