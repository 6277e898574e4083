"""Template builds through a real lifecycle (SANDPOD_RUNTIME=local) on a real nats-server.

Every build here starts from a base made of a few host programs (``buildbase``), never the host
root, so what a ``run`` step or a sandbox of the result sees is exactly the base plus the
build's layers. Builder sandboxes are counted from the lifecycle's own log (``jail_created``
with a ``build-`` id): a cache hit must create none. Needs root (the local runtime).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from buildbase import minimal_rootfs
from test_lifecycle import Lifecycle, _ready_api, lifecycles  # noqa: F401 - fixture used by name
from test_pools import LIFECYCLE_ENV, POOL_ENV, Platform, available, platform  # noqa: F401

from operator_nats import OperatorNats
from registry import TestRegistry
from runnable_image import docker_config, files_layer, push, runnable_base, tar_of
from sandpod import AsyncSandbox
from sandpod.control import api_call
from sandpod.errors import BuildFailed, ResourceNotFound, SandpodError
from sandpod.templates import AsyncTemplates, Template, TemplateInfo
from sandpod_bus import Bus, BusSettings
from sandpod_contract.messages.sandboxes import ObjectReply, Ref
from sandpod_contract.subjects import Subjects
from sandpod_image.auth import AuthConfig
from sandpod_image.store import ImageStore
from sandpod_lifecycle.builds.cache import BuildCache
from sandpod_lifecycle.builds.export import export_oci
from sandpod_lifecycle.bus_users import embedded_users

LOCAL_ENV = {**LIFECYCLE_ENV, "SANDPOD_DESTROY_ON_EXIT": "true"}  # the jails go with it

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the local runtime needs root: run the suite as root, as CI does"
)


def builders_created(lc: Lifecycle) -> int:
    """Builder sandboxes the lifecycle has created so far (its JSON log lines)."""
    count = 0
    for line in lc.log.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") == "jail_created" and entry.get("sandbox_id", "").startswith(
            "build-"
        ):
            count += 1
    return count


async def build(lc: Lifecycle, template: Template, logs: list[str]) -> TemplateInfo:
    async with await AsyncTemplates.connect(nats_url=lc.url, prefix=lc.prefix) as client:
        return await client.build(template, on_log=logs.append, timeout=300)


def _layer(lc: Lifecycle, key: str) -> os.stat_result:
    return (lc.state / "images" / "build" / key / "fs").stat()


async def test_a_build_runs_copies_and_configures_and_its_sandboxes_see_it(
    lifecycles: Callable[..., Lifecycle],  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    """run, copy, env and workdir steps: a sandbox of the template sees the files and env."""
    lc = lifecycles(SANDPOD_RUNTIME="local")
    await _ready_api(lc)
    base = minimal_rootfs(tmp_path / "rootfs")
    app = tmp_path / "app"
    (app / "lib").mkdir(parents=True)
    (app / "main.txt").write_text("from the client\n")
    (app / "lib" / "deep.txt").write_text("nested\n")
    t = Template("data").run("mkdir -p /tmp/scratch && echo scratch > /tmp/scratch/x")
    t.workdir("/app").copy(app, "/app").env(GREETING="hello", MODE="test")
    t.run('echo "$GREETING from $(pwd)" > /app/greeting && echo wrote-greeting')
    t.spec_extra = {"rootfs": str(base)}
    logs: list[str] = []
    info = await build(lc, t, logs)
    assert info.phase == "Ready" and len(info.layers) == 6, info  # base + 5 steps
    assert "  | wrote-greeting" in logs and "step 5/5" in logs[-1], logs
    sbx = await AsyncSandbox.create(template="data", nats_url=lc.url, prefix=lc.prefix, wait=60)
    async with sbx:
        r = await sbx.exec("/workspace", "cat /app/greeting /app/main.txt /app/lib/deep.txt")
        assert (r.exit_code, r.stdout) == (0, "hello from /app\nfrom the client\nnested\n"), r
        r = await sbx.exec("/workspace", 'echo "$GREETING $MODE"; ls /tmp/scratch')
        assert r.stdout == "hello test\n" and r.exit_code != 0, r  # /tmp is never an image's
        await sbx.kill()


async def test_a_run_step_sees_nothing_of_the_host(
    lifecycles: Callable[..., Lifecycle],  # noqa: F811
    tmp_path: Path,
) -> None:
    """The builder is a jail like any sandbox: host directories, the lifecycle's state and the
    test's own files are absent from inside a run step (the attack: list and read them)."""
    lc = lifecycles(SANDPOD_RUNTIME="local")
    await _ready_api(lc)
    secret = tmp_path / "host-secret"
    secret.write_text("host only\n")
    probe = " ".join(
        f"ls -d {p} >/dev/null 2>&1 && echo LEAK {p};"
        for p in ("/work", "/home", "/root", "/srv", "/opt", "/var", str(tmp_path), str(lc.state))
    )
    t = Template("probe").run(f"{probe} cat {secret} 2>/dev/null; id -u; echo probed")
    t.spec_extra = {"rootfs": str(minimal_rootfs(tmp_path / "rootfs"))}
    logs: list[str] = []
    await build(lc, t, logs)
    output = [line for line in logs if line.startswith("  | ")]
    assert output[-1] == "  | probed" and not any("LEAK" in x for x in output), output
    assert not any("host only" in x for x in output)
    assert output[-2] != "  | 0", "a run step must not run as root"


