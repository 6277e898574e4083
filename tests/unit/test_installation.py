"""Installation identity and the host-wide uid-range registry (issue 12, finding 5), and the
state dir lock of `sandpod up`: two installations never share a name or a uid."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandpod.statelock import StateDirBusy, hold_state_dir
from sandpod_lifecycle.runtime import installation
from sandpod_lifecycle.runtime.installation import SLOT_SIZE, Installation


def test_each_state_dir_is_its_own_installation(tmp_path: Path) -> None:
    """Same prefix, two state dirs: two cgroup parents and two disjoint uid ranges; the same
    state dir (however spelled) is the same installation, with the same range every time."""
    reg = tmp_path / "reg.json"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = Installation.claim("sandpod", tmp_path / "a", reg)
    b = Installation.claim("sandpod", tmp_path / "b", reg)
    assert a.cgroup_parent != b.cgroup_parent and a.cgroup_parent.startswith("sandpod-sandpod-")
    assert a.uid_base + SLOT_SIZE <= b.uid_base or b.uid_base + SLOT_SIZE <= a.uid_base
    again = Installation.claim("sandpod", tmp_path / "x" / ".." / "a", reg)
    assert again == a
    assert len(json.loads(reg.read_text())["slots"]) == 2


def test_a_taken_preferred_slot_moves_to_the_next_free_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ids that hash to the same slot still get different, disjoint ranges."""
    reg = tmp_path / "reg.json"
    one, two = tmp_path / "s1", tmp_path / "s2"
    one.mkdir()
    two.mkdir()
    ids = {one: "0000000001", two: f"{0x4001:010x}"}  # both: slot 1 of 2**14
    monkeypatch.setattr(installation, "identity", lambda prefix, state: ids[state])
    a, b = Installation.claim("p", one, reg), Installation.claim("p", two, reg)
    assert (a.uid_base - installation.UID_FLOOR) // SLOT_SIZE == 1
    assert b.uid_base == a.uid_base + SLOT_SIZE


def test_a_gone_installations_slot_is_reused_only_when_no_process_has_its_uids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A registered installation whose state dir was removed gives its slot back -- but not
    while a process still runs with one of its uids."""
    reg = tmp_path / "reg.json"
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.setattr(installation, "identity", lambda p, s: "0000000007" if s == gone else "7")
    old = Installation.claim("p", gone, reg)
    gone.rmdir()
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    monkeypatch.setattr(installation, "busy_uids", lambda: {old.uid_base + 3})
    blocked = Installation.claim("p", fresh, reg)
    assert blocked.uid_base != old.uid_base
    monkeypatch.setattr(installation, "busy_uids", set)
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.setattr(installation, "identity", lambda p, s: "0000000007" if s == other else "8")
    assert Installation.claim("p", other, reg).uid_base == old.uid_base


def test_the_state_dir_lock_refuses_a_second_holder(tmp_path: Path) -> None:
    """While one process holds the state dir, another is refused with its pid and what to do;
    once the holder exits the lock is free again (no stale lock after a crash)."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, pathlib; from sandpod.statelock import "
            "hold_state_dir; hold_state_dir(pathlib.Path(sys.argv[1])); print('held', flush=True);"
            " sys.stdin.read()",
            str(tmp_path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(StateDirBusy, match=f"pid {holder.pid}.*--state-dir"):
            hold_state_dir(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    fd = hold_state_dir(tmp_path)  # the killed holder's lock died with it
    os.close(fd)
