"""Template builds in Kubernetes mode: a builder Pod per build, the image pushed to a registry.

Real parts: the kube-apiserver (envtest), nats-server, Debian's docker-registry on loopback with
htpasswd auth (tests/registry.py), the lifecycle service in ``SANDPOD_RUNTIME=kubernetes``, and
the fake kubelet (tests/k8s/kubelet.py), which runs the builder Pod's container command as a
host process -- Sandpod's builder entry point, pulling the base from the registry, running the
``run`` steps in its overlay jail (as root: tests run as root in CI) and pushing the image. The
SDK builds the template (uploading the ``copy`` context) and follows the build's events; the
pushed image is pulled back through ``sandpod_image`` and read layer by layer.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from k8s.cluster import NS, Cluster
from registry import TestRegistry
from runnable_image import docker_config, push, runnable_base, tar_of
from sandpod import AsyncPools, AsyncSandbox
from sandpod.errors import BuildFailed
from sandpod.templates import AsyncTemplates, Template, TemplateInfo
from sandpod_bus import Bus, BusSettings, Inbound
from sandpod_contract.builds import BuildStatus
from sandpod_contract.codec import decode
from sandpod_contract.messages.sandboxes import SandboxEvent
from sandpod_contract.subjects import Subjects
from sandpod_image.auth import AuthConfig, load_auth_file
from sandpod_image.store import ImageStore
from sandpod_kube.buildpod import BUILD_CAPABILITIES, BUILD_LABEL
from sandpod_kube.podspec import TEMPLATE_LABEL
from sandpod_store import Resource

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="a build's run step mounts an overlay and chroots: run the suite as root, as CI does",
)

USER, PASSWORD = "builder", "k8s-pw"
SECRET = "build-registry"
STEP = 'echo "running as $(id -u)"; echo "$GREETING $FROM_BASE" > /data/step'


@pytest.fixture(scope="module")
def build_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestRegistry]:
    reg = TestRegistry(tmp_path_factory.mktemp("build-registry"), users={USER: PASSWORD})
    reg.start()
    yield reg
    reg.stop()


def _registry_secret(cluster: Cluster, config: Path, name: str = SECRET) -> None:
    """The dockerconfigjson Secret the builder Pod mounts (what an admin creates)."""
    body = client.V1Secret(
        metadata=client.V1ObjectMeta(name=name),
        type="kubernetes.io/dockerconfigjson",
        data={".dockerconfigjson": base64.b64encode(config.read_bytes()).decode()},
    )
    with cluster.plane.settings.api_client() as api_client:
        core = client.CoreV1Api(api_client)
        try:
            core.create_namespaced_secret(NS, body)
        except client.exceptions.ApiException as exc:
            if exc.status != 409:
                raise
            core.replace_namespaced_secret(name, NS, body)


async def _base_image(registry: TestRegistry, work: Path) -> str:
    """A runnable base (the host's sh and a few tools) pushed to the registry."""
    runnable_base(work / "base")
    return await asyncio.to_thread(
        push,
        registry,
        "base/runnable",
        "v1",
        [tar_of(work / "base")],
        config={"Env": ["PATH=/bin:/usr/bin", "FROM_BASE=yes"]},
        work=work / "push",
        auth=AuthConfig(username=USER, password=PASSWORD),
    )


def _lifecycle(cluster: Cluster, creds: Path, **extra: str) -> None:
    cluster.service(
        "sandpod_lifecycle",
        SANDPOD_RUNTIME="kubernetes",
        SANDPOD_RESYNC="0.5",
        SANDPOD_READY_TIMEOUT="30",
        SANDPOD_IMAGE_AUTH_FILE=str(creds),
        SANDPOD_POD_NATS_CIDRS="127.0.0.1/32",
        **extra,
    )


async def _build(cluster: Cluster, template: Template, logs: list[str]) -> TemplateInfo:
    try:
        async with await AsyncTemplates.connect(
            nats_url=cluster.nats.url, prefix=cluster.prefix
        ) as templates:
            return await templates.build(template, on_log=logs.append, timeout=90)
    finally:
        if cluster.kubelet.error is not None:
            pytest.fail(f"the fake kubelet failed: {cluster.kubelet.error!r}")


def _condition(obj: Resource | None) -> dict[str, Any]:
    conditions = (obj.status.get("conditions") or []) if obj is not None else []
    return next((c for c in conditions if c["type"] == "Built"), {})


def _find(layers: tuple[Path, ...], rel: str) -> Path | None:
    """``rel`` in the topmost layer that has it (the path a container sees)."""
    return next((layer / rel for layer in reversed(layers) if (layer / rel).exists()), None)


async def test_a_built_template_is_pushed_by_a_builder_pod_and_its_sandboxes_run_it(
    cluster: Cluster, build_registry: TestRegistry, tmp_path: Path
) -> None:
    """run + copy + env + workdir steps build in a builder Pod (owned by the template,
    hardened as far as the overlay allows, deleted after) and push an image whose layers hold
    each step's files and whose config holds the env; the template records it by digest, a
    Sandbox Pod of the template runs that image, the same steps again are a cache hit (no Pod,
    no push), and a changed step pushes a new image."""
    creds = docker_config(
        tmp_path / "config.json", build_registry, AuthConfig(username=USER, password=PASSWORD)
    )
    _registry_secret(cluster, creds)
    base = await _base_image(build_registry, tmp_path)
    registry = f"{build_registry.host}/sandpod"
    _lifecycle(
        cluster,
        creds,
        SANDPOD_BUILD_REGISTRY=registry,
        SANDPOD_BUILD_REGISTRY_SECRET=SECRET,
        SANDPOD_BUILD_IMAGE="sandpod-lifecycle:test",
        SANDPOD_POD_IMAGE_PULL_SECRETS=SECRET,  # sandbox Pods pull the built image with it
    )
    await cluster.answering()
    context = tmp_path / "app"
    context.mkdir()
    (context / "main.py").write_text("print('hello from the app')\n")
    name = f"kb-{uuid.uuid4().hex[:6]}"

    def template(step: str, idle: int = 900) -> Template:
        t = (
            Template(name)
            .from_image(base)
            .workdir("/data")
            .env(GREETING="built-in-k8s")
            .run(step)
            .copy(context, "/app")
        )
        t.spec_extra["idleTimeoutSeconds"] = idle  # another generation, the same build
        return t

    logs: list[str] = []
    info = await _build(cluster, template(STEP), logs)
    assert info.phase == "Ready", info
    status = BuildStatus.from_dict(info.object["status"])
    assert status.image.startswith(f"{registry}/{name}@sha256:"), status
    assert info.image == status.image  # the SDK's view of it
    assert any(line.startswith("step 3/4 run") for line in logs), logs
    assert any("pushed" in line for line in logs) and "  | running as 65532" in logs, logs

    kubelet = cluster.kubelet
    assert len(kubelet.builds) == 1
    pod = kubelet.builds[0]
    owner = pod["metadata"]["ownerReferences"][0]
    template_obj = await cluster.store.get("SandboxTemplate", NS, name)
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "SandboxTemplate",
        name,
        template_obj.metadata.uid,
    )
    assert pod["metadata"]["labels"][BUILD_LABEL] == name
    spec = pod["spec"]
    security = spec["containers"][0]["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"], "add": list(BUILD_CAPABILITIES)}
    assert security["readOnlyRootFilesystem"] is True
    assert spec["automountServiceAccountToken"] is False and spec["restartPolicy"] == "Never"
    assert spec["containers"][0]["image"] == "sandpod-lifecycle:test"
    await kubelet.until(
        "the builder Pod's deletion", lambda: pod["metadata"]["name"] not in kubelet.seen
    )

    # The image, pulled back through sandpod_image (digests verified on the way).
    store = ImageStore(tmp_path / "pulled", auth_file=load_auth_file(creds))
    image = await store.pull(status.image)
    assert image.digest == status.image.rpartition("@")[2]
    step = _find(image.layers, "data/step")
    assert step is not None and step.read_text() == "built-in-k8s yes\n"
    assert step.stat().st_uid == 0  # the build uid's files are root's in an image
    app = _find(image.layers, "app/main.py")
    assert app is not None and app.read_text() == "print('hello from the app')\n"
    assert dict(image.config.env)["GREETING"] == "built-in-k8s"
    assert dict(image.config.env)["FROM_BASE"] == "yes"
    assert image.config.workdir == "/data"

    # A Sandbox of the template gets a Pod running the pushed image, by digest.
    sbx = await AsyncSandbox.create(
        name, timeout=30, nats_url=cluster.nats.url, prefix=cluster.prefix
    )
    async with sbx:
        sandbox_pod = kubelet.seen[sbx.id]
        assert sandbox_pod["spec"]["containers"][0]["image"] == status.image
        assert sandbox_pod["spec"]["imagePullSecrets"] == [{"name": SECRET}]
        await sbx.kill()

    # The same steps (a new generation): a cache hit, no builder Pod, nothing pushed.
    manifests = sorted(p.name for p in (build_registry.root / "data").rglob("link"))
    again_logs: list[str] = []
    again = await _build(cluster, template(STEP, idle=600), again_logs)
    assert again.result_key == info.result_key and len(kubelet.builds) == 1, again_logs
    assert BuildStatus.from_dict(again.object["status"]).image == status.image
    assert any(line.startswith("cached:") for line in again_logs), again_logs
    assert sorted(p.name for p in (build_registry.root / "data").rglob("link")) == manifests
    assert again.object["metadata"]["generation"] > info.object["metadata"]["generation"]

    # A changed step: a new builder Pod that resumes after the unchanged prefix (its result
    # was pushed too), and a new image.
    changed_logs: list[str] = []
    changed = await _build(cluster, template("echo changed > /data/step"), changed_logs)
    assert any(line.startswith("steps 1-2 cached: ") for line in changed_logs), changed_logs
    assert not any(line.startswith(("step 1/4", "step 2/4")) for line in changed_logs)
    assert "step 3/4 run echo changed > /data/step (running)" in changed_logs, changed_logs
    new_image = BuildStatus.from_dict(changed.object["status"]).image
    assert changed.result_key != info.result_key and len(kubelet.builds) == 2
    assert new_image.startswith(f"{registry}/{name}@sha256:") and new_image != status.image
    newer = await store.pull(new_image)
    changed_step = _find(newer.layers, "data/step")
    assert changed_step is not None and changed_step.read_text() == "changed\n"

    # Another template built on this one: its base is the pushed image, its steps on top.
    child = f"{name}-child"
    derived = await _build(
        cluster, Template(child).from_template(name).run("echo child > /data/child"), []
    )
    assert derived.phase == "Ready" and derived.layers[0] == changed.result_key, derived
    child_image = await store.pull(derived.image)
    assert child_image.layers[: len(newer.layers)] == newer.layers  # the parent's, shared
    child_file = _find(child_image.layers, "data/child")
    assert child_file is not None and child_file.read_text() == "child\n"
    assert dict(child_image.config.env)["GREETING"] == "built-in-k8s"


