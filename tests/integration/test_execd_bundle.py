"""The execd bundle recipe of deploy/images/execd.Dockerfile, run for real without Docker.

``deploy/images/build-execd-bundle.sh`` is the step the image runs: sandpod-execd and its locked
dependencies as plain packages plus a launcher. Here the bundle's interpreter is this machine's
Python (the image puts a standalone CPython in the same place); execd is started through the
launcher with an empty environment from ``/``, so it can only use what the bundle carries.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from conftest import NatsServer, wait_until
from sandpod import Sandbox
from sandpod.errors import SandpodError

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "images" / "build-execd-bundle.sh"
OWN_PACKAGES = (
    "services/execd/src/sandpod_execd",
    "schemas/python/src/sandpod_contract",
    "libs/bus/src/sandpod_bus",
    "libs/service/src/sandpod_service",
)


def uv_command() -> str:
    """How to run uv here: on PATH, else as the Makefile and .ci/run do (``python3 -m uv``)."""
    return shutil.which("uv") or "python3 -m uv"


def test_execd_bundle_serves_with_nothing_but_its_own_files(
    nats: NatsServer, tmp_path: Path
) -> None:
    """A bundle built by the image's script runs execd alone (env -i, cwd /) and executes."""
    bundle = tmp_path / "opt-sandpod"
    (bundle / "python" / "bin").mkdir(parents=True)
    base_python = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}"
    (bundle / "python" / "bin" / "python3").symlink_to(base_python)
    subprocess.run(
        ["bash", str(SCRIPT), str(bundle / "python" / "bin" / "python3"), str(bundle)],
        cwd=REPO,
        env={**os.environ, "UV": uv_command()},
        check=True,
        timeout=300,
    )
    assert not list((bundle / "site").glob("pytest*")), "dev tools leaked into the bundle"
    for package in OWN_PACKAGES:  # this checkout's code, never a wheel uv built earlier
        for source in (REPO / package).rglob("*.py"):
            built = bundle / "site" / Path(package).name / source.relative_to(REPO / package)
            assert built.read_bytes() == source.read_bytes(), f"stale in the bundle: {built}"
    sid = f"bundle-{uuid.uuid4().hex[:8]}"
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "SANDPOD_NATS_URL": nats.url,
        "SANDPOD_SANDBOX_ID": sid,
        "SANDPOD_STATE_DIR": str(tmp_path / "state"),
    }
    log = tmp_path / "execd.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(bundle / "bin" / "sandpod-execd")], env=env, cwd="/", stdout=out, stderr=out
        )
    try:

        def answers() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"bundled execd exited {proc.returncode}:\n{log.read_text()}")
            try:
                with Sandbox.connect(sid, nats_url=nats.url, connect_timeout=1) as sbx:
                    sbx.ping(timeout=1)
            except SandpodError:
                return False
            return True

        wait_until(answers, 30, "the bundled execd to answer ping")
        with Sandbox.connect(sid, nats_url=nats.url) as sbx:
            result = sbx.exec(["sh", "-c", "echo from-the-bundle"])
        assert (result.stdout, result.exit_code) == ("from-the-bundle\n", 0)
    finally:
        proc.terminate()
        assert proc.wait(15) == 0, log.read_text()
