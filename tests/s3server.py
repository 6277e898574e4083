"""A real S3-compatible server for tests: versitygw over a temp directory, on a free loopback port.

The binary comes from ``deploy/s3test/build.sh`` (``make s3test``; built with Go from the module
proxy and cached under ~/.cache/sandpod/s3test/). A missing binary FAILS the test with the command
to run (never a skip: the S3 store would otherwise go untested unnoticed). versitygw's posix
backend keeps object ``key`` of bucket ``b`` in the file ``<root>/b/<key>``, which is how tests
tamper with a stored object behind the server's back.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
from pathlib import Path

import pytest

from conftest import free_port, wait_until

REPO = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO / "deploy" / "s3test" / "build.sh"
VERSITYGW_VERSION = (REPO / "deploy" / "s3test" / "versitygw-version").read_text().strip()


def versitygw_binary() -> Path:
    """Where build.sh put (or will put) versitygw for the pinned release."""
    if explicit := os.environ.get("SANDPOD_VERSITYGW_BIN"):
        return Path(explicit)
    root = os.environ.get("SANDPOD_S3TEST_DIR") or str(Path.home() / ".cache/sandpod/s3test")
    return Path(root) / f"versitygw-{VERSITYGW_VERSION}" / "bin" / "versitygw"


def missing_binary() -> str | None:
    """None when versitygw is there, else what to run to build it."""
    binary = versitygw_binary()
    if os.access(binary, os.X_OK):
        return None
    return (
        f"versitygw (the real S3 server for the blob-store tests) not found at {binary}: build it "
        f"with `make s3test` (runs {BUILD_SCRIPT.relative_to(REPO)}: Go from the module proxy, "
        "~5 min once, then cached; .ci/run does this)"
    )


class S3Server:
    """One versitygw process serving ``root`` with one root account."""

    def __init__(self, root: Path) -> None:
        if problem := missing_binary():
            pytest.fail(problem)
        self.root = root
        self.port = free_port()
        self.access_key = "sandpod-" + secrets.token_hex(4)
        self.secret_key = secrets.token_hex(16)
        self.log = root.parent / f"versitygw-{self.port}.log"
        self.iam_dir = root.parent / f"versitygw-{self.port}-iam"  # other accounts (add_user)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.iam_dir.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VGW_", "ROOT_"))}
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    str(versitygw_binary()),
                    "--access",
                    self.access_key,
                    "--secret",
                    self.secret_key,
                    "--port",
                    f"127.0.0.1:{self.port}",
                    "--iam-dir",
                    str(self.iam_dir),
                    "posix",
                    str(self.root),
                ],
                stdout=log,
                stderr=log,
                env=env,
            )
        wait_until(self._accepting, 20, f"versitygw on port {self.port}")

    def _accepting(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            pytest.fail(f"versitygw exited with {self.proc.returncode}:\n{self.log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def add_user(self, access_key: str, secret_key: str) -> None:
        """Create another account (role ``user``: it owns nothing and has no grant on the root
        account's buckets), through versitygw's own admin CLI."""
        done = subprocess.run(
            [
                str(versitygw_binary()),
                "admin",
                "--access",
                self.access_key,
                "--secret",
                self.secret_key,
                "--endpoint-url",
                self.endpoint,
                "create-user",
                "--access",
                access_key,
                "--secret",
                secret_key,
                "--role",
                "user",
            ],
            capture_output=True,
            timeout=30,
            check=False,
        )
        if done.returncode != 0:
            pytest.fail(f"versitygw admin create-user failed: {done.stderr.decode()}")

    def object_path(self, bucket: str, key: str) -> Path:
        """The file that holds object ``key`` of ``bucket`` (posix backend)."""
        return self.root / bucket / key

    def kill(self) -> None:
        """SIGKILL: the server vanishes mid-whatever, as a crashed or evicted one does."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
