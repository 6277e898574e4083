"""``sandpod image pull|ls|rm|prune`` end to end, against a real registry on loopback."""

from __future__ import annotations

import asyncio
import base64
import fcntl
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
from sandpod_image.store import ImageStore

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


def test_two_pulls_in_two_processes_unpack_a_layer_once(
    pushed: str, registry: TestRegistry, tmp_path: Path
) -> None:
    """Two `sandpod image pull`s of one image at once, queued on the base layer's lock (held
    here until both say they wait): exactly one unpacks it, the other finds it done."""
    creds = str(auth_file(tmp_path, registry))
    image = base_image("cli")
    short = image.layer_digests[0][7:19]
    lock = ImageStore(tmp_path / "state" / "images").layout.layer_lock(image.diff_ids[0])
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    procs: list[subprocess.Popen[str]] = []
    env = {**os.environ, "SANDPOD_STATE_DIR": str(tmp_path / "state"), "HOME": str(tmp_path)}
    try:
        seen = []
        try:
            for _ in range(2):
                procs.append(
                    subprocess.Popen(
                        [SANDPOD, "image", "pull", pushed, "--auth-file", creds],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE,
                        text=True,
                        env=env,
                    )
                )
            seen = [_until_waiting(proc, short) for proc in procs]
        finally:
            os.close(fd)
        for proc, lines in zip(procs, seen, strict=True):
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
            lines.extend(err.splitlines())
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    unpacked = [[x for x in lines if short in x and "unpacking" in x] for lines in seen]
    cached = [[x for x in lines if short in x and "cached" in x] for lines in seen]
    assert sorted(len(u) for u in unpacked) == [0, 1]
    assert sorted(len(c) for c in cached) == [0, 1]


def _until_waiting(proc: subprocess.Popen[str], short: str) -> list[str]:
    """The process's progress lines up to the one saying it waits for layer ``short``."""
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if short in line and "waiting" in line:
            return lines
    pytest.fail(f"the pull never waited on the held layer lock: {lines}")
