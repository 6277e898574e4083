"""``sandpod image pull|ls|rm|prune`` end to end, against a real registry on loopback."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import pty
import subprocess
import sysconfig
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from oci_images import base_image, push_image
from registry import TestRegistry
from sandpod_image.auth import AuthConfig
from sandpod_image.registry import Registry

SANDPOD = str(Path(sysconfig.get_path("scripts")) / "sandpod")
USERS = {"bob": "builder"}


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestRegistry]:
    reg = TestRegistry(tmp_path_factory.mktemp("cli-registry"), users=USERS)
    reg.start()
    yield reg
    reg.stop()


@pytest.fixture
def pushed(registry: TestRegistry, tmp_path: Path) -> str:
    """A two-layer image pushed to the auth registry; its reference."""
    name = f"cli/{uuid.uuid4().hex[:8]}"

    async def push() -> None:
        auth = AuthConfig(username="bob", password="builder")
        async with Registry(registry.host, auth=auth) as reg:
            await push_image(reg, name, "v1", base_image("cli"), tmp_path / "push")

    asyncio.run(push())
    return f"{registry.host}/{name}:v1"


def run(
    tmp: Path, *args: str, stderr: int | None = subprocess.PIPE
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "SANDPOD_STATE_DIR": str(tmp / "state"),
        "HOME": str(tmp),  # no ~/.docker/config.json of the machine's
    }
    env.pop("REGISTRY_AUTH_FILE", None)
    env.pop("DOCKER_CONFIG", None)
    return subprocess.run(
        [SANDPOD, "image", *args],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def auth_file(tmp: Path, registry: TestRegistry) -> Path:
    path = tmp / "config.json"
    token = base64.b64encode(b"bob:builder").decode()
    path.write_text(json.dumps({"auths": {registry.host: {"auth": token}}}))
    return path


def test_pull_without_credentials_fails_typed_and_says_what_to_do(
    pushed: str, tmp_path: Path
) -> None:
    """An auth registry without --auth-file: exit 125, the code, and a hint naming --auth-file."""
    got = run(tmp_path, "pull", pushed)
    assert got.returncode == 125
    assert "error: [image.auth_failed]" in got.stderr
    assert "hint:" in got.stderr and "--auth-file" in got.stderr


def test_pull_ls_rm_prune(pushed: str, registry: TestRegistry, tmp_path: Path) -> None:
    """pull (plain progress lines, -o json), ls (json and table), rm, prune reclaims."""
    creds = str(auth_file(tmp_path, registry))
    got = run(tmp_path, "pull", pushed, "--auth-file", creds, "-o", "json")
    assert got.returncode == 0, got.stderr
    image = json.loads(got.stdout)
    assert image["reference"] == pushed and image["digest"].startswith("sha256:")
    assert image["config"]["cmd"] == ["main.py"]
    assert "layer 1/2" in got.stderr and "done" in got.stderr
    listed = json.loads(run(tmp_path, "ls", "-o", "json").stdout)
    assert [(i["reference"], i["layers"]) for i in listed] == [(pushed, 2)]
    assert pushed in run(tmp_path, "ls").stdout
    again = run(tmp_path, "pull", pushed, "--auth-file", creds)
    assert again.returncode == 0 and "cached" in again.stderr
    assert run(tmp_path, "rm", pushed).returncode == 0
    missing = run(tmp_path, "rm", pushed)
    assert missing.returncode == 125 and "image.not_found" in missing.stderr
    pruned = run(tmp_path, "prune", "-o", "json")
    assert json.loads(pruned.stdout)["reclaimed"] > 0
    assert json.loads(run(tmp_path, "ls", "-o", "json").stdout) == []


def test_pull_on_a_terminal_draws_a_bar_per_layer(
    pushed: str, registry: TestRegistry, tmp_path: Path
) -> None:
    """With stderr on a tty, progress is bars redrawn in place."""
    creds = str(auth_file(tmp_path, registry))
    leader, follower = pty.openpty()
    try:
        got = run(tmp_path, "pull", pushed, "--auth-file", creds, stderr=follower)
        os.close(follower)
        follower = -1
        screen = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the writer side is closed and drained
                break
            if not chunk:
                break
            screen += chunk
    finally:
        if follower != -1:
            os.close(follower)
        os.close(leader)
    assert got.returncode == 0
    text = screen.decode()
    assert "[" + "#" * 30 + "]" in text and "\x1b[" in text
