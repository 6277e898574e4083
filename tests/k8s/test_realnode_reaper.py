"""What a real test node sweeps, and what it must leave alone.

The reaper (``realnode.reap_orphans``): the node of a test run that died
without stopping it (a SIGKILL, a lost session) is stopped when the next node starts -- its
processes, mounts and directories -- while a node whose test run lives (another run on this
host) is never touched, nor one whose owner is unknown.

Each fake node is what a dead run leaves: a run dir with its owner file, a work dir, a process
naming the work dir (as the kubelet names its kubeconfig), a mount under the work dir. The run
dirs live under a private root, so real nodes of other runs are out of reach."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from k8s.realnode import OWNER, RealNode, _start_time, reap_orphans

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="a fake node mounts a tmpfs: run the suite as root (the CI does)"
)


class FakeNode:
    def __init__(self, run_root: Path, base: Path, owner: dict[str, object] | None) -> None:
        ident = uuid.uuid4().hex[:6]
        self.run_dir = run_root / f"sandpod-node-{ident}"
        self.run_dir.mkdir(parents=True)
        self.workdir = base / f"sandpod-node-{ident}"
        self.mount = self.workdir / "containerd" / "rootfs"
        self.mount.mkdir(parents=True)
        subprocess.run(["mount", "-t", "tmpfs", "fake-node", str(self.mount)], check=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)", str(self.workdir / "x.conf")],
            start_new_session=True,
        )
        if owner is not None:
            owner = {**owner, "dir": str(self.workdir), "octet": 254}
            (self.run_dir / OWNER).write_text(json.dumps(owner))

    def mounted(self) -> bool:
        return str(self.mount) in Path("/proc/self/mountinfo").read_text()

    def intact(self) -> bool:
        return (
            self.proc.poll() is None
            and self.mounted()
            and self.run_dir.is_dir()
            and self.workdir.is_dir()
        )

    def gone(self) -> bool:
        return (
            self.proc.poll() is not None
            and not self.mounted()
            and not self.run_dir.exists()
            and not self.workdir.exists()
        )

    def clean(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        if self.mounted():
            subprocess.run(["umount", "-l", str(self.mount)], check=False)


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[FakeNode]]:
    made: list[FakeNode] = []
    yield made
    for node in made:
        node.clean()


def test_a_dead_runs_node_is_stopped_and_a_live_runs_node_is_not(
    tmp_path: Path, nodes: list[FakeNode]
) -> None:
    run_root, base = tmp_path / "run", tmp_path / "var"
    gone_pid = subprocess.Popen(["true"])
    gone_pid.wait()
    me = os.getpid()
    dead = FakeNode(run_root, base, {"pid": gone_pid.pid, "start": 1})
    live = FakeNode(run_root, base, {"pid": me, "start": _start_time(me)})
    # the owner's pid is alive but is another process now (pid reuse): its run is gone
    reused = FakeNode(run_root, base, {"pid": me, "start": (_start_time(me) or 0) - 1})
    unknown = FakeNode(run_root, base, None)
    nodes += [dead, live, reused, unknown]
    assert all(n.intact() for n in nodes)

    reaped = reap_orphans(run_root)

    assert sorted(reaped) == sorted([str(dead.run_dir), str(reused.run_dir)])
    assert dead.gone() and reused.gone()
    assert live.intact() and unknown.intact()


def test_a_stopping_node_leaves_another_nodes_live_pod_network_namespaces() -> None:
    """A node's stop deletes the ``cni-…`` namespaces made since it started that no process is
    in (its own Pods', dead by then), never a live one: another node's running Pod's. Only the
    test's two namespaces are candidates (every other one counts as older than the node), so
    a real node running beside this test is out of reach."""
    tag = uuid.uuid4().hex[:8]
    live, dead = f"cni-t{tag}-live", f"cni-t{tag}-dead"
    before = set(os.listdir("/run/netns")) if Path("/run/netns").is_dir() else set()
    for name in (live, dead):
        subprocess.run(["ip", "netns", "add", name], check=True)
    pod = subprocess.Popen(["ip", "netns", "exec", live, "sleep", "600"])
    try:
        for _ in range(200):  # the pause process is in its namespace once it sleeps
            ns = os.stat(f"/run/netns/{live}").st_ino
            if os.stat(f"/proc/{pod.pid}/ns/net").st_ino == ns:
                break
            time.sleep(0.01)
        node = RealNode(Path("/nonexistent"), Path())
        node.netns_before = set(os.listdir("/run/netns")) - {live, dead}
        node._sweep_netns()
        left = set(os.listdir("/run/netns"))
        assert live in left and dead not in left
        assert before <= left  # nothing older was touched
    finally:
        pod.kill()
        pod.wait(10)
        for name in (live, dead):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
