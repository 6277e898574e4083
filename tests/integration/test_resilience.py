"""Failures around execd and NATS: typed errors promptly, never a hang; reconnects work."""

from __future__ import annotations

import asyncio
import fcntl
import os
import sys
import termios
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import Execd, NatsServer
from sandpod import AsyncSandbox, Sandbox
from sandpod.errors import (
    Busy,
    ConnectionLost,
    ExecLost,
    SandboxNotFound,
    SandboxUnavailable,
    SandpodError,
)


async def _started(sbx: AsyncSandbox, tmp: Path, tag: str) -> None:
    """Wait until the command with ``tag`` wrote its start file (it is running)."""
    while not (tmp / tag).exists():
        await asyncio.sleep(0.02)


async def test_execd_killed_mid_exec_gives_sandbox_unavailable(
    nats: NatsServer, start_execd: Callable[..., Execd], tmp_path: Path
) -> None:
    """SIGKILL on execd during a long exec: the caller gets SandboxUnavailable, not a hang."""
    execd = start_execd()
    async with await AsyncSandbox.connect(execd.ids[0], nats_url=nats.url) as sbx:
        call = asyncio.create_task(sbx.exec(f"touch {tmp_path}/go; exec sleep 30", timeout=None))
        await asyncio.wait_for(_started(sbx, tmp_path, "go"), 10)
        execd.kill()
        with pytest.raises(SandboxUnavailable) as info:
            await asyncio.wait_for(call, 15)
        assert info.value.retryable


async def test_execd_killed_mid_stream_gives_sandbox_unavailable(
    nats: NatsServer, start_execd: Callable[..., Execd], tmp_path: Path
) -> None:
    """SIGKILL on execd during a stream: iteration raises SandboxUnavailable promptly."""
    execd = start_execd()
    async with await AsyncSandbox.connect(execd.ids[0], nats_url=nats.url) as sbx:  # noqa: SIM117 - the stream needs sbx
        async with sbx.exec_stream("echo up; exec sleep 30") as st:
            assert (await st.__anext__()).data == b"up\n"
            execd.kill()
            with pytest.raises(SandboxUnavailable):
                await asyncio.wait_for(st.wait(), 15)


