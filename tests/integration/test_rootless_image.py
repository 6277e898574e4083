"""A template's ``image`` in the ROOTLESS local runtime: registry -> the user's store -> sandbox.

The root variant is test_image_sandbox.py; here the lifecycle runs as the unprivileged test user
(tests/rootless.py), so its image store (``<state>/images``, in the user's own state dir) is
filled without any privilege: the layers are unpacked as that user, whiteouts as 0/0 character
devices (which the kernel lets anyone create) and opaque markers as ``user.overlay.opaque``
(``trusted.*`` needs CAP_SYS_ADMIN), which the jail's overlay reads because it is mounted with
``userxattr``. The image comes from a real registry on loopback behind htpasswd, the
credentials from a Docker ``config.json`` the user owns (``SANDPOD_IMAGE_AUTH_FILE``). The CLI
does the same for a user: ``sandpod image pull`` into its own state dir.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sysconfig
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_rootless import rootless_lifecycle

from conftest import NatsServer
from registry import TestRegistry
from rootless import as_user, ensure_user
from runnable_image import docker_config, files_layer, push, runnable_base, tar_of
from sandpod_image.auth import AuthConfig

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="preparing the unprivileged test user needs root: run the suite as root",
)

AGENT = AuthConfig(username="agent", password="s3cret")
SANDPOD = str(Path(sysconfig.get_path("scripts")) / "sandpod")


@pytest.fixture(scope="module")
def user() -> tuple[int, int]:
    return ensure_user()


@pytest.fixture
def state(user: tuple[int, int]) -> Iterator[Path]:
    # Not under pytest's tmp_path: its parents are root's (mode 0700), closed to the user.
    path = Path("/var/tmp") / f"sandpod-rootless-{uuid.uuid4().hex[:8]}"
    path.mkdir(mode=0o700)
    os.chown(path, *user)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestRegistry]:
    reg = TestRegistry(tmp_path_factory.mktemp("registry"), users={"agent": "s3cret"})
    reg.start()
    yield reg
    reg.stop()


@pytest.fixture(scope="module")
def image_ref(registry: TestRegistry, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A runnable image whose app layer whites out a base file and makes a base directory
    opaque; tagged with a token its ``/app/hello`` holds."""
    work = tmp_path_factory.mktemp("image")
    runnable_base(work / "base")
    token = uuid.uuid4().hex[:8]
    app = files_layer(
        {
            "app/hello": f"hello {token}\n".encode(),
            "etc/.wh.removed-by-app": b"",
            "opt/old/.wh..wh..opq": b"",
            "opt/old/new": b"the app's\n",
        }
    )
    config = {"Env": ["PATH=/bin", "GREETING=rootless"], "WorkingDir": "/app", "Cmd": ["/bin/sh"]}
    layers = [tar_of(work / "base"), app]
    return push(registry, "rl/app", token, layers, config=config, work=work / "b", auth=AGENT)


def _credentials(state: Path, registry: TestRegistry, user: tuple[int, int]) -> Path:
    """The registry's credentials in a file only the user reads."""
    path = docker_config(state / "config.json", registry, AGENT)
    path.chmod(0o600)
    os.chown(path, *user)
    return path


def _unpacked_unprivileged(images: Path, uid: int) -> None:
    """The store's app layer as an unprivileged unpack leaves it: the user's files, the
    whiteout a 0/0 character device, the opaque marker in the ``user.`` namespace."""
    (app,) = [fs for fs in (images / "layers").rglob("fs") if (fs / "app").is_dir()]
    whiteout = os.lstat(app / "etc/removed-by-app")
    assert stat.S_ISCHR(whiteout.st_mode) and whiteout.st_rdev == 0, whiteout
    assert os.getxattr(app / "opt/old", "user.overlay.opaque") == b"y"
    assert "trusted.overlay.opaque" not in os.listxattr(app / "opt/old")
    assert {os.lstat(p).st_uid for p in (app, app / "app/hello", app / "opt/old")} == {uid}


async def test_a_rootless_lifecycle_pulls_an_image_into_its_store_and_runs_it(
    nats: NatsServer,
    state: Path,
    user: tuple[int, int],
    registry: TestRegistry,
    image_ref: str,
) -> None:
    """The unprivileged lifecycle pulls with the user's credentials into its own state dir; the
    sandbox sees the image's files with the whiteout and the opaque directory applied, starts
    in its WorkingDir with its Env, and its writes land in its own upper layer, never in the
    store's layers."""
    token = image_ref.rsplit(":", 1)[1]
    creds = _credentials(state, registry, user)
    async with rootless_lifecycle(nats, state, user, SANDPOD_IMAGE_AUTH_FILE=str(creds)) as rl:
        await rl.apply_template("app", {"image": image_ref})
        sbx = await rl.sandbox("rl-img", template="app")
        async with sbx:
            r = await sbx.exec("cat hello; pwd; echo $GREETING; ls -A /opt/old; ls -A /etc")
            assert r.exit_code == 0, r.stderr
            lines = r.stdout.splitlines()
            assert lines[:4] == [f"hello {token}", "/app", "rootless", "new"], lines
            assert "removed-by-app" not in lines[4:] and "hosts" in lines[4:], lines
            r = await sbx.exec("echo mine > /app/hello && echo more > /opt/old/added; cat hello")
            assert r.stdout == "mine\n", r.stderr
            _unpacked_unprivileged(state / "images", user[0])
            (stored,) = (state / "images" / "layers").rglob("fs/app/hello")
            assert stored.read_text() == f"hello {token}\n"  # the store's layer is untouched
            upper = state / "jails" / "rl-img" / "upper"
            assert [p.read_text() for p in upper.rglob("app/hello")] == ["mine\n"]
            assert [p.read_text() for p in upper.rglob("opt/old/added")] == ["more\n"]
            await sbx.kill()


def test_sandpod_image_pull_as_an_unprivileged_user_fills_its_own_store(
    state: Path, user: tuple[int, int], registry: TestRegistry, image_ref: str
) -> None:
    """`sandpod image pull` run by the user unpacks into its state dir as an unprivileged
    unpack must (the store a rootless `sandpod up` then uses)."""
    creds = _credentials(state, registry, user)
    spare = Path("/run") / f"sandpod-expose-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "HOME": str(state), "SANDPOD_STATE_DIR": str(state / "cli")}
    env.pop("DOCKER_CONFIG", None)
    env.pop("REGISTRY_AUTH_FILE", None)
    pull = ("pull", image_ref, "--auth-file", str(creds), "-o", "json")
    try:
        got = subprocess.run(
            [*as_user(*user, spare), SANDPOD, "image", *pull],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
    finally:
        if spare.exists():
            spare.rmdir()
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["reference"] == image_ref
    _unpacked_unprivileged(state / "cli" / "images", user[0])
