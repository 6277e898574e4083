"""execd's commands start with default signal dispositions, whatever execd inherited.

A platform started under ``nohup`` (SIGHUP ignored) or by a job control that ignores SIGINT
would otherwise pass SIG_IGN on to every sandbox command: ignored signals survive fork and exec,
and a shell cannot even trap one it started with ignored (a sandboxed ``trap ... HUP`` then never
runs). Each test runs a fresh interpreter that ignores them the way such a parent would.
"""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import signal, subprocess, sys
for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGUSR1):
    signal.signal(sig, signal.SIG_IGN)
if sys.argv[1] == "execd":
    from sandpod_execd.__main__ import _unignore_signals
    _unignore_signals()
status = subprocess.run(["cat", "/proc/self/status"], capture_output=True, text=True).stdout
print(next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")))
"""


def _ignored_in_child(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip(), 16)


def test_a_command_of_execd_does_not_inherit_ignored_signals() -> None:
    """SIGHUP, SIGINT and SIGUSR1 ignored by execd's parent are default in its commands."""
    mask = _ignored_in_child("execd")
    for signo in (1, 2, 10):  # SIGHUP, SIGINT, SIGUSR1
        assert not mask & (1 << (signo - 1)), f"signal {signo} still ignored: {mask:#x}"


def test_without_the_reset_the_ignored_signals_reach_the_command() -> None:
    """The control: a plain parent that ignores them hands them on (the test above is real)."""
    mask = _ignored_in_child("plain")
    assert mask & 1 and mask & 2, f"{mask:#x}"