def _stdin_pipe_full(pid: int) -> bool:
    """Whether process ``pid``'s stdin pipe is full (the writer must be waiting on it)."""
    try:
        fd = os.open(f"/proc/{pid}/fd/0", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        capacity = fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
        queued = fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
        return int.from_bytes(queued, sys.byteorder) >= capacity
    finally:
        os.close(fd)


async def test_execd_killed_during_a_blocked_stdin_write_gives_sandbox_unavailable(
    nats: NatsServer, start_execd: Callable[..., Execd]
) -> None:
    """A stdin write waiting on a full pipe (the command does not read) raises
    SandboxUnavailable promptly when execd is SIGKILLed, instead of waiting forever."""
    execd = start_execd()
    async with await AsyncSandbox.connect(execd.ids[0], nats_url=nats.url) as sbx:  # noqa: SIM117 - the stream needs sbx
        async with sbx.exec_stream("echo up; exec sleep 30", stdin_open=True) as st:
            assert (await st.__anext__()).data == b"up\n"
            assert st.pid is not None
            write = asyncio.create_task(st.write(b"x" * (8 * 1024 * 1024)))  # > any pipe
            pid = st.pid
            while not _stdin_pipe_full(pid):
                assert not write.done(), write
                await asyncio.sleep(0.02)
            execd.kill()
            with pytest.raises(SandboxUnavailable) as info:
                await asyncio.wait_for(write, 15)
            assert info.value.retryable


async def test_a_stdin_write_after_execd_died_gives_sandbox_unavailable(
    nats: NatsServer, start_execd: Callable[..., Execd]
) -> None:
    """execd was killed between two writes (no request in flight: the next one finds nobody
    subscribed): the caller of a started exec learns SandboxUnavailable, retryable -- never
    SandboxNotFound, which would say the sandbox never existed (a CI run saw that race when a
    chunk of a large write went out just after the kill)."""
    execd = start_execd()
    async with await AsyncSandbox.connect(execd.ids[0], nats_url=nats.url) as sbx:  # noqa: SIM117 - the stream needs sbx
        async with sbx.exec_stream("echo up; exec sleep 30", stdin_open=True) as st:
            assert (await st.__anext__()).data == b"up\n"
            execd.kill()
            with pytest.raises(SandboxUnavailable) as info:
                await asyncio.wait_for(st.write(b"late"), 15)
            assert info.value.retryable


async def test_execd_restarted_mid_exec_gives_exec_lost(
    nats: NatsServer, start_execd: Callable[..., Execd], tmp_path: Path
) -> None:
    """If a new execd takes over the sandbox, the old exec's caller learns it was lost."""
    first = start_execd()
    sid = first.ids[0]
    async with await AsyncSandbox.connect(sid, nats_url=nats.url) as sbx:
        call = asyncio.create_task(sbx.exec(f"touch {tmp_path}/go; exec sleep 30", timeout=None))
        await asyncio.wait_for(_started(sbx, tmp_path, "go"), 10)
        first.kill()
        start_execd(sid)
        with pytest.raises((ExecLost, SandboxUnavailable)) as info:
            await asyncio.wait_for(call, 15)
        assert info.value.retryable
        assert (await sbx.exec("echo again")).stdout == "again\n"


async def test_unknown_sandbox_is_sandbox_not_found(nats: NatsServer) -> None:
    """Calling a sandbox nobody serves fails at once with SandboxNotFound and a hint."""
    async with await AsyncSandbox.connect("nobody-serves-this", nats_url=nats.url) as sbx:
        with pytest.raises(SandboxNotFound) as info:
            await sbx.exec("true")
    assert "sandpod up" in info.value.message


async def test_unreachable_nats_is_connection_lost() -> None:
    """Connecting to a NATS URL where nothing listens fails with ConnectionLost, quickly."""
    with pytest.raises(ConnectionLost) as info:
        await AsyncSandbox.connect("default", nats_url="nats://127.0.0.1:1", connect_timeout=1)
    assert "127.0.0.1:1" in info.value.message


async def test_concurrency_limit_answers_busy(
    nats: NatsServer, start_execd: Callable[..., Execd], tmp_path: Path
) -> None:
    """Beyond its exec limit execd answers Busy (retryable) instead of queueing forever."""
    execd = start_execd(SANDPOD_EXECD_MAX_EXECS="2")
    async with await AsyncSandbox.connect(execd.ids[0], nats_url=nats.url) as sbx:
        slow = [asyncio.create_task(sbx.exec(f"touch {tmp_path}/{i}; sleep 2")) for i in range(2)]
        for i in range(2):
            await asyncio.wait_for(_started(sbx, tmp_path, str(i)), 10)
        with pytest.raises(Busy) as info:
            await sbx.exec("true")
        assert info.value.retryable
        assert [r.exit_code for r in await asyncio.gather(*slow)] == [0, 0]
        assert (await sbx.exec("echo free")).stdout == "free\n"


def test_nats_restart_is_survived(tmp_path: Path, state_dir: Path) -> None:
    """NATS goes down and comes back on the same port: SDK and execd reconnect, calls work."""
    server = NatsServer(tmp_path / "nats")
    server.start()
    execd = Execd(server.url, state_dir, ["restart-test"], {})
    try:
        with Sandbox.connect("restart-test", nats_url=server.url) as sbx:
            assert sbx.exec("/workspace", "echo before").stdout == "before\n"
            server.stop()
            with pytest.raises(SandpodError):
                sbx.exec("echo during", timeout=1)
            server.start()
            _wait_for_ping(sbx)
            assert sbx.exec("/workspace", "echo after").stdout == "after\n"
    finally:
        execd.stop()
        server.stop()


def _wait_for_ping(sbx: Sandbox, timeout: float = 20) -> None:
    """Wait until the sandbox answers again (both ends have reconnected)."""
    import time

    end = time.monotonic() + timeout
    while True:
        try:
            sbx.ping(timeout=0.5)
            return
        except SandpodError:
            if time.monotonic() > end:
                pytest.fail("sandbox did not answer within 20s of NATS coming back")


def test_nats_url_is_read_from_the_environment(
    nats: NatsServer, shared_execd: Execd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without nats_url, SANDPOD_NATS_URL (then NATS_URL) says where NATS is."""
    monkeypatch.delenv("SANDPOD_NATS_URL", raising=False)
    monkeypatch.setenv("NATS_URL", nats.url)
    with Sandbox.connect("shared") as sbx:
        assert sbx.exec("echo via-NATS_URL").stdout == "via-NATS_URL\n"
    monkeypatch.setenv("NATS_URL", "nats://127.0.0.1:1")
    monkeypatch.setenv("SANDPOD_NATS_URL", nats.url)
    with Sandbox.connect("shared") as sbx:
        assert sbx.exec("echo via-SANDPOD_NATS_URL").stdout == "via-SANDPOD_NATS_URL\n"
    assert os.environ["NATS_URL"].endswith(":1")