async def test_a_failed_step_is_named_in_the_template_status(
    cluster: Cluster, build_registry: TestRegistry, tmp_path: Path
) -> None:
    """A run step that exits non-zero fails the build in its Pod: the template is Failed with
    the same Built reason as a local build, the step named, its output in the tail."""
    creds = docker_config(
        tmp_path / "config.json", build_registry, AuthConfig(username=USER, password=PASSWORD)
    )
    _registry_secret(cluster, creds)
    base = await _base_image(build_registry, tmp_path)
    _lifecycle(
        cluster,
        creds,
        SANDPOD_BUILD_REGISTRY=f"{build_registry.host}/sandpod",
        SANDPOD_BUILD_REGISTRY_SECRET=SECRET,
    )
    await cluster.answering()
    name = f"kf-{uuid.uuid4().hex[:6]}"
    t = Template(name).from_image(base).env(A="1").run("echo about to fail; exit 3")
    with pytest.raises(BuildFailed) as failed:
        await _build(cluster, t, [])
    assert failed.value.details["step"] == 2 and "about to fail" in failed.value.details["log_tail"]
    obj = await cluster.store.get("SandboxTemplate", NS, name)
    cond = _condition(obj)
    assert (cond["status"], cond["reason"]) == ("False", "template.build_failed"), cond
    assert (
        "step 2 (run echo about to fail; exit 3) failed: the command exited with 3"
        in (cond["message"])
    )
    assert obj.status["failedStep"] == 2 and not obj.status.get("image")


