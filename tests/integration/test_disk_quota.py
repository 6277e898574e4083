"""A local sandbox's disk quota, attacked from inside: filling it is ENOSPC there and nowhere else.

Each sandbox of the local runtime gets its own filesystem of ``resources.disk`` bytes holding
its writable layer, ``/workspace`` and ``/tmp`` (``runtime/diskquota.py``). Code inside a jailed
sandbox (run through a real execd with the SDK) writes past the quota in each of those places
and must get ``No space left on device``; then the host's filesystem, a JetStream stream on a
real nats-server and a second sandbox must still take writes, and ``df`` and ``sbx.metrics()``
must show the sandbox's own size and usage. Needs root (loop devices, the jail).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from conftest import Execd, NatsServer, wait_until
from sandpod import AsyncSandbox
from sandpod_lifecycle.runtime.base import CreateFailed, InstanceSpec, InstanceStatus, Resources
from sandpod_lifecycle.runtime.diskquota import DiskOptions
from sandpod_lifecycle.runtime.local import LocalRuntime, LocalRuntimeConfig

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="disk quotas need root (loop devices): run the jail tests as root"
)

MiB = 1024 * 1024
GiB = 1024 * MiB
QUOTA = 64 * MiB
ENOSPC = "No space left on device"


@pytest.fixture
def state() -> Iterator[Path]:
    path = Path("/var/tmp") / f"sandpod-disk-test-{uuid.uuid4().hex[:8]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


@contextlib.asynccontextmanager
async def _runtime(state: Path, **config: Any) -> AsyncIterator[LocalRuntime]:
    rt = LocalRuntime(
        LocalRuntimeConfig(
            state_dir=state, cgroup_parent=f"sandpod-test-{uuid.uuid4().hex[:8]}", **config
        )
    )
    caps = await rt.capabilities()
    if caps.problems:
        pytest.skip(f"this host cannot jail: {'; '.join(caps.problems)}")
    try:
        yield rt
    finally:
        for sid in await rt.list():
            await rt.destroy(sid)
        assert rt._caps is not None
        plan = rt._cgroup_plan(rt._caps)
        for d in plan.for_sandbox("x").dirs:
            with contextlib.suppress(OSError):
                Path(d).parent.rmdir()


@pytest.fixture
async def runtime(state: Path) -> AsyncIterator[LocalRuntime]:
    async with _runtime(state) as rt:
        yield rt


@contextlib.asynccontextmanager
async def _serving(
    nats_server: NatsServer, state: Path, statuses: list[InstanceStatus]
) -> AsyncIterator[list[AsyncSandbox]]:
    """One real execd serving the jails; an SDK handle on each."""
    ids = [s.sandbox_id for s in statuses]
    env = {"SANDPOD_EXECD_JAIL": str(state / "{sandbox_id}" / "jail.json")}
    execd = Execd(nats_server.url, state, ids, env)
    handles = []
    try:
        for sid in ids:
            handles.append(await AsyncSandbox.connect(sid, nats_url=nats_server.url))
        yield handles
    finally:
        for h in handles:
            await h.close()
        execd.stop()  # before the jails go


async def _create(rt: LocalRuntime, disk: int | None = QUOTA) -> InstanceStatus:
    spec = InstanceSpec(
        sandbox_id=f"q-{uuid.uuid4().hex[:10]}", resources=Resources(disk_bytes=disk)
    )
    st = await rt.create(spec)
    assert st.protections.get("disk_quota") == "active", st.protections
    return st


async def _fill(sbx: AsyncSandbox, path: str, mib: int = 100) -> tuple[int | None, str]:
    r = await sbx.exec("/", f"dd if=/dev/zero of={path} bs=1M count={mib} 2>&1")
    return r.exit_code, r.stdout


async def _df(sbx: AsyncSandbox, path: str) -> tuple[int, int, int]:
    """(size, used, available) bytes of ``path``'s filesystem, as ``df`` inside shows it."""
    r = await sbx.exec("/", f"df -B1 --output=size,used,avail {path} | tail -1")
    assert r.exit_code == 0, r.stderr
    size, used, avail = (int(x) for x in r.stdout.split())
    return size, used, avail


