"""An instance is owned by its lock, so a replica that dies (or stalls) half-way through
starting an execd never leads to a second execd for the same sandbox (issue 12, finding 10)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path

import psutil
import pytest

from conftest import NatsServer
from sandpod_lifecycle.driver import ExecdLauncher, LauncherBusy


def _execds(state: Path, sandbox_id: str) -> list[int]:
    """pids of every execd on the host serving ``sandbox_id`` for this state dir."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            env = proc.environ()
            if (
                "sandpod_execd" in " ".join(proc.info["cmdline"] or [])
                and env.get("SANDPOD_STATE_DIR") == str(state)
                and env.get("SANDPOD_SANDBOX_ID") == sandbox_id
            ):
                found.append(proc.pid)
    return found


@pytest.fixture
def launchers(nats: NatsServer, tmp_path: Path) -> tuple[ExecdLauncher, ExecdLauncher]:
    """Two replicas' launchers on one host's state dir."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    return (ExecdLauncher(tmp_path, nats.url, prefix), ExecdLauncher(tmp_path, nats.url, prefix))


async def test_an_unrecorded_execd_is_adopted_not_duplicated(
    launchers: tuple[ExecdLauncher, ExecdLauncher], tmp_path: Path
) -> None:
    """A replica killed between spawning an execd and recording it: the other replica finds
    the running execd (it holds the instance's lock) and adopts it instead of starting one."""
    a, b = launchers
    sid = f"l-{uuid.uuid4().hex[:8]}"
    pid = await a.start(sid, {})
    try:
        (tmp_path / "instances" / f"{sid}.json").unlink()  # what the dead replica never wrote
        assert b.pid(sid) is None
        assert await b.start(sid, {}) == pid
        assert _execds(tmp_path, sid) == [pid]
        assert b.pid(sid) == pid  # recorded now: every replica sees it
    finally:
        await b.stop(sid)
    assert _execds(tmp_path, sid) == []
    second = await b.start(sid, {})  # the lock died with it: a new one may start
    try:
        assert _execds(tmp_path, sid) == [second]
    finally:
        await b.stop(sid)


async def test_racing_starts_make_one_execd(
    launchers: tuple[ExecdLauncher, ExecdLauncher], tmp_path: Path
) -> None:
    """Both replicas start the same sandbox at once (a stalled one whose lease passed on):
    one execd; the loser adopts it or is told to retry."""
    a, b = launchers
    sid = f"l-{uuid.uuid4().hex[:8]}"
    try:
        results = await asyncio.gather(a.start(sid, {}), b.start(sid, {}), return_exceptions=True)
        pids = {r for r in results if isinstance(r, int)}
        assert all(isinstance(r, int | LauncherBusy) for r in results), results
        assert len(pids) == 1 and _execds(tmp_path, sid) == list(pids)
    finally:
        await a.stop(sid)
    assert _execds(tmp_path, sid) == []