async def test_a_cache_hit_skips_work_and_a_changed_step_rebuilds_only_from_there(
    lifecycles: Callable[..., Lifecycle],  # noqa: F811
    tmp_path: Path,
) -> None:
    """Re-applying with an unchanged prefix reuses its layers (same keys, same inodes, no
    builder sandbox); a changed step and those after it are rebuilt."""
    lc = lifecycles(SANDPOD_RUNTIME="local")
    await _ready_api(lc)
    base = str(minimal_rootfs(tmp_path / "rootfs"))

    def template(last: str, idle: int = 900) -> Template:
        t = Template("cached").workdir("/w").run("echo one > /w/one").run(last)
        t.spec_extra = {"rootfs": base, "idleTimeoutSeconds": idle}
        return t

    first = await build(lc, template("echo two > /w/two"), [])
    made = builders_created(lc)
    assert made == 2
    before = _layer(lc, first.layers[2])
    logs: list[str] = []
    again = await build(lc, template("echo two > /w/two", idle=600), logs)  # a new generation
    assert again.result_key == first.result_key and builders_created(lc) == made
    assert [x.endswith("(cached)") for x in logs if x.startswith("step")] == [True] * 3, logs
    changed_logs: list[str] = []
    changed = await build(lc, template("echo three > /w/three"), changed_logs)
    assert changed.layers[:3] == first.layers[:3] and changed.result_key != first.result_key
    assert builders_created(lc) == made + 1  # only the changed step ran
    steps = [x for x in changed_logs if x.startswith("step")]
    assert steps[0].endswith("(cached)") and steps[1].endswith("(cached)"), steps
    assert steps[2].endswith("(running)"), steps
    after = _layer(lc, first.layers[2])
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


async def test_a_failing_step_fails_the_template_naming_the_step(
    lifecycles: Callable[..., Lifecycle],  # noqa: F811
    tmp_path: Path,
) -> None:
    """A run step exiting non-zero: BuildFailed with the step, exit code and log tail; the
    template's status is Failed with failedStep, and no sandbox can be made from it."""
    lc = lifecycles(SANDPOD_RUNTIME="local")
    await _ready_api(lc)
    t = Template("broken").run("echo fine").run("echo going down; exit 3").run("echo never")
    t.spec_extra = {"rootfs": str(minimal_rootfs(tmp_path / "rootfs"))}
    with pytest.raises(BuildFailed) as info:
        await build(lc, t, [])
    assert info.value.details["step"] == 2 and "exited with 3" in info.value.message
    assert "going down" in str(info.value.details["log_tail"])
    async with await AsyncTemplates.connect(nats_url=lc.url, prefix=lc.prefix) as client:
        got = await client.get("broken")
    assert got.phase == "Failed" and got.object["status"]["failedStep"] == 2
    cond = next(c for c in got.object["status"]["conditions"] if c["type"] == "Built")
    assert (cond["status"], cond["reason"]) == ("False", "template.build_failed")