async def _jetstream_takes_a_write(url: str) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        name = f"DISKQ{uuid.uuid4().hex[:8]}"
        await js.add_stream(name=name, subjects=[f"diskq.{name}"])
        try:
            ack = await js.publish(f"diskq.{name}", b"x" * (512 * 1024))
            assert ack.seq == 1
        finally:
            await js.delete_stream(name)
    finally:
        await nc.close()


@pytest.mark.parametrize("where", ["/workspace", "/var/tmp", "/tmp"])
async def test_writing_past_the_disk_quota_is_enospc_inside_only(
    runtime: LocalRuntime, state: Path, nats: NatsServer, where: str
) -> None:
    """A sandbox with a 64Mi disk writing 100 MiB into /workspace, the writable layer (/var/tmp:
    the base's directory the sandbox user may write) or /tmp gets ENOSPC; the host's
    filesystem, JetStream on the host and a second sandbox still take writes while it is full."""
    full, other = await _create(runtime), await _create(runtime)
    async with _serving(nats, state, [full, other]) as (sbx, neighbour):
        code, out = await _fill(sbx, f"{where}/hog")
        assert code != 0 and ENOSPC in out, (code, out)
        size, _, avail = await _df(sbx, where)
        assert avail < 2 * MiB and size <= QUOTA, (size, avail)  # it really is full
        # Nothing else was harmed: the host ...
        probe = state / f"host-probe-{uuid.uuid4().hex[:6]}"
        probe.write_bytes(b"h" * (8 * MiB))
        assert probe.stat().st_size == 8 * MiB
        probe.unlink()
        # ... a JetStream stream of the host's nats-server (its data is on the host disk) ...
        await _jetstream_takes_a_write(nats.url)
        # ... and the other sandbox, in each of the same places.
        for path in ("/workspace/ok", "/var/tmp/ok", "/tmp/ok"):
            code, out = await _fill(neighbour, path, 16)
            assert code == 0, (path, out)
        # The full sandbox recovers once it deletes what it wrote.
        assert (await sbx.exec("/", f"rm {where}/hog && echo x > {where}/small")).exit_code == 0


async def test_the_quota_counts_workspace_writable_layer_and_tmp_together(
    runtime: LocalRuntime, state: Path, nats: NatsServer
) -> None:
    """25 MiB in /workspace, 25 MiB in /tmp and then 25 MiB in /var/tmp exceed a 64Mi disk:
    the three share one quota (no place is a way around it)."""
    st = await _create(runtime)
    async with _serving(nats, state, [st]) as (sbx,):
        assert (await _fill(sbx, "/workspace/a", 25))[0] == 0
        assert (await _fill(sbx, "/tmp/b", 25))[0] == 0
        code, out = await _fill(sbx, "/var/tmp/c", 25)
        assert code != 0 and ENOSPC in out, (code, out)


async def test_df_and_metrics_show_the_sandbox_disk_not_the_host(
    runtime: LocalRuntime, state: Path, nats: NatsServer
) -> None:
    """``df`` of /workspace, / and /tmp inside, and sys.metrics, report the 64Mi quota and
    what the sandbox wrote, not the host's filesystem."""
    st = await _create(runtime)
    host = os.statvfs(state)
    assert host.f_blocks * host.f_frsize > 4 * QUOTA  # else the test proves nothing
    async with _serving(nats, state, [st]) as (sbx,):
        for path in ("/workspace", "/", "/tmp"):
            size, _, _ = await _df(sbx, path)
            assert 56 * MiB <= size <= QUOTA, (path, size)
        assert (await _fill(sbx, "/workspace/w", 10))[0] == 0
        assert (await _fill(sbx, "/tmp/t", 10))[0] == 0
        m = await sbx.metrics()
        size, used, avail = await _df(sbx, "/workspace")
    assert 56 * MiB <= m.disk_total <= QUOTA, m
    assert m.disk_used >= 20 * MiB and m.disk_complete, m
    assert m.disk_free <= m.disk_total - 20 * MiB, m
    assert used >= 20 * MiB and avail <= size - 20 * MiB


