"""Pause and resume of a Pod sandbox, through its execd (``sys.freeze`` / ``sys.thaw``), with the
lifecycle service on the real API server and the fake kubelet running the Pod's execd here.

The counter is a file the background process rewrites in a loop; "stopped" is checked in
``/proc`` and against a bystander process outside the Pod's tree that keeps counting.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from k8s.cluster import NS, Cluster
from sandpod import AsyncSandbox
from sandpod.errors import SandboxPaused

LOOP = "i=0; while :; do i=$((i+1)); echo $i > {path}; sleep 0.02; done"


def _count(path: Path) -> int:
    try:
        return int(path.read_text().strip() or 0)
    except (OSError, ValueError):  # not written yet, or caught mid-write
        return 0


async def _until(what: str, done: Callable[[], bool], timeout: float = 20) -> None:
    """Poll a file-backed condition (a counter advancing has no event to wait on)."""
    try:
        async with asyncio.timeout(timeout):
            while not done():
                await asyncio.sleep(0.02)
    except TimeoutError:
        pytest.fail(f"never: {what}")


def _commands(sandbox_id: str, execd_pid: int) -> list[psutil.Process]:
    """The Pod's command processes: everything naming the sandbox except execd itself."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.pid != execd_pid and proc.environ().get("SANDPOD_SANDBOX_ID") == sandbox_id:
                found.append(proc)
    return found


@pytest.fixture
def bystander(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A counting process of the test's own, outside the Pod's tree."""
    path = tmp_path / "bystander"
    proc = subprocess.Popen(["sh", "-c", LOOP.format(path=path)])
    yield proc, path
    proc.kill()
    proc.wait(10)


def _cgroup_of(proc: psutil.Process) -> str:
    with contextlib.suppress(OSError), open(f"/proc/{proc.pid}/cgroup") as f:
        return next((line[3:].strip() for line in f if line.startswith("0::")), "")
    return ""  # exited meanwhile


@pytest.mark.parametrize(
    ("freezer", "reason"), [("signals", "SignalStopped"), ("auto", "CgroupFrozen")]
)
async def test_pausing_a_pod_sandbox_freezes_its_processes_through_execd_and_resume_continues(
    cluster: Cluster, bystander: tuple[subprocess.Popen[bytes], Path], freezer: str, reason: str
) -> None:
    """Sandbox.pause(): phase Paused, the Paused condition names the mechanism (SignalStopped,
    which the processes can observe; CgroupFrozen where execd may write its cgroup, as here),
    the background counter stops while execd stays up and a process outside the tree counts
    on; exec gets sandbox.paused. resume(): Running, the counter continues, exec runs."""
    cluster.kubelet.execd_env["SANDPOD_EXECD_FREEZER"] = freezer
    cluster.service("sandpod_lifecycle", SANDPOD_RUNTIME="kubernetes", SANDPOD_RESYNC="0.5")
    await cluster.answering()
    name = f"kz-{uuid.uuid4().hex[:8]}"
    outside, outside_path = bystander
    counter = cluster.state / "pods" / name / "workspace" / "counter"  # the Pod's /workspace
    async with await AsyncSandbox.create(
        name=name, nats_url=cluster.nats.url, prefix=cluster.prefix
    ) as sbx:
        proc = await sbx.proc.start(LOOP.format(path="counter"))
        await _until("the counter runs", lambda: _count(counter) > 2)
        execd = cluster.kubelet.execds[name]

        info = await sbx.pause()
        assert info.phase == "Paused"
        paused = info.condition("Paused") or {}
        assert (paused.get("status"), paused.get("reason")) == ("True", reason)
        commands = _commands(name, execd.pid)
        assert commands
        if reason == "SignalStopped":
            assert "observe" in paused.get("message", "")
            assert all(p.status() == psutil.STATUS_STOPPED for p in commands)
        else:
            assert "invisible" in paused.get("message", "")
            inside = [_cgroup_of(p) for p in commands]  # "": a sleep that ended meanwhile
            assert all(c == "" or f"/sandpod-freeze-{name}-" in c for c in inside), inside
        assert psutil.Process(execd.pid).status() != psutil.STATUS_STOPPED
        assert "sandpod-freeze" not in _cgroup_of(psutil.Process(execd.pid))
        assert psutil.Process().status() != psutil.STATUS_STOPPED
        frozen_at, start = _count(counter), _count(outside_path)
        await _until("the bystander counts on", lambda: _count(outside_path) > start + 10)
        assert _count(counter) == frozen_at
        assert psutil.Process(outside.pid).status() != psutil.STATUS_STOPPED
        with pytest.raises(SandboxPaused):
            await sbx.exec("echo hi")
        await sbx.ping()  # execd answers while its commands are frozen
        stored = await cluster.store.get("Sandbox", NS, name)
        assert stored.status["phase"] == "Paused"

        info = await sbx.resume()
        assert info.phase == "Running"
        assert (info.condition("Paused") or {}).get("status") == "False"
        await _until("the counter continues", lambda: _count(counter) > frozen_at)
        assert (await sbx.exec("echo hi")).stdout == "hi\n"
        await sbx.proc.kill(proc.id)
    assert cluster.kubelet.started == [name]  # the same Pod throughout
