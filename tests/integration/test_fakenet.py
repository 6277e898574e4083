"""The fake internet's own hygiene: what a killed test run leaves is removed by the next one,
and a fake internet another process still uses is never touched (``tests/fakenet.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fakenet import FakeNet

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the fake internet needs root (netns, veth, routes): run as root"
)

OWNER = """
import sys
sys.path.insert(0, sys.argv[1])
from fakenet import FakeNet
net = FakeNet(ipv6=True)
net.create()
print(net.netns, flush=True)
sys.stdin.read()
"""


def _owner() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(Path(__file__).parents[1])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    if proc.stdout is None:
        raise RuntimeError("no stdout")
    name = proc.stdout.readline().strip()
    if not name.startswith("fn"):
        proc.kill()
        raise RuntimeError(f"the owner did not create a fake internet: {name!r}")
    return proc, name


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _metadata6_routes(name: str) -> list[str]:
    out = subprocess.run(
        ["ip", "-6", "route", "show", "table", "all"], capture_output=True, text=True
    ).stdout
    return [r for r in out.splitlines() if "fd00:ec2::254" in r and f"dev {name}h" in r]


def test_a_killed_runs_fake_internet_is_removed_and_a_live_one_kept() -> None:
    """SIGKILL the process owning one fake internet: its namespace, server and routes to the
    shared metadata address stay (nothing closed them). The next FakeNet created removes
    them, and leaves alone the one a live process owns."""
    dead, dead_name = _owner()
    live, live_name = _owner()
    try:
        dead.kill()
        dead.wait()
        assert dead_name in _namespaces() and _metadata6_routes(dead_name)
        with FakeNet() as net:
            names = _namespaces()
            assert dead_name not in names and _metadata6_routes(dead_name) == []
            assert live_name in names and net.netns in names and _metadata6_routes(live_name)
    finally:
        for proc in (dead, live):
            if proc.poll() is None and proc.stdin is not None:
                proc.stdin.close()  # the live owner closes nothing: the next create reaps it
                proc.kill()
                proc.wait()
        with FakeNet():  # reaps the live owner's, now dead
            assert live_name not in _namespaces()
