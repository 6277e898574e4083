"""sys.metrics and sys.activity: resource use of a sandbox and when a client last used it."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from conftest import Execd, NatsServer
from sandpod import AsyncSandbox, Sandbox
from sandpod.errors import ExecNotFound

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
        await own._status(uuid.uuid4().hex)
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