async def test_without_a_registry_the_template_says_which_setting_to_set(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Kubernetes mode with no SANDPOD_BUILD_REGISTRY: the template fails at once with a
    condition naming the setting; no builder Pod is made."""
    (tmp_path / "empty.json").write_text("{}")
    _lifecycle(cluster, tmp_path / "empty.json")
    await cluster.answering()
    name = f"kn-{uuid.uuid4().hex[:6]}"
    with pytest.raises(BuildFailed):
        await _build(cluster, Template(name).run("true"), [])
    cond = _condition(await cluster.store.get("SandboxTemplate", NS, name))
    assert (cond["status"], cond["reason"]) == ("False", "template.build_unsupported"), cond
    assert "SANDPOD_BUILD_REGISTRY" in cond["message"]
    assert cluster.kubelet.builds == []


async def test_wrong_registry_credentials_are_a_typed_auth_failure(
    cluster: Cluster, build_registry: TestRegistry, tmp_path: Path
) -> None:
    """The registry refuses the lifecycle's credentials: the template's Built condition is
    ``image.auth_failed`` (not a retry loop, not a generic failure), and no Pod is made."""
    right = AuthConfig(username=USER, password=PASSWORD)
    base = await _base_image(build_registry, tmp_path)
    wrong = docker_config(
        tmp_path / "wrong.json", build_registry, AuthConfig(username=USER, password="nope")
    )
    _lifecycle(cluster, wrong, SANDPOD_BUILD_REGISTRY=f"{build_registry.host}/sandpod")
    await cluster.answering()
    assert right.password != "nope"
    name = f"ka-{uuid.uuid4().hex[:6]}"
    with pytest.raises(BuildFailed):
        await _build(cluster, Template(name).from_image(base).run("true"), [])
    cond = _condition(await cluster.store.get("SandboxTemplate", NS, name))
    assert (cond["status"], cond["reason"]) == ("False", "image.auth_failed"), cond
    assert build_registry.host in cond["message"]
    assert cluster.kubelet.builds == []
    assert json.loads(wrong.read_text())["auths"]  # the file was read, not absent


async def test_a_run_step_cannot_reach_the_builder_pods_secrets_or_processes(
    cluster: Cluster, build_registry: TestRegistry, tmp_path: Path
) -> None:
    """The attacker is the template's own ``run`` step, inside the builder Pod: it must not
    read the registry credentials the Pod mounts for its push (here: the fake kubelet's copy
    on this host), the Pod's env (the NATS URL, the build request), or see the builder's
    processes; and it is not root. Its probes are in the build log."""
    creds = docker_config(
        tmp_path / "config.json", build_registry, AuthConfig(username=USER, password=PASSWORD)
    )
    _registry_secret(cluster, creds)
    base = await _base_image(build_registry, tmp_path)
    _lifecycle(
        cluster,
        creds,
        SANDPOD_BUILD_REGISTRY=f"{build_registry.host}/sandpod",
        SANDPOD_BUILD_REGISTRY_SECRET=SECRET,
    )
    await cluster.answering()
    secrets = cluster.state / "pods"  # where the fake kubelet writes the Pod's Secret volumes
    probe = "; ".join(
        [
            f"for f in {secrets}/*/volumes/registry-auth/config.json {creds}; do "
            'if cat "$f" 2>/dev/null; then echo "READ $f"; else echo "no $f"; fi; done',
            "echo uid=$(id -u)",
            'echo "env: $SANDPOD_NATS_URL $SANDPOD_BUILD_REQUEST $SANDPOD_BUILD_AUTH_FILE."',
            "echo procs: $(ls /proc | while read p; do case $p in [0-9]*) echo x;; esac; done)",
        ]
    )
    logs: list[str] = []
    name = f"kx-{uuid.uuid4().hex[:6]}"
    info = await _build(cluster, Template(name).from_image(base).run(probe), logs)
    assert info.phase == "Ready", info
    out = [line.removeprefix("  | ") for line in logs if line.startswith("  | ")]
    assert not any(line.startswith("READ") or "auths" in line for line in out), out
    assert any(line.startswith("no ") and "registry-auth" in line for line in out), out
    assert "uid=65532" in out and "env:   ." in out, out
    procs = next(line for line in out if line.startswith("procs:"))
    assert procs.count("x") <= 6, procs  # sh and its pipeline: a pid namespace of its own


async def test_a_rebuilt_template_rolls_its_warm_pool_onto_the_new_image(
    cluster: Cluster, build_registry: TestRegistry, tmp_path: Path
) -> None:
    """A warm pool of a built template on Kubernetes: its members' Pods run the pushed image; a
    changed step pushes a new image, and the pool replaces its free members with Pods of it."""
    creds = docker_config(
        tmp_path / "config.json", build_registry, AuthConfig(username=USER, password=PASSWORD)
    )
    _registry_secret(cluster, creds)
    base = await _base_image(build_registry, tmp_path)
    _lifecycle(
        cluster,
        creds,
        SANDPOD_BUILD_REGISTRY=f"{build_registry.host}/sandpod",
        SANDPOD_BUILD_REGISTRY_SECRET=SECRET,
    )
    cluster.service("sandpod_pool", SANDPOD_POOL_RESYNC="0.3")
    await cluster.answering()
    name = f"kp-{uuid.uuid4().hex[:6]}"

    def template(version: str) -> Template:
        return Template(name).from_image(base).workdir("/v").run(f"echo {version} > /v/version")

    def pods_of(template: str, image: str) -> bool:
        labels = [(p, p["metadata"]["labels"]) for p in kubelet.seen.values()]
        members = [p for p, lb in labels if lb.get(TEMPLATE_LABEL) == template]
        return len(members) == 2 and all(
            p["spec"]["containers"][0]["image"] == image for p in members
        )

    kubelet = cluster.kubelet
    first = await _build(cluster, template("1"), [])
    pools = await AsyncPools.connect(nats_url=cluster.nats.url, prefix=cluster.prefix)
    try:
        await pools.create(name, template=name, replicas=2)
        await kubelet.until("the pool's Pods of image 1", lambda: pods_of(name, first.image), 90)
        second = await _build(cluster, template("2"), [])
        assert second.image != first.image and second.image
        await kubelet.until("the pool's Pods of image 2", lambda: pods_of(name, second.image), 90)
    finally:
        await pools.close()


async def test_refused_credentials_in_the_builder_pod_are_a_typed_auth_failure(
    cluster: Cluster, build_registry: TestRegistry, tmp_path: Path
) -> None:
    """The lifecycle's credentials are right but the Secret the builder Pod mounts is not: the
    Pod's own registry access is refused, and its typed error crosses the termination message
    into the template's Built condition as ``image.auth_failed``."""
    right = docker_config(
        tmp_path / "config.json", build_registry, AuthConfig(username=USER, password=PASSWORD)
    )
    wrong = docker_config(
        tmp_path / "wrong.json", build_registry, AuthConfig(username=USER, password="nope")
    )
    _registry_secret(cluster, wrong, name="wrong-registry")
    base = await _base_image(build_registry, tmp_path)
    _lifecycle(
        cluster,
        right,
        SANDPOD_BUILD_REGISTRY=f"{build_registry.host}/sandpod",
        SANDPOD_BUILD_REGISTRY_SECRET="wrong-registry",
    )
    await cluster.answering()
    name = f"kw-{uuid.uuid4().hex[:6]}"
    with pytest.raises(BuildFailed):
        await _build(cluster, Template(name).from_image(base).run("true"), [])
    cond = _condition(await cluster.store.get("SandboxTemplate", NS, name))
    assert (cond["status"], cond["reason"]) == ("False", "image.auth_failed"), cond
    assert len(cluster.kubelet.builds) == 1  # the refusal came from inside the builder Pod


async def test_a_builder_pod_that_cannot_start_fails_the_build_with_its_reason(
    cluster: Cluster, build_registry: TestRegistry, tmp_path: Path
) -> None:
    """No node fits the builder Pod (what the scheduler writes): the build log says so while it
    waits, and after the start deadline the template is Failed naming the reason -- never left
    Building in silence; the Pod is deleted."""
    creds = docker_config(
        tmp_path / "config.json", build_registry, AuthConfig(username=USER, password=PASSWORD)
    )
    base = await _base_image(build_registry, tmp_path)
    cluster.kubelet.fault = "unschedulable"
    _lifecycle(
        cluster,
        creds,
        SANDPOD_BUILD_REGISTRY=f"{build_registry.host}/sandpod",
        SANDPOD_POD_START_DEADLINE="2",
    )
    await cluster.answering()
    name = f"ku-{uuid.uuid4().hex[:6]}"
    logs: list[str] = []
    with pytest.raises(BuildFailed):
        await _build(cluster, Template(name).from_image(base).run("true"), logs)
    assert any(line.startswith("builder Pod waiting: Unschedulable") for line in logs), logs
    cond = _condition(await cluster.store.get("SandboxTemplate", NS, name))
    assert (cond["status"], cond["reason"]) == ("False", "template.build_failed"), cond
    assert "did not start within 2 s: Unschedulable" in cond["message"], cond
    kubelet = cluster.kubelet
    await kubelet.until("the builder Pod's deletion", lambda: not kubelet.seen)


async def test_a_restarted_lifecycle_adopts_the_running_builder_pod(
    cluster: Cluster, build_registry: TestRegistry, tmp_path: Path
) -> None:
    """The lifecycle stops while its builder Pod runs: the Pod is left running (not deleted
    at shutdown), the restarted lifecycle adopts that same Pod (one uid, never re-created)
    and records its result."""
    creds = docker_config(
        tmp_path / "config.json", build_registry, AuthConfig(username=USER, password=PASSWORD)
    )
    _registry_secret(cluster, creds)
    base = await _base_image(build_registry, tmp_path)
    lifecycle = cluster.service(
        "sandpod_lifecycle",
        SANDPOD_RUNTIME="kubernetes",
        SANDPOD_RESYNC="0.5",
        SANDPOD_IMAGE_AUTH_FILE=str(creds),
        SANDPOD_POD_NATS_CIDRS="127.0.0.1/32",
        SANDPOD_BUILD_REGISTRY=f"{build_registry.host}/sandpod",
        SANDPOD_BUILD_REGISTRY_SECRET=SECRET,
    )
    await cluster.answering()
    kubelet = cluster.kubelet
    kubelet.hold()  # the builder Pod exists but does not start yet
    name = f"kr-{uuid.uuid4().hex[:6]}"
    async with await AsyncTemplates.connect(
        nats_url=cluster.nats.url, prefix=cluster.prefix
    ) as templates:  # applied only: the build is followed on the store (no API while restarting)
        await templates.apply(Template(name).from_image(base).run("echo adopted").object({}))
    await kubelet.until("the builder Pod", lambda: any(n.startswith(name) for n in kubelet.seen))
    (pod_name,) = [n for n in kubelet.seen if n.startswith(name)]
    events: asyncio.Queue[str] = asyncio.Queue()
    bus = await Bus.connect(BusSettings(url=cluster.nats.url))
    subject = Subjects(cluster.prefix).event("template", name, "build")

    async def on_event(msg: Inbound) -> None:
        await events.put(decode(SandboxEvent, msg.data).message)

    sub = await bus.subscribe(subject, on_event)
    try:
        await asyncio.to_thread(lifecycle.restart)  # SIGTERM, then a new process
        assert pod_name in kubelet.seen  # left running for the next leader
        while not events.empty():  # the old replica's lines (the new one is still starting)
            events.get_nowait()
        async with asyncio.timeout(60):  # the new leader takes the same Pod up (still held)
            while not (await events.get()).startswith(f"builder Pod {NS}/{pod_name} started"):
                pass
    finally:
        await sub.stop()
        await bus.close()
    kubelet.release()
    built = await cluster.until(
        "SandboxTemplate", name, lambda o: o is not None and o.status.get("phase") == "Ready"
    )
    assert built is not None and built.status["image"], built
    assert len(kubelet.uids[pod_name]) == 1  # the same Pod, adopted
    assert len(kubelet.builds) == 1
    await kubelet.until("the builder Pod's deletion", lambda: pod_name not in kubelet.seen)
