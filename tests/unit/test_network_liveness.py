"""The liveness locks installations judge each other by (``network/liveness.py``), held by real
processes: a running installation is never judged dead, a dead one is, and one starting while
another reaps it waits, then holds a lock on a file everyone else can still open."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from sandpod_lifecycle.network import liveness

HOLDER = """
import sys
from pathlib import Path
from sandpod_lifecycle.network import liveness
liveness.hold(Path(sys.argv[1]), sys.argv[2])
print("held", flush=True)
sys.stdin.read()
"""


def _holder(directory: Path, ident: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(directory), ident],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    if proc.stdout is None or proc.stdout.readline() != "held\n":
        raise RuntimeError("the holder process did not take its lock")
    return proc


def test_a_running_installation_is_never_judged_dead(tmp_path: Path) -> None:
    proc = _holder(tmp_path, "abc123")
    try:
        with liveness.claim_dead(tmp_path, "abc123") as dead:
            assert dead is False
        assert liveness.lock_ids(tmp_path) == ["abc123"]
    finally:
        proc.kill()
        proc.wait()
    with liveness.claim_dead(tmp_path, "abc123") as dead:  # its process died: the lock went
        assert dead is True
        liveness.forget(tmp_path, "abc123")
    assert liveness.lock_ids(tmp_path) == []


def test_without_a_lock_file_nothing_is_judged(tmp_path: Path) -> None:
    with liveness.claim_dead(tmp_path, "old0version") as dead:
        assert dead is False


def test_an_installation_starting_while_it_is_reaped_waits_then_holds_a_live_file(
    tmp_path: Path,
) -> None:
    """The reaper holds the dead one's lock exclusively: the starting one blocks until the
    reaper unlinked the file, then locks a new file, which a second reaper sees as running."""
    fd = liveness.hold(tmp_path, "feed01")
    os.close(fd)  # it crashed
    taken: list[int] = []
    with liveness.claim_dead(tmp_path, "feed01") as dead:
        assert dead is True
        starter = threading.Thread(target=lambda: taken.append(liveness.hold(tmp_path, "feed01")))
        starter.start()
        starter.join(0.5)
        assert starter.is_alive() and taken == []  # waits while the reaper works
        liveness.forget(tmp_path, "feed01")
    starter.join(10)
    assert len(taken) == 1
    try:
        path = tmp_path / "feed01.lock"
        assert path.exists() and os.fstat(taken[0]).st_ino == path.stat().st_ino
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from pathlib import Path; from sandpod_lifecycle.network import "
                "liveness\nwith liveness.claim_dead(Path(sys.argv[1]), 'feed01') as d: print(d)",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        assert proc.stdout.strip() == "False"  # another process sees it running
    finally:
        os.close(taken[0])
