"""SandboxVolumes in the local runtime, used and attacked from inside real jails.

Each volume is its own ext4 filesystem under ``<state>/.volumes`` (``runtime/volumes.py``),
bound into jails by the holder. Code in the sandboxes (a real execd, the SDK) writes, reads,
fills and tries to escape read-only binds; the data must outlive the sandbox that wrote it.
Needs root (loop devices, the jail).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from conftest import Execd, NatsServer
from sandpod import AsyncSandbox
from sandpod_lifecycle.runtime.base import (
    CreateFailed,
    InstanceSpec,
    InstanceStatus,
    Resources,
    VolumeBind,
)
from sandpod_lifecycle.runtime.local import LocalRuntime, LocalRuntimeConfig

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="volume quotas need root (loop devices): run the jail tests as root"
)

MiB = 1024 * 1024
NS = "default"


@pytest.fixture
def state() -> Iterator[Path]:
    path = Path("/var/tmp") / f"sandpod-vol-test-{uuid.uuid4().hex[:8]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def runtime(state: Path) -> AsyncIterator[LocalRuntime]:
    rt = LocalRuntime(
        LocalRuntimeConfig(state_dir=state, cgroup_parent=f"sandpod-test-{uuid.uuid4().hex[:8]}")
    )
    caps = await rt.capabilities()
    if caps.problems:
        pytest.skip(f"this host cannot jail: {'; '.join(caps.problems)}")
    if rt.volumes.quota() != "active":
        pytest.skip(f"volumes have no quota here: {rt.volumes.quota()}")
    try:
        yield rt
    finally:
        for sid in await rt.list():
            await rt.destroy(sid)
        for vol in (state / ".volumes" / NS).glob("*"):
            rt.volumes.remove(NS, vol.name)
        assert rt._caps is not None
        for d in rt._cgroup_plan(rt._caps).for_sandbox("x").dirs:
            with contextlib.suppress(OSError):
                Path(d).parent.rmdir()


@contextlib.asynccontextmanager
async def _serving(
    nats_server: NatsServer, state: Path, statuses: list[InstanceStatus]
) -> AsyncIterator[list[AsyncSandbox]]:
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
        execd.stop()


def _volume(rt: LocalRuntime, size: int = 32 * MiB) -> str:
    name = f"v-{uuid.uuid4().hex[:8]}"
    rt.volumes.provision(NS, name, size)
    return name


async def _create(rt: LocalRuntime, *mounts: tuple[str, str, bool]) -> InstanceStatus:
    binds = tuple(
        VolumeBind(rt.volumes.source(NS, name), path, ro, (NS, name)) for name, path, ro in mounts
    )
    spec = InstanceSpec(
        sandbox_id=f"v-{uuid.uuid4().hex[:10]}",
        resources=Resources(disk_bytes=32 * MiB),
        volumes=binds,
    )
    return await rt.create(spec)


async def test_data_outlives_the_sandbox_and_the_next_writer_owns_it(
    runtime: LocalRuntime, state: Path, nats: NatsServer
) -> None:
    """A writes into its volume and is destroyed; B (another uid) reads A's file, appends to
    it and makes new files: the volume's files were handed to B's uid."""
    vol = _volume(runtime)
    a = await _create(runtime, (vol, "/data", False))
    async with _serving(nats, state, [a]) as (sbx,):
        r = await sbx.exec("/", "mkdir /data/dir && echo from-a > /data/dir/note && id -u")
        assert r.exit_code == 0, r.stderr
        assert int(r.stdout) == a.uid
    await runtime.destroy(a.sandbox_id)
    b = await _create(runtime, (vol, "/mnt/shared", False))
    assert b.uid != a.uid
    async with _serving(nats, state, [b]) as (sbx,):
        r = await sbx.exec(
            "/",
            "cat /mnt/shared/dir/note && echo from-b >> /mnt/shared/dir/note && "
            "touch /mnt/shared/new && stat -c %u /mnt/shared/dir/note /mnt/shared",
        )
        assert r.exit_code == 0, r.stderr
        lines = r.stdout.split()
        assert lines[0] == "from-a"
        assert lines[1:] == [str(b.uid), str(b.uid)]


async def test_read_only_binds_refuse_writes_and_escapes(
    runtime: LocalRuntime, state: Path, nats: NatsServer
) -> None:
    """Two sandboxes mount one volume read-only at once: both read it; writing, remounting it
    read-write, or writing through /proc/self/root and /proc/1/root all fail."""
    vol = _volume(runtime)
    writer = await _create(runtime, (vol, "/data", False))
    async with _serving(nats, state, [writer]) as (sbx,):
        assert (await sbx.exec("/", "echo shared > /data/f && chmod 644 /data/f")).exit_code == 0
    await runtime.destroy(writer.sandbox_id)
    one = await _create(runtime, (vol, "/data", True))
    two = await _create(runtime, (vol, "/ro/data", True))
    async with _serving(nats, state, [one, two]) as (a, b):
        assert (await a.exec("/", "cat /data/f")).stdout == "shared\n"
        assert (await b.exec("/", "cat /ro/data/f")).stdout == "shared\n"
        for attack in (
            "echo x > /data/f",
            "touch /data/new",
            "rm /data/f",
            "echo x > /proc/self/root/data/g",
            "echo x > /proc/1/root/data/g",
            "mount -o remount,rw /data",
            "mount -o remount,rw /data && echo x > /data/g",
            "unshare -Urm sh -c 'mount -o remount,rw /data && echo x > /data/g'",
        ):
            r = await a.exec("/", f"{attack} 2>&1")
            assert r.exit_code != 0, (attack, r.stdout)
        r = await a.exec("/", "echo x > /data/f")
        assert "Read-only file system" in r.stderr
        assert (await b.exec("/", "ls /ro/data && cat /ro/data/f")).stdout.split() == [
            "f",
            "shared",
        ]


async def test_the_quota_stops_a_volume_at_its_size_only(
    runtime: LocalRuntime, state: Path, nats: NatsServer
) -> None:
    """Writing 100 MiB into a 32Mi volume is ENOSPC; the sandbox's other volume and its
    /workspace still take writes."""
    small, other = _volume(runtime, 32 * MiB), _volume(runtime, 32 * MiB)
    st = await _create(runtime, (small, "/small", False), (other, "/other", False))
    async with _serving(nats, state, [st]) as (sbx,):
        r = await sbx.exec("/", "dd if=/dev/zero of=/small/big bs=1M count=100 2>&1")
        assert r.exit_code != 0 and "No space left on device" in r.stdout
        r = await sbx.exec("/", "df -B1 --output=size /small | tail -1")
        assert int(r.stdout) <= 32 * MiB
        r = await sbx.exec(
            "/", "dd if=/dev/zero of=/other/f bs=1M count=8 && echo ok > /workspace/w"
        )
        assert r.exit_code == 0, r.stderr
    assert (runtime.volumes.usage(NS, small) or 0) > 24 * MiB


async def test_a_mount_path_through_a_symlink_of_the_base_is_refused(
    runtime: LocalRuntime, tmp_path: Path
) -> None:
    """A base whose /data is a symlink to a host directory: the holder refuses to follow it
    (the volume would land on the host's path), and nothing is made on the host."""
    rootfs = os.environ.get("SANDPOD_DEFAULT_ROOTFS")
    if not rootfs:
        pytest.skip("no Debian base built (SANDPOD_DEFAULT_ROOTFS): see tests/rootfs.py")
    layer = tmp_path / "layer"
    layer.mkdir()
    target = tmp_path / "host-target"
    target.mkdir()
    (layer / "data").symlink_to(target)
    vol = _volume(runtime)
    spec = InstanceSpec(
        sandbox_id=f"v-{uuid.uuid4().hex[:10]}",
        rootfs=Path(rootfs),
        layers=(layer,),
        volumes=(VolumeBind(runtime.volumes.source(NS, vol), "/data/x", False, (NS, vol)),),
    )
    with pytest.raises(CreateFailed, match="crosses a symlink"):
        await runtime.create(spec)
    assert list(target.iterdir()) == []


async def test_removing_a_volume_frees_its_disk(runtime: LocalRuntime, state: Path) -> None:
    """``remove`` unmounts the filesystem and deletes its image."""
    vol = _volume(runtime)
    d = state / ".volumes" / NS / vol
    assert os.path.ismount(d / "disk")
    runtime.volumes.remove(NS, vol)
    assert not d.exists()
