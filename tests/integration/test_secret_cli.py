"""``sandpod secret``: the node's injection secrets, set from stdin, never readable by others."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

SANDPOD = [sys.executable, "-m", "sandpod"]


def _run(state: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SANDPOD, "secret", "--state-dir", str(state), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_set_ls_rm_from_stdin_with_owner_only_files(tmp_path: Path) -> None:
    """A value from stdin is stored 0600 in a 0700 directory, listed by name only, removed."""
    done = _run(tmp_path, "set", "openai", stdin="sk-test-value\n")
    assert done.returncode == 0, done.stderr
    assert "sk-test-value" not in done.stdout
    path = tmp_path / "secrets" / "openai"
    assert path.read_text() == "sk-test-value"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    listed = _run(tmp_path, "ls")
    assert listed.stdout.split() == ["openai"]
    assert _run(tmp_path, "rm", "openai").returncode == 0
    assert _run(tmp_path, "ls").stdout.split() == []


def test_a_bad_name_is_refused_with_a_hint(tmp_path: Path) -> None:
    """A name policies could not carry is refused, nothing stored, with what to do next."""
    done = _run(tmp_path, "set", "../escape", stdin="x")
    assert done.returncode == 1
    assert "hint:" in done.stderr
    assert not (tmp_path / "escape").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another local user")
def test_another_local_user_cannot_read_a_secret(tmp_path: Path) -> None:
    """The attack from another local account: reading the stored value fails."""
    state = tmp_path / "state"
    assert _run(state, "set", "tok", stdin="hunter2").returncode == 0
    tmp_path.chmod(0o755)
    state.chmod(0o755)
    probe = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "cat",
            str(state / "secrets" / "tok"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert probe.returncode != 0 and "hunter2" not in probe.stdout
