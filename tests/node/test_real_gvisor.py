"""Sandboxes in gVisor: a template's ``runtimeClassName: gvisor`` on the real node.

tests/k8s/nodegvisor.py gives the node's containerd a ``runsc`` runtime (gVisor's own shim and
runsc, built by deploy/envtest/build-gvisor.sh) and the API server a ``gvisor`` RuntimeClass.
A template naming it gets a real Pod whose containers run on gVisor's kernel: checked from
inside (the kernel the container sees is gVisor's: ``uname``, ``/proc/version``), from the host
(a ``runsc-sandbox`` process charged to the Pod's own cgroup), and against a runc sandbox of the
same node (not gVisor: the checks can tell). execd serves exec and files over NATS from inside
gVisor, and the Pod's hardening still holds where it applies inside gVisor.

gVisor is built with the other envtest binaries (``make envtest``, which ``make test`` and
.ci/run run; cached after once): without that build the tests fail and say the command.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from k8s.cluster import NS, Cluster
from k8s.nodegvisor import RUNTIME_CLASS, ensure_runtime_class, missing_gvisor
from k8s.realnode import RealNode
from node.test_real_pods import STATUS, _running, _template, attacks_fail

# dmesg would show gVisor's boot messages, but only to root (syslog needs CAP_SYSLOG).
KERNEL = "uname -r; cat /proc/version"


pytestmark = pytest.mark.timeout(400)


@pytest.fixture(scope="session")
def gvisor_built() -> None:
    """Fails, never skips, without the build (``make test`` and .ci/run build it)."""
    if (missing := missing_gvisor()) is not None:
        pytest.fail(f"gVisor is not built: {missing} (or `make envtest`)")


@pytest.fixture
def gvisor(gvisor_built: None, real_node: RealNode) -> str:
    """The RuntimeClass's name, created on the node's API server as a cluster admin would."""
    ensure_runtime_class(real_node.settings)
    return RUNTIME_CLASS


def _pod_uid(cluster: Cluster, name: str) -> tuple[str, str | None]:
    from kubernetes import client

    with cluster.plane.settings.api_client() as api:
        raw = client.CoreV1Api(api).read_namespaced_pod(name, NS).to_dict()
    return str(raw["metadata"]["uid"]), raw["spec"].get("runtime_class_name")


def _sandbox_cgroups() -> list[str]:
    """The memory cgroup of every runsc sandbox process on the host (gVisor's 'VM')."""
    found = []
    for pid in filter(str.isdigit, (p.name for p in Path("/proc").iterdir())):
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            cgroups = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            continue
        if argv0 == b"runsc-sandbox":
            found += [line.split(":", 2)[2] for line in cgroups.splitlines() if ":memory:" in line]
    return found


async def test_a_gvisor_template_runs_its_sandbox_on_gvisors_kernel(
    gvisor: str, node_cluster: Cluster
) -> None:
    """The template's runtimeClassName reaches the Pod; inside, the kernel is gVisor's; on the
    host, a runsc sandbox process sits in that Pod's cgroup (its limits bind gVisor as a
    whole); a runc sandbox of the same node answers none of that."""
    boxed = await _running(
        node_cluster,
        await _template(node_cluster, runtimeClassName=gvisor, resources={"memory": "512Mi"}),
    )
    plain = await node_cluster.create(await _template(node_cluster))
    try:
        uid, runtime_class = await asyncio.to_thread(_pod_uid, node_cluster, boxed.id)
        assert runtime_class == gvisor
        inside = (await boxed.exec(KERNEL)).stdout
        release, version = inside.splitlines()
        assert release.endswith("-gvisor"), inside  # uname -r: 4.19.0-gvisor
        assert version.startswith(f"Linux version {release} "), inside  # the sentry's
        runc = await plain.exec(KERNEL)
        assert "gvisor" not in runc.stdout.lower() and "gvisor" not in runc.stderr.lower()
        sandboxes = _sandbox_cgroups()
        assert any(f"/pod{uid}" in cg for cg in sandboxes), (uid, sandboxes)
        plain_uid, _ = await asyncio.to_thread(_pod_uid, node_cluster, plain.id)
        assert not any(f"/pod{plain_uid}" in cg for cg in sandboxes)
        limit = await boxed.exec("grep MemTotal /proc/meminfo")
        assert limit.stdout.split()[1] == str(512 * 1024), limit  # gVisor sizes to the limit
    finally:
        for sbx in (boxed, plain):
            await sbx.kill()
            await sbx.close()


async def test_execd_serves_exec_and_files_from_inside_gvisor(
    gvisor: str, node_cluster: Cluster
) -> None:
    """execd (started by the Pod's entrypoint inside gVisor) answers over NATS through gVisor's
    network stack: byte-exact files, a streamed exec, a PTY."""
    sbx = await _running(node_cluster, await _template(node_cluster, runtimeClassName=gvisor))
    try:
        payload = bytes(range(256)) * 1024
        await sbx.fs.write("/workspace/blob", payload)
        assert await sbx.fs.read("/workspace/blob") == payload
        async with sbx.exec_stream(["sh", "-c", "seq 1 5000"]) as stream:
            out = b"".join([c.data async for c in stream])
        assert out == "".join(f"{i}\n" for i in range(1, 5001)).encode()
        term = await sbx.pty.open(["sh", "-c", "tty > /workspace/tty"])
        async with term:
            await term.wait()
        assert (await sbx.fs.read("/workspace/tty")).startswith(b"/dev/pts/")
    finally:
        await sbx.kill()
        await sbx.close()


async def test_the_pods_hardening_holds_inside_gvisor(gvisor: str, node_cluster: Cluster) -> None:
    """test_real_pods' hardening checks where they apply inside gVisor's kernel: not root, no
    capability, no new privileges, no token; mount, a raw socket, chroot and a setuid root shell
    all fail. Two differ from runc by design, both because the Pod's seccomp profile is not
    loaded inside (gVisor's kernel is the syscall boundary; nodegvisor.py says why not
    --oci-seccomp): /proc/self/status shows no filter, and an unprivileged user namespace can be
    made (gVisor's own, in its kernel; under runc the RuntimeDefault filter refuses it)."""
    sbx = await _running(node_cluster, await _template(node_cluster, runtimeClassName=gvisor))
    try:
        assert (await sbx.exec("uname -r")).stdout.strip().endswith("-gvisor")
        status = dict(line.split(":\t", 1) for line in (await sbx.exec(STATUS)).stdout.splitlines())
        assert status["Uid"].split()[0] != "0"
        assert int(status["CapEff"], 16) == int(status["CapPrm"], 16) == 0
        assert int(status["CapBnd"], 16) == 0
        assert status["NoNewPrivs"].strip() == "1"
        token = await sbx.exec("ls /var/run/secrets/kubernetes.io 2>&1")
        assert "No such file or directory" in token.stdout
        await attacks_fail(sbx, status["Uid"].split()[0], userns=False)
    finally:
        await sbx.kill()
        await sbx.close()
