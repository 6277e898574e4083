"""sys.metrics and sys.activity: resource use of a sandbox and when a client last used it."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from conftest import Execd, NatsServer, free_port
from sandpod import AsyncSandbox, Sandbox
from sandpod.errors import ExecNotFound
from sandpod.exec.args import exec_status
from sandpod.proc import AsyncProc, ProcWaitTimeout
from sandpod.pty import AsyncPty

MiB = 1024 * 1024


@pytest.fixture
async def own(start_execd: Callable[..., Execd], nats: NatsServer) -> AsyncIterator[AsyncSandbox]:
    """A sandbox on a private execd, so no other test's processes or files count."""
    execd = start_execd()
    async with await AsyncSandbox.connect(execd.ids[0], nats_url=nats.url) as sbx:
        yield sbx


async def test_metrics_of_an_idle_sandbox_are_sane(own: AsyncSandbox) -> None:
    """No processes, no execs; host memory and filesystem figures are consistent."""
    m = await own.metrics()
    assert m.sandbox_id == own.id and m.source == "procfs"
    assert abs(m.time - time.time()) < 5
    assert (m.processes, m.execs, m.cpu_seconds, m.memory_rss) == (0, 0, 0.0, 0)
    assert 0 < m.memory_available <= m.memory_total
    assert 0 < m.disk_free <= m.disk_total
    assert m.disk_complete and m.cpu_count >= 1 and m.load1 >= 0


async def test_memory_and_cpu_of_running_processes_count(own: AsyncSandbox) -> None:
    """A command holding 100 MiB shows in memory_rss, processes and execs, setsid'd child too."""
    before = await own.metrics()
    script = (
        "import subprocess, time; child = subprocess.Popen(['setsid', 'sleep', '300']); "
        "block = b'x' * (100 << 20); sum(range(2_000_000)); print('ready', flush=True); "
        "time.sleep(300)"
    )
    async with own.exec_stream(["python3", "-c", script]) as st:
        chunk = await st.__anext__()
        assert chunk.data == b"ready\n"
        during = await own.metrics()
        await st.cancel()
        await st.wait()
    assert during.execs == 1 and during.processes >= 2  # python and the setsid'd sleep
    assert during.memory_rss - before.memory_rss >= 100 * MiB
    assert during.cpu_seconds > 0
    deadline = time.monotonic() + 10
    while (after := await own.metrics()).processes or after.execs:
        assert time.monotonic() < deadline, f"processes still counted: {after}"
        await asyncio.sleep(0.05)
    assert after.memory_rss == 0 and after.cpu_seconds == 0


async def test_disk_usage_grows_when_a_file_is_written(own: AsyncSandbox) -> None:
    """Writing 4 MiB into the workspace raises disk_used by at least that much."""
    before = await own.metrics()
    name = f"blob-{uuid.uuid4().hex[:8]}"
    r = await own.exec("/workspace", f"head -c {4 * MiB} /dev/urandom > {name}")
    assert r.exit_code == 0
    after = await own.metrics()
    assert after.disk_used - before.disk_used >= 4 * MiB
    assert after.disk_entries == before.disk_entries + 1


async def test_activity_advances_on_exec_but_not_on_probes(own: AsyncSandbox) -> None:
    """ping, info, status, metrics and activity leave last_activity alone; exec moves it."""
    first = await own.activity()
    await own.ping()
    await own.runtime_info()
    await own.metrics()
    with pytest.raises(ExecNotFound):
        await exec_status(own.channel, uuid.uuid4().hex)
    probed = await own.activity()
    assert probed.last_activity == first.last_activity
    assert probed.idle >= first.idle and probed.time >= first.time
    await own.exec(["true"])
    after = await own.activity()
    assert after.last_activity > first.last_activity
    assert 0 <= after.idle < 5


def test_sync_sdk_metrics_and_activity(
    nats: NatsServer, shared_execd: Execd, state_dir: Path
) -> None:
    """The blocking SDK exposes metrics() and activity() too."""
    with Sandbox.connect("shared", nats_url=nats.url) as sbx:
        m = sbx.metrics()
        assert m.sandbox_id == "shared" and m.disk_total > 0
        sbx.exec(["true"])
        assert sbx.activity().idle < 5


Action = Callable[[], Awaitable[object]]
Setup = Callable[[AsyncSandbox, contextlib.AsyncExitStack], Awaitable[Action]]


@pytest.fixture(scope="module")
def verbs_execd(nats: NatsServer, state_dir: Path) -> Iterator[Execd]:
    """One private execd for every verb case (each cleans up what it started)."""
    execd = Execd(nats.url, state_dir, [f"t-{uuid.uuid4().hex[:10]}"], {})
    yield execd
    execd.stop()


async def _running_proc(sbx: AsyncSandbox, stack: contextlib.AsyncExitStack) -> AsyncProc:
    p = await sbx.proc.start("echo up; exec sleep 300", proc_id=f"p-{uuid.uuid4().hex[:8]}")
    stack.push_async_callback(p.remove)
    await p.wait_for_log("up", timeout=10)
    return p


