"""Two installations on one host (finding 5 of issue 12), attacked as a second `sandpod up`.

A second installation with its own state dir must not see the first one's sandboxes (no
orphan sweep of them, no shared cgroups, no shared uids), and stopping it must leave the first
one's sandboxes alive; a second `sandpod up` on the *same* state dir must refuse at once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sysconfig
import time
from pathlib import Path

import psutil
import pytest

from conftest import free_port
from sandpod_lifecycle.runtime.installation import Installation

SANDPOD = str(Path(sysconfig.get_path("scripts")) / "sandpod")
READY_LINE = "Ctrl-C stops everything"


class Up:
    """One `sandpod up` (no gateway) on its own state dir and NATS port."""

    def __init__(self, state: Path, registry: Path) -> None:
        self.state, self.port = state, free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "SANDPOD_RESYNC": "0.3",
            "SANDPOD_LOG_LEVEL": "debug",
            "SANDPOD_UID_REGISTRY": str(registry),
        }
        self.proc = subprocess.Popen(
            [SANDPOD, "up", "--state-dir", str(state), "--port", str(self.port), "--no-gateway"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.output = ""

    def wait_ready(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output += line
            if READY_LINE in line:
                return
        pytest.fail(f"`sandpod up` on {self.state} exited early:\n{self.output}")

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "SANDPOD_NATS_URL": self.url, "SANDPOD_STATE_DIR": str(self.state)}
        return subprocess.run([SANDPOD, *args], env=env, capture_output=True, text=True, timeout=60)

    def sh(self, sandbox: str, script: str) -> str:
        run = self.cli("exec", sandbox, "--", "sh", "-c", script)
        assert run.returncode == 0, f"exec in {sandbox} on {self.state}: {run.stderr}"
        return run.stdout

    def holder(self, sandbox: str) -> int:
        """The pid of the sandbox's jail holder (alive: the same jail as before)."""
        data = json.loads((self.state / "jails" / sandbox / "jail.json").read_text())
        pid = int(data["holder_pid"])
        assert psutil.pid_exists(pid), f"{sandbox}'s holder {pid} on {self.state} is gone"
        return pid

    def resyncs(self) -> int:
        return (self.state / "logs" / "lifecycle.log").read_text().count("reconcile_start")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            assert self.proc.wait(60) == 0, self.proc.stdout.read() if self.proc.stdout else ""

    def kill(self) -> None:
        """After a failure: the supervisor's group, then the execds it started (own sessions)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        for record in (self.state / "instances").glob("*.json"):
            try:
                proc = psutil.Process(int(json.loads(record.read_text())["pid"]))
                if "sandpod_execd" in " ".join(proc.cmdline()):
                    proc.kill()
                    proc.wait(10)
            except (OSError, ValueError, KeyError, psutil.Error):
                continue


def _wait(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def _cgroup_dirs(state: Path) -> list[Path]:
    """The installation's cgroup parent in every hierarchy where it exists."""
    parent = Installation.claim("sandpod", state, None).cgroup_parent
    return [p for p in Path("/sys/fs/cgroup").glob(f"*/{parent}") if p.is_dir()]


@pytest.fixture
def root() -> None:
    if os.geteuid() != 0:
        pytest.skip("namespace jails with their own uids need root (run the suite as root)")


@pytest.mark.usefixtures("root")
def test_a_second_installation_never_touches_the_first(tmp_path: Path) -> None:
    """Two `sandpod up` on different state dirs (same prefix, same sandbox name `default`):
    each keeps its sandboxes and exec works in both while the second sweeps for orphans, their
    uids come from different ranges, and stopping the second leaves the first's alive."""
    registry = tmp_path / "uid-ranges.json"
    first = Up(tmp_path / "one", registry)
    second: Up | None = None
    try:
        first.wait_ready()
        assert first.cli("create", "--name", "keep-one", "--permanent").returncode == 0
        holders = {s: first.holder(s) for s in ("default", "keep-one")}
        uid_one = int(first.sh("default", "id -u"))

        second = Up(tmp_path / "two", registry)
        second.wait_ready()  # today's main: its `default` crash-loops, it never gets ready
        start = second.resyncs()
        _wait(lambda: second.resyncs() > start + 10, 60, "the second lifecycle's resyncs")
        for sandbox in ("default", "keep-one"):  # not destroyed as the second's orphans
            assert first.holder(sandbox) == holders[sandbox]
            assert first.sh(sandbox, "echo one") == "one\n"
        assert second.sh("default", "echo two") == "two\n"
        uid_two = int(second.sh("default", "id -u"))
        assert uid_one != uid_two
        slots = json.loads(registry.read_text())["slots"]
        assert len(slots) == 2  # two ranges of 65536 uids: disjoint
        assert {
            int(k) * 65536 + 2**30 <= uid_one < (int(k) + 1) * 65536 + 2**30 for k in slots
        } == {True, False}

        second.stop()  # destroy-on-exit: its own sandboxes only
        for sandbox in ("default", "keep-one"):
            assert first.holder(sandbox) == holders[sandbox]
            assert first.sh(sandbox, "echo still") == "still\n"
        assert not (tmp_path / "two" / "jails" / "default" / "jail.json").exists()
        assert _cgroup_dirs(second.state) == []  # it left no cgroup of its own behind
        assert _cgroup_dirs(first.state)  # and removed none of the first's
        first.stop()
        assert _cgroup_dirs(first.state) == []
    finally:
        for up in (second, first):
            if up is not None:
                up.kill()


@pytest.mark.usefixtures("root")
def test_a_second_up_on_the_same_state_dir_refuses_at_once(tmp_path: Path) -> None:
    """A second `sandpod up` on a state dir in use exits 1 with a message naming the running
    one, starts nothing and stops nothing: the first one's sandbox keeps serving."""
    registry = tmp_path / "uid-ranges.json"
    first = Up(tmp_path / "one", registry)
    try:
        first.wait_ready()
        holder = first.holder("default")
        again = subprocess.run(
            [
                SANDPOD,
                "up",
                "--state-dir",
                str(first.state),
                "--port",
                str(free_port()),
                "--no-gateway",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ, "SANDPOD_UID_REGISTRY": str(registry)},
        )
        assert again.returncode == 1, again.stdout + again.stderr
        assert "already running on the state dir" in again.stderr
        assert f"pid {first.proc.pid}" in again.stderr and "--state-dir" in again.stderr
        assert "starting" not in again.stdout  # refused before starting anything
        assert first.holder("default") == holder
        assert first.sh("default", "echo alive") == "alive\n"
        first.stop()
    finally:
        first.kill()
