"""`sandpod up` and the default sandbox root filesystem, through the real CLI processes.

The first run's build itself is the session fixture's (tests/rootfs.py: the same
``sandpod_image.debian.prepare`` the supervisor calls); here the state dir's ``rootfs/`` is that
cache (a symlink), so `sandpod up` takes the path a second run takes: found, reused, passed to
lifecycle, shown in the banner, and what the default sandbox runs on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sysconfig
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import free_port
from rootfs import CACHE
from sandpod.cli.up import _rootfs_line

SANDPOD = str(Path(sysconfig.get_path("scripts")) / "sandpod")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the local runtime needs root: run the suite as root, as CI does"
)


@pytest.fixture
def srv_marker() -> Iterator[Path]:
    marker = Path("/srv") / f"sandpod-test-marker-{uuid.uuid4().hex}"
    marker.write_text("host secret")
    yield marker
    marker.unlink(missing_ok=True)


def _read_until(proc: subprocess.Popen[str], needle: str, limit: int = 200) -> list[str]:
    lines: list[str] = []
    assert proc.stdout is not None
    for _ in range(limit):
        line = proc.stdout.readline()
        if not line:
            pytest.fail(f"`sandpod up` exited early:\n{''.join(lines)}")
        lines.append(line)
        if needle in line:
            return lines
    pytest.fail(f"{needle!r} never printed:\n{''.join(lines)}")


def _up(state: Path, *args: str) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "SANDPOD_DEFAULT_ROOTFS"}
    up = subprocess.Popen(
        [SANDPOD, "up", "--state-dir", str(state), "--port", str(port), "--no-gateway", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    return up, port


def test_up_reuses_the_prepared_base_and_the_default_sandbox_runs_on_it(
    tmp_path: Path, default_rootfs: Path | None, srv_marker: Path
) -> None:
    """A second `sandpod up` finds <state dir>/rootfs's tree (no build), says so, prints it in
    the banner, and the default sandbox is Debian with nothing of the host's /srv."""
    assert default_rootfs is not None, "the session could not build the default rootfs"
    (tmp_path / "rootfs").symlink_to(CACHE)
    up, port = _up(tmp_path)
    try:
        banner = "".join(_read_until(up, "Ctrl-C stops everything"))
        assert "default sandbox root filesystem" in banner and "(reused)" in banner, banner
        assert "building" not in banner
        row = next(line for line in banner.splitlines() if line.strip().startswith("rootfs"))
        assert "Debian bookworm" in row and "MB" in row, row
        net = next(line for line in banner.splitlines() if line.strip().startswith("network"))
        assert "egress under each sandbox's policy" in net, net
        env = {**os.environ, "SANDPOD_NATS_URL": f"nats://127.0.0.1:{port}"}
        env["SANDPOD_STATE_DIR"] = str(tmp_path)
        run = subprocess.run(
            [
                SANDPOD,
                "exec",
                "default",
                "-c",
                f"grep ^ID= /etc/os-release; ls -A /srv {srv_marker}",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.stdout.startswith("ID=debian\n"), (run.stdout, run.stderr)
        assert srv_marker.name not in run.stdout and "host secret" not in run.stdout
        up.send_signal(signal.SIGTERM)
        assert up.wait(60) == 0
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


def test_up_refuses_an_unusable_given_base(tmp_path: Path) -> None:
    """--default-rootfs naming a directory that is no base: exit 1, the reason, nothing started."""
    empty = tmp_path / "empty"
    empty.mkdir()
    up, _ = _up(tmp_path / "state", "--default-rootfs", str(empty))
    out, _ = up.communicate(timeout=60)
    assert up.returncode == 1 and "cannot be a sandbox's base" in out, out
    assert "starting lifecycle" not in out


def test_the_banner_says_host_root_loudly() -> None:
    """The banner's rootfs row: the base, HOST ROOT when the Isolated condition flags it, and
    the host's own for the process runtime."""
    sup = SimpleNamespace(runtime="local", isolation={}, base=SimpleNamespace(summary="Debian x"))
    assert _rootfs_line(sup, "default") == "Debian x"  # type: ignore[arg-type]
    sup.isolation["default"] = "DEGRADED: rootfs: host root (template rootfs: /): ..."
    assert _rootfs_line(sup, "default").startswith("HOST ROOT")  # type: ignore[arg-type]
    sup.runtime = "process"
    assert "process runtime" in _rootfs_line(sup, "default")  # type: ignore[arg-type]