async def test_a_sandbox_without_a_disk_size_gets_the_10gi_default(
    runtime: LocalRuntime, state: Path, nats: NatsServer
) -> None:
    """No ``resources.disk``: the sandbox still has a quota, the 10 GiB default (never the
    host's whole disk)."""
    st = await _create(runtime, disk=None)
    assert st.jail_file is not None
    assert json.loads(st.jail_file.read_text())["disk"]["bytes"] == 10 * GiB
    async with _serving(nats, state, [st]) as (sbx,):
        size, _, _ = await _df(sbx, "/workspace")
    assert 9.5 * GiB <= size <= 10 * GiB, size


async def test_the_hosts_tmp_does_not_show_in_the_sandbox(
    runtime: LocalRuntime, state: Path, nats: NatsServer
) -> None:
    """/tmp is the writable layer's own (opaque) directory: a file in the host's /tmp, which is
    part of the base, is not visible inside; what the sandbox writes there stays in its disk."""
    secret = Path("/tmp") / f"sandpod-host-secret-{uuid.uuid4().hex[:8]}"
    secret.write_text("host only\n")
    try:
        st = await _create(runtime)
        async with _serving(nats, state, [st]) as (sbx,):
            r = await sbx.exec("/", f"ls -A /tmp; cat {secret}; echo in > /tmp/mine")
        assert secret.name not in r.stdout and "host only" not in r.stdout, r.stdout
        assert "No such file" in r.stderr, r.stderr
        assert not (Path("/tmp") / "mine").exists()
        assert st.upper_dir is not None and (st.upper_dir / "tmp" / "mine").read_text() == "in\n"
    finally:
        secret.unlink()


def _loop_backing_files() -> set[str]:
    files = set()
    for f in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            files.add(f.read_text().strip())
    return files


async def test_destroy_leaves_no_mount_image_or_loop_device(
    runtime: LocalRuntime, state: Path
) -> None:
    """After destroy the sandbox's filesystem is unmounted, its image deleted and its loop
    device released."""
    st = await _create(runtime)
    image = str(state / st.sandbox_id / "disk.img")
    assert image in _loop_backing_files()
    assert str(state / st.sandbox_id / "disk") in Path("/proc/self/mountinfo").read_text()
    await runtime.destroy(st.sandbox_id)
    assert not (state / st.sandbox_id).exists()
    assert str(state / st.sandbox_id) not in Path("/proc/self/mountinfo").read_text()
    wait_until(
        lambda: not any(f.startswith(image) for f in _loop_backing_files()),
        10,
        "the sandbox's loop device to be released",
    )


async def test_a_host_short_of_space_refuses_the_create_and_leaves_nothing(state: Path) -> None:
    """When the host has less free space than the reserve, create fails with a message saying
    what to do, and leaves no directory, mount or loop device behind."""
    huge = DiskOptions(reserve_bytes=1 << 60)
    async with _runtime(state, disk=huge) as rt:
        with pytest.raises(
            CreateFailed, match=r"free space on the host or ask for a smaller resources\.disk"
        ):
            await rt.create(
                InstanceSpec(sandbox_id="q-short", resources=Resources(disk_bytes=QUOTA))
            )
        assert await rt.list() == []
        assert not (state / "q-short").exists()
        assert str(state) not in Path("/proc/self/mountinfo").read_text()


async def test_a_preallocated_disk_is_reserved_on_the_host_and_still_enospc(
    state: Path, nats: NatsServer
) -> None:
    """With ``preallocate`` the sandbox's whole disk is allocated on the host at create (the
    sandbox can never take host space it was not given) and filling it is still ENOSPC."""
    async with _runtime(state, disk=DiskOptions(preallocate=True, reserve_bytes=0)) as rt:
        st = await _create(rt)
        image = state / st.sandbox_id / "disk.img"
        assert image.stat().st_blocks * 512 >= QUOTA
        async with _serving(nats, state, [st]) as (sbx,):
            code, out = await _fill(sbx, "/workspace/hog")
        assert code != 0 and ENOSPC in out, (code, out)
