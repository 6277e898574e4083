"""A sandbox that exhausts its own memory, attacked from inside: its jail must survive it.

Pages a sandbox parks in a tmpfs (``/dev/shm``, ``/tmp``) stay charged to its memory cgroup with
no process the OOM killer could kill to free them; once they fill the limit, every allocation in
the cgroup ends in an OOM kill, and the killer takes the largest process it can find. Today's
attack: fill ``/dev/shm`` (and again, and again) until the killer takes the jail's holder, pid 1
of the sandbox, and the whole jail with it. What must hold: ``/dev/shm`` is bounded to a fraction
of the memory limit, and the holder is never a candidate (it waits outside the sandbox's memory
cgroup), so the sandbox is still there -- and answers -- afterwards; a holder killed anyway (from
the host) is reported as lost.
"""

# ruff: noqa: F811 - the jail fixtures come from test_jail by name; pytest passes them back
from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest
from test_jail import Make, make, ok, oom_kills, run, running, runtime, state  # noqa: F401

from sandpod_lifecycle.runtime.base import InstanceStatus, Resources
from sandpod_lifecycle.runtime.local import LocalRuntime

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the local runtime needs root: run the jail tests as root"
)

MiB = 1024 * 1024
ROUNDS = 40  # today's holder died within ~10-20 rounds of the fill below


def _memory_dir(status: InstanceStatus) -> Path:
    """The sandbox's v1 memory cgroup (a hierarchy of its own, which the holder can stay out
    of); on a unified v2 hierarchy the holder can only be spared by oom_score_adj."""
    found = [Path(d) for d in status.cgroups if (Path(d) / "memory.limit_in_bytes").exists()]
    if not found:
        pytest.skip(
            "no cgroup v1 memory hierarchy here: on cgroup v2 the holder shares the "
            "sandbox's memory cgroup (see the holder_oom protection)"
        )
    return found[0]


def _members(cgroup: Path) -> set[int]:
    return {int(p) for p in (cgroup / "cgroup.procs").read_text().split()}


async def _storm(status: InstanceStatus, command: str) -> int:
    """Run ``command`` (a fill) again and again inside the sandbox; the rounds the holder lived."""
    assert status.holder_pid is not None
    for done in range(ROUNDS):
        if not running(status.holder_pid):
            return done
        await run(status, command, timeout=60)
    return ROUNDS if running(status.holder_pid) else ROUNDS - 1


async def test_filling_dev_shm_stops_at_its_size_and_kills_nothing(make: Make) -> None:
    """/dev/shm holds a quarter of the memory limit: filling it ends in ENOSPC for the writer,
    not in the OOM killer, however often it is tried; the jail and its commands carry on."""
    st = await make(resources=Resources(memory_bytes=64 * MiB))
    assert st.holder_pid is not None
    size = await ok(st, "df -B1 --output=size /dev/shm | tail -1")
    assert int(size) == 16 * MiB
    full = await run(st, "dd if=/dev/zero of=/dev/shm/fill bs=1M count=200")
    assert full.returncode == 1 and b"No space left on device" in full.stderr.value()
    assert await _storm(st, "cat /dev/zero > /dev/shm/fill$$") == ROUNDS
    assert oom_kills(st) == 0
    assert running(st.holder_pid)
    assert await ok(st, "echo alive; cat /proc/self/oom_score_adj") == "alive\n0\n"


async def test_sysv_shared_memory_is_bounded_like_dev_shm(make: Make) -> None:
    """SysV segments outlive their processes like /dev/shm files: the sandbox's ipc namespace
    holds at most a quarter of the memory limit of them (a segment past it is refused), and
    the host's limits are untouched."""
    st = await make(resources=Resources(memory_bytes=64 * MiB))
    host = Path("/proc/sys/kernel/shmmax").read_text()
    out = await run(st, "ipcmk -M 8M && ipcmk -M 8M && ipcmk -M 1M; ipcmk -M 20M; ipcs -m")
    refused = out.stderr.value().decode()
    assert refused.count("ipcmk: create share memory failed") == 2, refused
    assert out.stdout.value().decode().count("sandbox") == 2  # the two 8 MiB ones
    assert Path("/proc/sys/kernel/shmmax").read_text() == host
    assert oom_kills(st) == 0


@pytest.mark.parametrize("storm", ["tmpfs", "anonymous"])
async def test_an_oom_storm_inside_never_kills_the_holder(
    make: Make, runtime: LocalRuntime, storm: str
) -> None:
    """A sandbox that fills its memory until every command is OOM-killed, round after round,
    never takes its holder with it: the holder is outside the sandbox's memory cgroup. ``tmpfs``:
    pages parked in /tmp on a host that cannot give a disk quota (there /tmp is a tmpfs charged
    to memory, the storm that killed holders on main); ``anonymous``: a process buffering an
    endless line. Given memory again, the same sandbox answers."""
    if storm == "tmpfs":
        runtime._disk_quota = "unavailable: this test plays a host without loop devices"
    st = await make(resources=Resources(memory_bytes=64 * MiB))
    assert st.holder_pid is not None
    memory = _memory_dir(st)
    assert st.holder_pid not in _members(memory)
    assert st.protections["holder_oom"] == "active"
    fill = "cat /dev/zero > /tmp/fill$$" if storm == "tmpfs" else "tail /dev/zero"
    assert await _storm(st, fill) == ROUNDS
    assert oom_kills(st) >= 1, "the storm never reached the OOM killer: the test proves nothing"
    assert running(st.holder_pid)
    status = await runtime.inspect(st.sandbox_id)
    assert status.running and not status.lost
    # The operator's remedy for a wedged sandbox (more memory) works: it is alive, not lost.
    for name in ("memory.memsw.limit_in_bytes", "memory.limit_in_bytes"):  # memsw >= limit
        if (memory / name).exists():
            (memory / name).write_text(str(128 * MiB))
    assert await ok(st, "rm -f /tmp/fill*; echo alive") == "alive\n"


async def test_a_holder_killed_from_the_host_is_reported_lost(
    make: Make, runtime: LocalRuntime
) -> None:
    """SIGKILL to the holder from the host: the instance is lost (not OOM-killed), every
    process of the jail is gone with it, and destroy still cleans up."""
    st = await make(resources=Resources(memory_bytes=64 * MiB))
    assert st.holder_pid is not None
    await ok(st, "setsid sleep 300 >/dev/null 2>&1 < /dev/null &")
    holder = psutil.Process(st.holder_pid)
    os.kill(st.holder_pid, signal.SIGKILL)
    holder.wait(10)
    status = await runtime.inspect(st.sandbox_id)
    assert status.exists and status.lost and not status.running and not status.oom_killed
    assert status.detail == "holder exited"


async def test_commands_never_inherit_a_negative_oom_score_adj(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sandbox's commands start at oom_score_adj 0 even when execd runs below it (a service
    manager's OOMScoreAdjust=-1000), through the C entry helper and the sh fallback alike:
    once unprivileged, a process could never raise its own protection back to fair."""
    st = await make()
    own = Path("/proc/self/oom_score_adj")
    try:
        own.write_text("-1000")
    except PermissionError:
        pytest.skip(
            "this host refuses to lower oom_score_adj (no CAP_SYS_RESOURCE): run the jail "
            "tests as a root with CAP_SYS_RESOURCE to test the inheritance"
        )
    try:
        assert await ok(st, "cat /proc/self/oom_score_adj") == "0\n"
        monkeypatch.setattr("sandpod_execd.jail._fast_entry", lambda: None)
        assert await ok(st, "cat /proc/self/oom_score_adj") == "0\n"
    finally:
        own.write_text("0")
