"""A template's ``image`` in the local runtime, end to end: registry -> node store -> sandbox.

A real lifecycle (local runtime, real jails) serves a template naming an image in a real
registry on loopback (Debian's docker-registry, htpasswd auth, credentials in a Docker
``config.json`` given by ``SANDPOD_IMAGE_AUTH_FILE``). The image is built here
(tests/runnable_image.py): a runnable base layer made of the host's ``sh`` and coreutils with
their libraries, and an app layer with a whiteout over a base file and an opaque marker over a
base directory; its config sets Env, WorkingDir and Cmd. Sandboxes of it see the image's files
(and nothing of the host), start in its WorkingDir with its Env, share its layers on disk (each
layer unpacked once on the node), and keep them from garbage collection while they live. An
image the registry refuses to give is the Pod's reason, ``ImagePullFailed``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_default_rootfs import Platform, platform  # noqa: F401 - fixture used by name

from registry import TestRegistry
from runnable_image import docker_config, files_layer, push, runnable_base, tar_of
from sandpod import AsyncSandbox
from sandpod.errors import SandpodError
from sandpod_image.auth import AuthConfig
from sandpod_image.store import ImageStore

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the local runtime needs root: run the suite as root, as CI does"
)

USERS = {"agent": "s3cret"}
AGENT = AuthConfig(username="agent", password="s3cret")
CHECKOUT = Path(__file__).resolve().parents[2]


def _app_layer(token: str) -> bytes:
    return files_layer(
        {
            "app/hello": f"hello {token}\n".encode(),
            "etc/.wh.removed-by-app": b"",
            "opt/old/.wh..wh..opq": b"",
            "opt/old/new": b"the app's\n",
        }
    )


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestRegistry]:
    reg = TestRegistry(tmp_path_factory.mktemp("registry"), users=USERS)
    reg.start()
    yield reg
    reg.stop()


@pytest.fixture(scope="module")
def image_ref(registry: TestRegistry, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The test image, pushed: ``<registry>/test/app:<token>``."""
    work = tmp_path_factory.mktemp("image")
    runnable_base(work / "base")
    token = uuid.uuid4().hex[:8]
    config = {"Env": ["PATH=/bin", "GREETING=from-the-image"], "WorkingDir": "/app"}
    config["Cmd"] = ["/bin/sh"]
    layers = [tar_of(work / "base"), _app_layer(token)]
    return push(registry, "test/app", token, layers, config=config, work=work / "blobs", auth=AGENT)


@pytest.fixture
def auth_file(tmp_path: Path, registry: TestRegistry) -> Path:
    return docker_config(tmp_path / "config.json", registry, AGENT)


async def test_a_sandbox_of_an_image_runs_on_its_layers_with_its_config(
    platform: Callable[..., Platform], image_ref: str, auth_file: Path, tmp_path: Path
) -> None:
    """The image's files (a whiteout and an opaque directory applied), its Env and WorkingDir;
    nothing of the host."""
    p = platform(SANDPOD_IMAGE_AUTH_FILE=str(auth_file))
    await p.answering()
    await p.template("app", {"image": image_ref})
    sbx = await p.create("img-one", template="app")
    async with sbx:
        r = await sbx.exec("cat hello; pwd; echo $GREETING; ls /opt/old; ls /etc")
        assert r.exit_code == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].startswith("hello ") and lines[1:4] == ["/app", "from-the-image", "new"]
        assert "removed-by-app" not in r.stdout, r.stdout
        probe = f"ls {CHECKOUT} /usr/lib/python3 /srv 2>&1; true"
        assert (await sbx.exec(probe)).stdout.count("No such file") == 3
        await sbx.kill()