async def test_a_dockerfile_builds_with_the_cli(
    lifecycles: Callable[..., Lifecycle],  # noqa: F811
    tmp_path: Path,
) -> None:
    """``sandpod template build --dockerfile``: ARG, ENV, WORKDIR, COPY and RUN on a base
    template; the progress is printed and a sandbox of it sees the result."""
    lc = lifecycles(SANDPOD_RUNTIME="local")
    await _ready_api(lc)
    base = Template("base")
    base.spec_extra = {"rootfs": str(minimal_rootfs(tmp_path / "rootfs"))}
    await build(lc, base, [])
    context = tmp_path / "ctx"
    (context / "src").mkdir(parents=True)
    (context / "src" / "a.txt").write_text("A\n")
    (context / "Dockerfile").write_text(
        "# a comment\n"
        "ARG FLAVOUR=plain\n"
        "FROM template:base\n"
        "ARG FLAVOUR\n"
        "ENV APP_HOME=/srv/app \\\n"
        "    LEVEL=3\n"
        "WORKDIR $APP_HOME\n"
        "COPY src/ ./\n"
        'RUN ["sh", "-c", "echo $FLAVOUR-$LEVEL > flavour"]\n'
        "EXPOSE 8080\n"
    )
    env = {**os.environ, "SANDPOD_NATS_URL": lc.url, "SANDPOD_PREFIX": lc.prefix}
    out = subprocess.run(
        [
            *(sys.executable, "-m", "sandpod", "template", "build", "--dockerfile"),
            *(str(context / "Dockerfile"), "-t", "fromdocker", "--build-arg", "FLAVOUR=spicy"),
            str(context),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "step 4/4 run" in out.stdout and "is Ready" in out.stdout, out.stdout
    assert "EXPOSE ignored" in out.stderr
    sbx = await AsyncSandbox.create(
        template="fromdocker", nats_url=lc.url, prefix=lc.prefix, wait=60
    )
    async with sbx:
        r = await sbx.exec("/workspace", "cat /srv/app/a.txt /srv/app/flavour; echo $LEVEL")
        assert (r.exit_code, r.stdout) == (0, "A\nspicy-3\n3\n"), r
        await sbx.kill()


def test_an_unsupported_instruction_is_a_clear_cli_error(tmp_path: Path) -> None:
    """HEALTHCHECK: the CLI names the instruction and its line, before reaching any server."""
    (tmp_path / "Dockerfile").write_text("FROM default\nRUN true\nHEALTHCHECK CMD true\n")
    out = subprocess.run(
        [
            *(sys.executable, "-m", "sandpod", "template", "build", "--dockerfile"),
            *(str(tmp_path / "Dockerfile"), str(tmp_path)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode != 0
    assert "template.build_unsupported" in out.stderr and "line 3: HEALTHCHECK" in out.stderr


async def test_a_rebuilt_template_rolls_its_warm_pool(
    platform: Platform,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    """A warm pool of a built template: a new build (a new result) replaces its free members,
    and a claim then runs on the new layers."""
    platform.service("sandpod_lifecycle", SANDPOD_RUNTIME="local", **LOCAL_ENV)
    platform.service("sandpod_pool", **POOL_ENV)
    await platform.answering()
    base = str(minimal_rootfs(tmp_path / "rootfs"))

    def template(version: str) -> Template:
        t = Template("py").workdir("/v").run(f"echo {version} > /v/version")
        t.spec_extra = {"rootfs": base}
        return t

    async with await AsyncTemplates.connect(
        nats_url=platform.nats.url, prefix=platform.prefix
    ) as client:
        await client.build(template("1"), timeout=300)
        await platform.pools.create("py", template="py", replicas=2)
        first = await platform.until("SandboxWarmPool", "py", available(2), timeout=90)
        assert first is not None
        await client.build(template("2"), timeout=300)
    rolled = await platform.until(
        "SandboxWarmPool",
        "py",
        lambda o: (
            o is not None
            and o.status.get("templateHash") != first.status["templateHash"]
            and o.status.get("availableReplicas") == 2
        ),
        timeout=90,
    )
    assert rolled is not None
    claimed = await platform.claim(timeout=600)
    assert (await claimed.exec("cat /v/version")).stdout == "2\n"
    await claimed.release()
    await claimed.close()


async def test_a_copy_build_works_with_the_embedded_users_permissions(
    operator_nats: OperatorNats, tmp_path: Path
) -> None:
    """Under ``sandpod up``'s bus users (operator mode): the client uploads a copy step's files
    to the build-context object store and the lifecycle reads them back; nothing is refused."""
    prefix = "tbuildauth"  # fixed: the session server keeps its buckets; one per test
    users = embedded_users(Subjects(prefix), "n1")
    creds = {name: operator_nats.creds(name, users[name]) for name in users}
    env = {
        **os.environ,
        "SANDPOD_NATS_URL": operator_nats.url,
        "SANDPOD_NATS_CREDS": str(creds["lifecycle"]),
        "SANDPOD_EXECD_NATS_CREDS": str(creds["execd"]),
        "SANDPOD_PREFIX": prefix,
        "SANDPOD_STATE_DIR": str(tmp_path / "state"),
        "SANDPOD_NODE": "n1",
        "SANDPOD_RUNTIME": "local",
        "SANDPOD_DESTROY_ON_EXIT": "true",
    }
    (tmp_path / "state").mkdir()
    with (tmp_path / "lifecycle.log").open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sandpod_lifecycle"], env=env, stdout=out, stderr=out
        )
    try:
        files = tmp_path / "files"
        files.mkdir()
        (files / "f.txt").write_text("uploaded\n")
        t = Template("auth").copy(files, "/data").run("cat /data/f.txt")
        t.spec_extra = {"rootfs": str(minimal_rootfs(tmp_path / "rootfs"))}
        settings = BusSettings(url=operator_nats.url, creds=str(creds["client"]))
        bus = await Bus.connect(settings)
        try:
            client = await AsyncTemplates.connect(prefix=prefix, bus=bus)
            await _until_answering(client)
            logs: list[str] = []
            info = await client.build(t, on_log=logs.append, timeout=300)
        finally:
            await bus.close()
        assert info.phase == "Ready" and "  | uploaded" in logs, logs
    finally:
        proc.terminate()
        proc.wait(30)
    assert "Permissions Violation" not in (tmp_path / "lifecycle.log").read_text()


async def _until_answering(client: AsyncTemplates) -> None:
    async with asyncio.timeout(30):
        while True:
            try:
                await client.get("nothing-here")
            except ResourceNotFound:
                return
            except SandpodError:
                await asyncio.sleep(0.05)


async def test_a_built_template_exports_as_an_oci_image(
    lifecycles: Callable[..., Lifecycle],  # noqa: F811
    tmp_path: Path,
) -> None:
    """The result's chain as an OCI layout: umoci unpacks it to the base plus every step's
    files (one an earlier step made and a later one deleted is gone: the whiteout), with the
    build's env and workdir as its config."""
    lc = lifecycles(SANDPOD_RUNTIME="local")
    await _ready_api(lc)
    t = Template("oci").workdir("/app").run("echo made > made && echo gone > gone")
    t.env(MODE="oci").run("rm /app/gone && echo kept > /app/kept")  # a whiteout in this layer
    t.spec_extra = {"rootfs": str(minimal_rootfs(tmp_path / "rootfs"))}
    info = await build(lc, t, [])
    cache = BuildCache(lc.state / "images" / "build")
    export_oci(cache, info.result_key, tmp_path / "layout", ref="oci")
    bundle = tmp_path / "bundle"
    subprocess.run(
        ["umoci", "unpack", "--image", f"{tmp_path / 'layout'}:oci", str(bundle)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    root = bundle / "rootfs"
    assert (root / "app" / "made").read_text() == "made\n"
    assert (root / "app" / "kept").read_text() == "kept\n"
    assert not (root / "app" / "gone").exists() and (root / "usr" / "bin" / "sh").exists()
    config = json.loads((bundle / "config.json").read_text())
    assert "MODE=oci" in config["process"]["env"] and config["process"]["cwd"] == "/app"


@pytest.fixture(scope="module")
def image_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestRegistry]:
    reg = TestRegistry(tmp_path_factory.mktemp("registry"), users={"builder": "pw"})
    reg.start()
    yield reg
    reg.stop()


async def test_a_build_from_an_image_stacks_its_steps_on_the_image_and_follows_its_digest(
    lifecycles: Callable[..., Lifecycle],  # noqa: F811 - the fixture imported above
    image_registry: TestRegistry,
    tmp_path: Path,
) -> None:
    """``from: {image}`` pulls through the node's store: a sandbox of the built template sees
    the image's files and Env under the steps' results; a rebuild of the same digest is all
    cache hits (another template of the same steps creates no builder); once the tag is pushed
    again (a new digest) the same steps build anew. A template is built once per generation:
    the tag is resolved when it is built, never behind its back."""
    auth = AuthConfig(username="builder", password="pw")
    runnable_base(tmp_path / "base")
    layers = [tar_of(tmp_path / "base"), files_layer({"app/hello": b"from the image\n"})]
    config = {"Env": ["PATH=/bin", "GREETING=image-env"], "WorkingDir": "/app"}
    ref = await asyncio.to_thread(
        push,
        image_registry,
        "build/base",
        "v1",
        layers,
        config=config,
        work=tmp_path / "b1",
        auth=auth,
    )
    creds = docker_config(tmp_path / "config.json", image_registry, auth)
    lc = lifecycles(SANDPOD_RUNTIME="local", SANDPOD_IMAGE_AUTH_FILE=str(creds))
    await _ready_api(lc)
    t = Template("onimage").from_image(ref).workdir("/data")
    t.run('echo "$GREETING built" > /data/step')
    info = await build(lc, t, [])
    assert info.phase == "Ready", info
    sbx = await AsyncSandbox.create(template="onimage", nats_url=lc.url, prefix=lc.prefix, wait=60)
    async with sbx:
        r = await sbx.exec("/workspace", "cat /app/hello /data/step; echo $GREETING")
        assert (r.exit_code, r.stdout) == (0, "from the image\nimage-env built\nimage-env\n"), r
        await sbx.kill()
    before = builders_created(lc)
    again = await build(
        lc,
        Template("same")
        .from_image(ref)
        .workdir("/data")
        .run('echo "$GREETING built" > /data/step'),
        [],
    )
    assert again.result_key == info.result_key and builders_created(lc) == before
    layers[1] = files_layer({"app/hello": b"pushed again\n"})
    await asyncio.to_thread(
        push,
        image_registry,
        "build/base",
        "v1",
        layers,
        config=config,
        work=tmp_path / "b2",
        auth=auth,
    )
    rebuilt = await build(
        lc,
        Template("repushed")
        .from_image(ref)
        .workdir("/data")
        .run('echo "$GREETING built" > /data/step'),
        [],
    )
    assert rebuilt.phase == "Ready" and rebuilt.result_key != info.result_key, rebuilt
    assert builders_created(lc) == before + 1  # the run step, on the new image
    # Deleted, the templates let go of their base image: a prune may take its layers.
    async with await AsyncSandbox.connect("x", nats_url=lc.url, prefix=lc.prefix) as s:
        for name in ("onimage", "same", "repushed"):
            await api_call(s.bus, s.subjects, "templates", "delete", Ref(name=name), ObjectReply)
    store = ImageStore(lc.state / "images")
    deadline = asyncio.get_running_loop().time() + 30
    while any(h.startswith("template-") for i in store.list() for h in i.holders):
        assert asyncio.get_running_loop().time() < deadline, [i.holders for i in store.list()]
        await asyncio.sleep(0.05)