async def _proc_wait(sbx: AsyncSandbox, stack: contextlib.AsyncExitStack) -> Action:
    p = await _running_proc(sbx, stack)
    return lambda: _raises(ProcWaitTimeout, sbx.proc.wait(p.id, timeout=0.3))


async def _proc_logs(sbx: AsyncSandbox, stack: contextlib.AsyncExitStack) -> Action:
    p = await _running_proc(sbx, stack)
    return lambda: sbx.proc.logs(p.id, cursor=3, wait=0.3)  # after "up\n": nothing comes


async def _proc_wait_port(sbx: AsyncSandbox, stack: contextlib.AsyncExitStack) -> Action:
    port = free_port()  # nothing listens on it
    return lambda: _raises(ProcWaitTimeout, sbx.proc.wait_for_port(port, timeout=0.3))


async def _proc_status(sbx: AsyncSandbox, stack: contextlib.AsyncExitStack) -> Action:
    p = await _running_proc(sbx, stack)
    return lambda: sbx.proc.status(p.id)


async def _proc_start(sbx: AsyncSandbox, stack: contextlib.AsyncExitStack) -> Action:
    async def start() -> None:
        p = await sbx.proc.start(["true"])
        stack.push_async_callback(p.remove)

    return start


async def _proc_signal(sbx: AsyncSandbox, stack: contextlib.AsyncExitStack) -> Action:
    p = await _running_proc(sbx, stack)
    return lambda: sbx.proc.signal(p.id, signal.SIGCONT)


async def _pty(sbx: AsyncSandbox, stack: contextlib.AsyncExitStack) -> AsyncPty:
    term = await stack.enter_async_context(await sbx.pty.open(["sh", "-c", "echo up; exec cat"]))
    await term.expect("up", timeout=10)
    return term


async def _pty_read(sbx: AsyncSandbox, stack: contextlib.AsyncExitStack) -> Action:
    term = await _pty(sbx, stack)
    return lambda: term.read(wait=0.3)


async def _pty_input(sbx: AsyncSandbox, stack: contextlib.AsyncExitStack) -> Action:
    term = await _pty(sbx, stack)
    return lambda: term.write("x")


async def _watch_poll(sbx: AsyncSandbox, stack: contextlib.AsyncExitStack) -> Action:
    watch = await sbx.watch.start("/workspace")
    stack.push_async_callback(watch.close)
    return lambda: watch.poll(wait=0.3)


async def _watch_start(sbx: AsyncSandbox, stack: contextlib.AsyncExitStack) -> Action:
    async def start() -> None:
        watch = await sbx.watch.start("/workspace")
        stack.push_async_callback(watch.close)

    return start


async def _exec_run(sbx: AsyncSandbox, stack: contextlib.AsyncExitStack) -> Action:
    return lambda: sbx.exec(["true"])


async def _fs_write(sbx: AsyncSandbox, stack: contextlib.AsyncExitStack) -> Action:
    return lambda: sbx.fs.write(f"/workspace/f-{uuid.uuid4().hex[:8]}", b"x")


async def _session_run(sbx: AsyncSandbox, stack: contextlib.AsyncExitStack) -> Action:
    session = await sbx.sessions.create(f"s-{uuid.uuid4().hex[:8]}")
    stack.push_async_callback(session.delete)
    return lambda: session.run("true")


async def _metrics(sbx: AsyncSandbox, stack: contextlib.AsyncExitStack) -> Action:
    return sbx.metrics


async def _raises(error: type[Exception], call: Awaitable[object]) -> None:
    with pytest.raises(error):
        await call


@pytest.mark.parametrize(
    ("setup", "moves"),
    [
        pytest.param(_metrics, False, id="sys.metrics"),
        pytest.param(_proc_status, False, id="proc.status"),
        pytest.param(_proc_wait, False, id="proc.wait"),
        pytest.param(_proc_logs, False, id="proc.logs"),
        pytest.param(_proc_wait_port, False, id="proc.wait_port"),
        pytest.param(_pty_read, False, id="pty.read"),
        pytest.param(_watch_poll, False, id="watch.poll"),
        pytest.param(_exec_run, True, id="exec.run"),
        pytest.param(_proc_start, True, id="proc.start"),
        pytest.param(_proc_signal, True, id="proc.signal"),
        pytest.param(_pty_input, True, id="pty.input"),
        pytest.param(_watch_start, True, id="watch.start"),
        pytest.param(_fs_write, True, id="fs.write"),
        pytest.param(_session_run, True, id="session.run"),
    ],
)
async def test_which_verbs_move_the_activity_clock(
    verbs_execd: Execd, nats: NatsServer, setup: Setup, moves: bool
) -> None:
    """Input, commands, starting things and file writes are activity; probes and passive waits
    and reads (long polls included) are not, so a forgotten follower cannot keep a sandbox."""
    async with (
        await AsyncSandbox.connect(verbs_execd.ids[0], nats_url=nats.url) as sbx,
        contextlib.AsyncExitStack() as stack,
    ):
        action = await setup(sbx, stack)  # whatever the setup did counts: measure from here
        before = await sbx.activity()
        await action()
        after = await sbx.activity()
    assert (after.last_activity > before.last_activity) is moves, (before, after)