async def test_two_sandboxes_share_one_copy_of_the_layers_kept_while_they_live(
    platform: Callable[..., Platform], image_ref: str, auth_file: Path, tmp_path: Path
) -> None:
    """Each layer is unpacked once on the node, both sandboxes stack the same directories, a
    prune while they live keeps the image, and their writes stay in their own layers."""
    p = platform(SANDPOD_IMAGE_AUTH_FILE=str(auth_file))
    await p.answering()
    await p.template("app", {"image": image_ref})
    one, two = await asyncio.gather(p.create("img-a", "app"), p.create("img-b", "app"))
    async with one, two:
        store = ImageStore(tmp_path / "images")
        layers = sorted((tmp_path / "images" / "layers").rglob("fs"))
        assert len(layers) == 2, layers  # two layers, once each, for two sandboxes
        inode = "stat -c %i /app/hello"
        assert (await one.exec(inode)).stdout == (await two.exec(inode)).stdout
        await one.exec("echo mine > /tmp/x && echo changed > /workspace/w")
        assert (await two.exec("cat /workspace/w 2>&1; true")).stdout.startswith("cat:")
        assert await asyncio.to_thread(store.prune) == 0
        (listed,) = [i for i in store.list() if i.reference.endswith(image_ref.split("/", 1)[1])]
        assert set(listed.holders) == {"img-a", "img-b"}, listed
        await one.kill()
        await two.kill()
    # Destroyed: the image is no longer used, so a prune after removing it frees its layers.
    await _wait_released(store)
    await asyncio.to_thread(store.remove, image_ref)
    assert await asyncio.to_thread(store.prune) > 0
    assert not list((tmp_path / "images" / "layers").rglob("fs"))


async def _wait_released(store: ImageStore) -> None:
    deadline = time.monotonic() + 30
    while any(i.holders for i in store.list()):
        assert time.monotonic() < deadline, [i.holders for i in store.list()]
        await asyncio.sleep(0.05)


async def test_an_image_the_registry_refuses_is_image_pull_failed(
    platform: Callable[..., Platform], image_ref: str, tmp_path: Path
) -> None:
    """Without credentials the auth registry refuses the pull: the Sandbox says
    ``ImagePullFailed`` (retried, as for a Pod), naming the image; nothing is created."""
    p = platform(SANDPOD_IMAGE_AUTH_FILE=str(tmp_path / "none.json"))
    (tmp_path / "none.json").write_text(json.dumps({"auths": {}}))
    await p.answering()
    await p.template("app", {"image": image_ref})
    with pytest.raises(SandpodError):
        await AsyncSandbox.create(
            name="img-denied", template="app", nats_url=p.url, prefix=p.prefix, wait=5
        )
    async with await AsyncSandbox.connect("img-denied", nats_url=p.url, prefix=p.prefix) as sbx:
        ready = (await sbx.describe()).condition("Ready")
    assert ready is not None and ready["status"] == "False", ready
    assert ready["reason"] == "ImagePullFailed" and image_ref in ready["message"], ready
    assert not list((tmp_path / "jails").glob("img-denied/jail.json"))


async def test_a_template_on_a_snapshot_taken_on_an_image_runs_on_that_image(
    platform: Callable[..., Platform], image_ref: str, auth_file: Path
) -> None:
    """A snapshot is a layer over the root it was taken on: a template that names a snapshot
    taken on an image template (and no image of its own) serves sandboxes on that image with
    the snapshot's files -- never the snapshot's layers over the default base."""
    p = platform(SANDPOD_IMAGE_AUTH_FILE=str(auth_file))
    await p.answering()
    await p.template("app-src", {"image": image_ref})
    src = await p.create(f"snap-src-{uuid.uuid4().hex[:6]}", template="app-src")
    async with src:
        r = await src.exec("echo prepared > /workspace/state")
        assert r.exit_code == 0, r.stderr
        snap = await src.snapshot(name=f"img-{uuid.uuid4().hex[:6]}")
        await src.kill()
    await p.template("from-snap", {"snapshotRef": {"name": snap.name}})
    sbx = await p.create(f"snap-use-{uuid.uuid4().hex[:6]}", template="from-snap")
    async with sbx:
        r = await sbx.exec("cat /app/hello /workspace/state; ls /etc")
        assert r.exit_code == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].startswith("hello ") and lines[1] == "prepared", lines
        assert "debian_version" not in r.stdout  # the image's /etc, not the Debian base's
        await sbx.kill()
