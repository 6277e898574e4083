"""Template builds in real builder Pods on the real node, pushed to a real registry, run as Pods.

The fast layer (tests/k8s/test_template_build_pods.py) runs the builder Pod's command as a host
process; here the real kubelet, containerd and runc run it: the builder Pod is scheduled, its
hardening is what runc applies (the bounding set, seccomp, a read-only root), its ``run`` step
mounts its overlay and chroots inside that container, it pushes to Debian's docker-registry
(htpasswd auth) listening on the host end of the node's link, and the kubelet copies its
termination message into the Pod's status. Then a Sandbox of the template is a real Pod whose
image containerd pulls from that registry with the Pod's ``imagePullSecrets`` (the node trusts
that one plain-HTTP host: ``RealNode.trust_plain_http_registry``).

Every Pod state asserted on is what the API server showed while it happened (a Pod watch from
before the build), since the product deletes its builder Pods once it read their result.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from k8s.cluster import NS, Cluster
from k8s.realnode import TAG, RealNode, image
from k8s.test_template_build_pods import PASSWORD, SECRET, USER, _registry_secret
from node.conftest import IMAGES, pod_env
from registry import TestRegistry
from runnable_image import docker_config
from sandpod import AsyncSandbox
from sandpod.errors import BuildFailed, SandboxError
from sandpod.templates import AsyncTemplates, Template, TemplateInfo
from sandpod_contract.builds import BuildStatus
from sandpod_image.auth import AuthConfig, load_auth_file
from sandpod_image.pushlayout import push_layout
from sandpod_kube import PodApi
from sandpod_kube.buildpod import BUILD_CAPABILITIES, BUILD_LABEL
from sandpod_lifecycle.builds.podwire import BuildOutcome
from sandpod_store import Resource

# The node takes ~40 s on first use; a build pulls a 170 MB base, unpacks, commits and pushes
# on a machine whose two cores are shared (test wait budgets only, never product timeouts).
pytestmark = pytest.mark.timeout(900)

BUILD_WAIT = 480.0  # seconds the SDK follows one build
# The run step reports what runc gave the builder container (the bounding set survives the
# jail's drop to the build uid), attacks with the container's SYS_ADMIN (a mount), and writes
# a file with the template's env.
STATUS = "grep -E '^(Uid|CapEff|CapBnd|Seccomp|NoNewPrivs):' /proc/self/status"
ATTACK = "mount -t tmpfs none /tmp 2>/dev/null && echo 'mount: done' || echo 'mount: refused'"
STEP = f'{STATUS}; {ATTACK}; echo "$GREETING" > /data/step'


@pytest.fixture(scope="module")
def node_registry(
    real_node: RealNode, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TestRegistry]:
    """docker-registry with htpasswd on the host end of the node's link, trusted by the node's
    containerd as plain HTTP (that host only)."""
    assert real_node.net is not None
    reg = TestRegistry(
        tmp_path_factory.mktemp("node-registry"),
        users={USER: PASSWORD},
        bind=real_node.net.host_ip,
    )
    reg.start()
    real_node.trust_plain_http_registry(reg.host)
    yield reg
    shutil.rmtree(real_node.registry_hosts / reg.host, ignore_errors=True)
    reg.stop()


class PodWatch:
    """Every state the API server showed of one template's builder Pods (``last``: by name,
    ``phases``: each phase seen, in order; ``deleted``: names whose DELETED event came)."""

    def __init__(self, cluster: Cluster, template: str) -> None:
        self._settings = cluster.plane.settings
        self._template = template
        self.last: dict[str, dict[str, Any]] = {}
        self.phases: dict[str, list[str]] = {}
        self.deleted: set[str] = set()
        self._changed = asyncio.Event()

    async def run(self) -> None:
        pods = PodApi(self._settings)
        try:
            async for etype, raw in pods.watch(NS):
                meta = raw.get("metadata") or {}
                if (meta.get("labels") or {}).get(BUILD_LABEL) != self._template:
                    continue
                name = str(meta["name"])
                self.last[name] = raw
                phase = str((raw.get("status") or {}).get("phase") or "Pending")
                seen = self.phases.setdefault(name, [])
                if not seen or seen[-1] != phase:
                    seen.append(phase)
                if etype == "DELETED":
                    self.deleted.add(name)
                self._changed.set()
        finally:
            await pods.close()

    async def until(self, what: str, done: Callable[[], bool], timeout: float = 120) -> None:
        try:
            async with asyncio.timeout(timeout):
                while not done():
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            pytest.fail(f"{what}: never seen; builder Pods: {self.phases}")


@contextlib.asynccontextmanager
async def watching(cluster: Cluster, template: str) -> AsyncIterator[PodWatch]:
    watch = PodWatch(cluster, template)
    task = asyncio.create_task(watch.run(), name=f"pod-watch-{template}")
    try:
        yield watch
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _setup(
    cluster: Cluster, registry: TestRegistry, tmp_path: Path, **extra: str
) -> tuple[str, Path]:
    """The registry Secret, the base (the node's ``sandpod-base``) pushed to the registry, the
    lifecycle building into it: (the base by digest, the credentials file)."""
    creds = docker_config(
        tmp_path / "config.json", registry, AuthConfig(username=USER, password=PASSWORD)
    )
    await asyncio.to_thread(_registry_secret, cluster, creds)
    pushed = await push_layout(
        IMAGES / "sandpod-base",
        TAG,
        f"{registry.host}/base/sandpod-base:{TAG}",
        auth_file=load_auth_file(creds),
        insecure=frozenset({registry.host}),
    )
    cluster.service(
        "sandpod_lifecycle",
        **pod_env(),
        SANDPOD_IMAGE_AUTH_FILE=str(creds),
        SANDPOD_INSECURE_REGISTRIES=registry.host,
        SANDPOD_BUILD_REGISTRY=f"{registry.host}/sandpod",
        SANDPOD_BUILD_REGISTRY_SECRET=SECRET,
        SANDPOD_BUILD_IMAGE=image("sandpod-lifecycle"),
        **extra,
    )
    await cluster.answering()
    return pushed.reference, creds


async def _build(cluster: Cluster, template: Template, logs: list[str]) -> TemplateInfo:
    async with await AsyncTemplates.connect(
        nats_url=cluster.nats.url, prefix=cluster.prefix
    ) as templates:
        return await templates.build(template, on_log=logs.append, timeout=BUILD_WAIT)


def _ended(raw: dict[str, Any]) -> dict[str, Any]:
    """The builder container's ``state.terminated`` as the kubelet wrote it."""
    statuses = (raw.get("status") or {}).get("containerStatuses") or [{}]
    return dict((statuses[0].get("state") or {}).get("terminated") or {})


def _failed(obj: Resource | None) -> dict[str, Any]:
    """The Sandbox's ``Failed`` condition when it is True (else empty)."""
    conditions = (obj.status.get("conditions") or []) if obj is not None else []
    failed: dict[str, Any] = next((c for c in conditions if c["type"] == "Failed"), {})
    return failed if failed.get("status") == "True" else {}


def _step_output(logs: list[str]) -> dict[str, str]:
    out = [line.removeprefix("  | ") for line in logs if line.startswith("  | ")]
    return {k: v.strip() for k, _, v in (line.partition(":") for line in out) if v}


def _caps_mask(names: tuple[str, ...]) -> int:
    numbers = {
        "CHOWN": 0,
        "DAC_OVERRIDE": 1,
        "FOWNER": 3,
        "SETGID": 6,
        "SETUID": 7,
        "SYS_CHROOT": 18,
        "SYS_ADMIN": 21,
        "MKNOD": 27,
    }
    return sum(1 << numbers[n] for n in names)


async def test_a_template_builds_in_a_real_builder_pod_and_its_sandbox_pod_pulls_the_image(
    node_cluster: Cluster, node_registry: TestRegistry, tmp_path: Path
) -> None:
    """A template with a ``run`` and a ``copy`` step builds in a builder Pod the real kubelet
    runs to Succeeded (restartPolicy Never, read-only root, exactly BUILD_CAPABILITIES as the
    bounding set runc gave it, RuntimeDefault seccomp, no ServiceAccount token); the
    termination message it wrote is the build's result; the Pod is deleted after. A Sandbox of
    the template cannot pull the pushed image without the registry Secret (ImagePullFailed);
    with it, the Sandbox is a real Pod of that image and sees the step's and the copy's files."""
    base, _ = await _setup(node_cluster, node_registry, tmp_path, SANDPOD_POD_START_DEADLINE="30")
    context = tmp_path / "app"
    context.mkdir()
    (context / "main.py").write_text("print('hello from the app')\n")
    name = f"nb-{uuid.uuid4().hex[:6]}"
    template = (
        Template(name)
        .from_image(base)
        .env(GREETING="built-on-a-real-node")
        .workdir("/data")
        .run(STEP)
        .copy(context, "/app")
    )
    logs: list[str] = []
    async with watching(node_cluster, name) as pods:
        info = await _build(node_cluster, template, logs)
        await pods.until("the builder Pod's deletion", lambda: bool(pods.deleted))
    assert info.phase == "Ready", (info, logs)
    status = BuildStatus.from_dict(info.object["status"])
    assert status.image.startswith(f"{node_registry.host}/sandpod/{name}@sha256:"), status

    # The builder Pod, as the real kubelet ran it.
    ((pod_name, raw),) = pods.last.items()
    assert pods.phases[pod_name][-1] == "Succeeded", pods.phases
    assert "Failed" not in pods.phases[pod_name], pods.phases
    ended = _ended(raw)
    assert (ended.get("exitCode"), ended.get("reason")) == (0, "Completed"), ended
    outcome = BuildOutcome.from_json(ended["message"])  # what podmain wrote, via the kubelet
    assert outcome.ok and outcome.image == status.image and outcome.key == info.result_key
    spec = raw["spec"]
    container = spec["containers"][0]
    security = container["securityContext"]
    assert spec["restartPolicy"] == "Never" and security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"], "add": list(BUILD_CAPABILITIES)}
    assert spec["automountServiceAccountToken"] is False
    mounts = [m["mountPath"] for m in container.get("volumeMounts") or []]
    assert not any("serviceaccount" in m for m in mounts), mounts
    assert pod_name in pods.deleted

    # What runc applied, seen by the run step itself (as the build uid, inside its jail).
    seen = _step_output(logs)
    assert seen["Uid"].split()[0] == "65532", logs
    assert int(seen["CapBnd"], 16) == _caps_mask(BUILD_CAPABILITIES), seen
    assert seen["Seccomp"] == "2" and seen["NoNewPrivs"] == "1", seen
    assert int(seen["CapEff"], 16) == 0 and seen["mount"] == "refused", seen

    # The control: a Sandbox Pod without the registry Secret cannot pull the image.
    denied = f"nd-{uuid.uuid4().hex[:6]}"
    with pytest.raises(SandboxError, match="ImagePullFailed"):
        await AsyncSandbox.create(
            name, name=denied, wait=150, nats_url=node_cluster.nats.url, prefix=node_cluster.prefix
        )
    failed = _failed(await node_cluster.store.get("Sandbox", NS, denied))
    assert failed.get("reason") == "ImagePullFailed", failed
    said = str(failed["message"])
    assert status.image in said and "401 Unauthorized" in said, said  # the registry's refusal

    # With the Secret (imagePullSecrets), containerd pulls it with the htpasswd credentials.
    (lifecycle,) = node_cluster.procs
    lifecycle.env["SANDPOD_POD_IMAGE_PULL_SECRETS"] = SECRET
    lifecycle.env["SANDPOD_POD_START_DEADLINE"] = "300"
    await asyncio.to_thread(lifecycle.restart)
    await node_cluster.answering()
    sbx = await AsyncSandbox.create(
        name, wait=240, nats_url=node_cluster.nats.url, prefix=node_cluster.prefix
    )
    async with sbx:
        r = await sbx.exec("cat /data/step /app/main.py")
        assert (r.exit_code, r.stdout) == (
            0,
            "built-on-a-real-node\nprint('hello from the app')\n",
        ), r
        pod = await _pod(node_cluster, sbx.id)
        assert pod["spec"]["containers"][0]["image"] == status.image
        assert pod["spec"]["imagePullSecrets"] == [{"name": SECRET}]
        await sbx.kill()


async def _pod(cluster: Cluster, name: str) -> dict[str, Any]:
    """The Pod ``name`` as the API server has it."""
    pods = PodApi(cluster.plane.settings)
    try:
        async with contextlib.aclosing(pods.watch(NS, f"metadata.name={name}")) as events:
            async for _, raw in events:
                return raw
    finally:
        await pods.close()
    pytest.fail(f"no Pod {name}")


async def test_a_failing_run_step_fails_the_build_and_its_real_pod(
    node_cluster: Cluster, node_registry: TestRegistry, tmp_path: Path
) -> None:
    """A ``run`` step that exits 3: the SDK raises BuildFailed naming the step with its words,
    the builder Pod ended Failed by the real kubelet (exit code 1, the typed error in its
    termination message), and it is deleted after."""
    base, _ = await _setup(node_cluster, node_registry, tmp_path)
    name = f"nf-{uuid.uuid4().hex[:6]}"
    template = Template(name).from_image(base).run("echo about to fail; exit 3")
    logs: list[str] = []
    async with watching(node_cluster, name) as pods:
        with pytest.raises(BuildFailed) as failed:
            await _build(node_cluster, template, logs)
        await pods.until("the builder Pod's deletion", lambda: bool(pods.deleted))
    details = failed.value.details
    assert details["step"] == 1 and "about to fail" in details["log_tail"], failed.value
    assert "the command exited with 3" in failed.value.message, failed.value
    ((pod_name, raw),) = pods.last.items()
    assert pods.phases[pod_name][-1] == "Failed", pods.phases
    ended = _ended(raw)
    assert ended.get("exitCode") == 1, ended
    outcome = BuildOutcome.from_json(ended["message"])
    assert not outcome.ok and outcome.error["code"] == "template.build_failed", outcome
    obj = await node_cluster.store.get("SandboxTemplate", NS, name)
    assert obj.status["failedStep"] == 1 and not obj.status.get("image"), obj.status
