"""sys.freeze / sys.thaw: execd stops every process it started (and their descendants, also those
that left its tree with setsid) and continues them, without Kubernetes, on a private execd.

The counters are files the processes rewrite in a loop; "stopped" is checked in ``/proc`` (state
T) and by a bystander process outside execd's tree that keeps counting meanwhile -- never by a
sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from conftest import Execd, pids_with
from sandpod import AsyncSandbox
from sandpod.errors import BadRequest, SandboxPaused
from sandpod_contract.messages.common import Empty
from sandpod_contract.messages.system import Freeze, FreezeState

LOOP = "i=0; while :; do i=$((i+1)); echo $i > {path}; sleep 0.02; done"


async def _sys(sbx: AsyncSandbox, verb: str) -> FreezeState:
    msg = Freeze(timeout=5.0) if verb == "freeze" else Empty()
    return await sbx.channel.call("sys", verb, msg, FreezeState, 10.0)


def _count(path: Path) -> int:
    try:
        return int(path.read_text().strip() or 0)
    except (OSError, ValueError):  # not written yet, or caught mid-write
        return 0


async def _until(what: str, done: Callable[[], bool], timeout: float = 15) -> None:
    """Poll a file-backed condition (a counter advancing has no event to wait on)."""
    try:
        async with asyncio.timeout(timeout):
            while not done():
                await asyncio.sleep(0.02)
    except TimeoutError:
        pytest.fail(f"never: {what}")


def _sandbox_pids(sandbox_id: str, execd_pid: int) -> set[int]:
    """Processes (other than execd) whose environment names the sandbox."""
    found = set()
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error):
            if proc.pid != execd_pid and proc.environ().get("SANDPOD_SANDBOX_ID") == sandbox_id:
                found.add(proc.pid)
    return found


@pytest.fixture
def bystander(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A counting process of the test's own, outside every execd's tree."""
    path = tmp_path / "bystander"
    proc = subprocess.Popen(["sh", "-c", LOOP.format(path=path)])
    yield proc, path
    proc.kill()
    proc.wait(10)


def _cgroup_of(pid: int) -> str:
    """The cgroup v2 path of ``pid`` ("" when it has exited meanwhile, e.g. a ``sleep``)."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return next((line[3:].strip() for line in f if line.startswith("0::")), "")
    except OSError:
        return ""


def _check_frozen(state: FreezeState, sid: str, execd_pid: int) -> None:
    """Every command process is frozen the way ``state.mechanism`` says; execd and this test
    are not."""
    members = _sandbox_pids(sid, execd_pid)
    assert len(members) >= 2  # the two loops' shells (and a sleep of each, at times)
    if state.mechanism == "signals":
        assert "observe" in state.detail
        for pid in members:
            assert psutil.Process(pid).status() == psutil.STATUS_STOPPED, pid
    else:  # the cgroup freezer: invisible to them (no SIGSTOP), all in the frozen cgroup
        assert state.mechanism == "cgroup" and "invisible" in state.detail
        for pid in members:
            assert _cgroup_of(pid).endswith(f"/sandpod-freeze-{sid}-{execd_pid}"), pid
            assert psutil.Process(pid).status() != psutil.STATUS_STOPPED, pid
    for pid in (execd_pid, os.getpid()):
        assert "sandpod-freeze" not in _cgroup_of(pid)
        assert psutil.Process(pid).status() != psutil.STATUS_STOPPED


@pytest.mark.parametrize("mode", ["signals", "auto"])
async def test_freeze_stops_every_command_tree_and_thaw_continues_it(
    start_execd: Callable[..., Execd],
    tmp_path: Path,
    bystander: tuple[subprocess.Popen[bytes], Path],
    mode: str,
) -> None:
    """After sys.freeze a background process and a setsid escapee stop counting (SIGSTOPped,
    or in the frozen cgroup with ``auto`` where execd's cgroup v2 is writable) while a process
    outside execd's tree goes on; new commands get sandbox.paused, execd answers pings; after
    sys.thaw (which counts as activity) both counters advance again and commands run."""
    inner, escaped = tmp_path / "inner", tmp_path / "escaped"
    try:
        await _freeze_and_thaw(start_execd, bystander, mode, inner, escaped)
    finally:  # the escapee left execd's tree: nothing else would ever stop it
        for pid in pids_with(str(escaped)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)


async def _freeze_and_thaw(
    start_execd: Callable[..., Execd],
    bystander: tuple[subprocess.Popen[bytes], Path],
    mode: str,
    inner: Path,
    escaped: Path,
) -> None:
    execd = start_execd(SANDPOD_EXECD_FREEZER=mode)
    sid = execd.ids[0]
    outside, outside_path = bystander
    async with await AsyncSandbox.connect(sid, nats_url=execd.nats_url) as sbx:
        proc = await sbx.proc.start(LOOP.format(path=inner))
        # setsid + a parent that exits at once: re-parented to init, out of execd's tree
        await sbx.exec(f"setsid sh -c '{LOOP.format(path=escaped)}' >/dev/null 2>&1 &")
        await _until("both counters run", lambda: _count(inner) > 2 and _count(escaped) > 2)
        assert (await _sys(sbx, "freezer")).frozen is False

        state = await _sys(sbx, "freeze")
        assert state.frozen and state.processes >= 2
        if mode == "signals":
            assert state.mechanism == "signals"
        _check_frozen(state, sid, execd.proc.pid)
        frozen_at = _count(inner), _count(escaped)
        start = _count(outside_path)
        await _until("the bystander counts on", lambda: _count(outside_path) > start + 10)
        assert (_count(inner), _count(escaped)) == frozen_at
        assert psutil.Process(outside.pid).status() != psutil.STATUS_STOPPED

        with pytest.raises(SandboxPaused) as info:
            await sbx.exec("echo hi")
        assert info.value.code == "sandbox.paused" and info.value.retryable
        with pytest.raises(SandboxPaused):
            await sbx.proc.start("true")
        await sbx.ping()  # execd itself serves on
        again = await _sys(sbx, "freeze")  # idempotent
        assert again.frozen and (await _sys(sbx, "freezer")).frozen

        idle_since = (await sbx.activity()).last_activity  # refused commands are no activity
        thawed = await _sys(sbx, "thaw")
        assert not thawed.frozen
        # resuming restarts the idle clock: a long pause cannot expire it on resume
        assert (await sbx.activity()).last_activity > idle_since
        await _until(
            "both counters advance after thaw",
            lambda: _count(inner) > frozen_at[0] and _count(escaped) > frozen_at[1],
        )
        assert (await sbx.exec("echo hi")).stdout == "hi\n"
        assert not any("sandpod-freeze" in _cgroup_of(p) for p in _sandbox_pids(sid, 0))
        await sbx.proc.kill(proc.id)
        await sbx.exec(f"pkill -f '{escaped}' || true")


async def test_thaw_without_freeze_is_a_no_op_and_a_bad_timeout_is_refused(
    start_execd: Callable[..., Execd],
) -> None:
    """sys.thaw on a running sandbox changes nothing; a freeze timeout outside (0, 60] is
    bad_request."""
    execd = start_execd()
    async with await AsyncSandbox.connect(execd.ids[0], nats_url=execd.nats_url) as sbx:
        assert (await _sys(sbx, "thaw")).frozen is False
        with pytest.raises(BadRequest):
            await sbx.channel.call("sys", "freeze", Freeze(timeout=0), FreezeState, 5.0)
        assert (await sbx.exec("echo ok")).stdout == "ok\n"
