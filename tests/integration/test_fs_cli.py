"""`sandpod cp` copies files into and out of a sandbox through the real CLI process."""

from __future__ import annotations

import os
import subprocess
import sysconfig
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import Execd, NatsServer

SANDPOD = str(Path(sysconfig.get_path("scripts")) / "sandpod")


Cp = Callable[..., "subprocess.CompletedProcess[bytes]"]


@pytest.fixture
def cp(nats: NatsServer, shared_execd: Execd) -> Cp:
    """Run `sandpod cp ARGS` against the shared sandbox; stdout/stderr captured unless given."""

    def run(
        *args: str, data: bytes | None = None, stderr: int = subprocess.PIPE
    ) -> subprocess.CompletedProcess[bytes]:
        env = {**os.environ, "SANDPOD_NATS_URL": nats.url}
        return subprocess.run(
            [SANDPOD, "cp", *args],
            input=data,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
            timeout=60,
        )

    return run


def test_cp_up_and_down_keeps_bytes_and_mode(cp: Cp, state_dir: Path, tmp_path: Path) -> None:
    """A local file copied in and back out is byte-identical and keeps its mode; a directory
    destination takes the file's name."""
    name = f"cli-{uuid.uuid4().hex[:8]}"
    src = tmp_path / "tool.sh"
    src.write_bytes(b"#!/bin/sh\n\x00\xff binary tail\n")
    src.chmod(0o750)
    r = cp(str(src), f"shared:/workspace/{name}.sh")
    assert r.returncode == 0, r.stderr
    host = state_dir / "workspaces" / "shared" / f"{name}.sh"
    assert host.read_bytes() == src.read_bytes() and host.stat().st_mode & 0o777 == 0o750
    out = tmp_path / "down"
    out.mkdir()
    r = cp(f"shared:{name}.sh", str(out))
    assert r.returncode == 0, r.stderr
    assert (out / f"{name}.sh").read_bytes() == src.read_bytes()
    assert (out / f"{name}.sh").stat().st_mode & 0o777 == 0o750


def test_cp_streams_stdin_and_stdout(cp: Cp, state_dir: Path) -> None:
    """`-` reads stdin into the sandbox and writes a sandbox file to stdout."""
    name = f"cli-{uuid.uuid4().hex[:8]}.bin"
    payload = os.urandom(1_500_000)
    r = cp("-", f"shared:/workspace/{name}", "-m", "600", data=payload)
    assert r.returncode == 0, r.stderr
    host = state_dir / "workspaces" / "shared" / name
    assert host.read_bytes() == payload and host.stat().st_mode & 0o777 == 0o600
    r = cp(f"shared:{name}", "-")
    assert r.returncode == 0 and r.stdout == payload


def test_cp_errors_are_typed_and_exit_codes_distinct(cp: Cp, tmp_path: Path) -> None:
    """A missing sandbox file exits 125 with its code; two local paths are a usage error."""
    r = cp("shared:/workspace/definitely-missing", str(tmp_path / "x"))
    assert r.returncode == 125 and b"error: [fs.not_found]" in r.stderr
    assert not (tmp_path / "x").exists() and list(tmp_path.iterdir()) == []
    r = cp(str(tmp_path), "also-local")
    assert r.returncode == 2 and b"exactly one" in r.stderr


def test_cp_shows_progress_on_a_terminal(cp: Cp, tmp_path: Path) -> None:
    """With stderr on a terminal, a large copy draws a progress line; without, it stays quiet."""
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(9 * 1024 * 1024))
    master, slave = os.openpty()
    try:
        r = cp(str(src), "shared:/workspace/progress.bin", stderr=slave)
        os.close(slave)
        seen = b""
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            seen += data
    finally:
        os.close(master)
    assert r.returncode == 0
    assert b"MiB/s" in seen and b"100.0%" in seen
    quiet = cp(str(src), "shared:/workspace/progress.bin")
    assert quiet.returncode == 0 and quiet.stderr == b""
