"""Snapshots, restores and forks through a real lifecycle (local runtime, as root) and the SDK.

The lifecycle stores layers in the real JetStream object store of the session's nats-server.
Attacks come from where they really sit: another tenant's control-plane requests, and a blob
changed in the object store behind the platform's back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import nats
import pytest
from test_default_rootfs import Platform, platform  # noqa: F401 - fixture used by name

from s3server import S3Server
from sandpod import AsyncSandbox
from sandpod.control import api_call
from sandpod.errors import (
    ResourceInvalid,
    ResourceNotFound,
    SandboxError,
    SnapshotFailed,
    SnapshotInUse,
    SnapshotQuotaExceeded,
)
from sandpod_bus import Bus, BusSettings
from sandpod_contract.messages.sandboxes import (
    ObjectReply,
    ObjectRequest,
    ObjectsReply,
    Ref,
    Selection,
)
from sandpod_contract.subjects import Subjects

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="snapshots need the local runtime as root: run the suite as root"
)

DEADLINE = 60.0


@pytest.fixture
async def plat(platform: Callable[..., Platform]) -> Platform:  # noqa: F811
    p = platform()
    await p.answering()
    return p


async def _sh(sbx: AsyncSandbox, script: str) -> str:
    r = await sbx.exec(["sh", "-c", script], timeout=60)
    assert r.exit_code == 0, (r.exit_code, r.stderr)
    return r.stdout


async def _bucket_keys(p: Platform) -> list[str]:
    nc = await nats.connect(p.url)
    try:
        try:
            store = await nc.jetstream().object_store(f"{p.prefix}-snapshots")
            return [o.name for o in await store.list(ignore_deletes=True)]
        except (nats.js.errors.NotFoundError, nats.js.errors.BucketNotFoundError):
            return []
    finally:
        await nc.close()


async def _until(predicate: Callable[[], object], what: str, timeout: float = DEADLINE) -> None:
    end = time.monotonic() + timeout
    while not await predicate():  # type: ignore[misc]
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def test_snapshot_fork_and_restore_after_the_source_is_gone(plat: Platform) -> None:
    """A snapshot is Ready with its layers; three forks see exactly its files, each isolated;
    the source deleted, the snapshot still restores; its template comes with it."""
    src = await plat.create(f"src-{uuid.uuid4().hex[:6]}")
    await _sh(src, "mkdir -p /workspace/p && echo hello > /workspace/p/f && echo etc > /var/tmp/t")
    snap = await src.snapshot(name=f"s-{uuid.uuid4().hex[:6]}")
    assert snap.phase == "Ready" and snap.layers == 2 and snap.size_bytes > 0
    assert snap.source == src.id and snap.parent is None
    forks = await src.fork(3, snapshot=snap.name)
    assert len({f.id for f in forks}) == 3
    for i, f in enumerate(forks):
        assert await _sh(f, "cat /workspace/p/f /var/tmp/t") == "hello\netc\n"
        await _sh(f, f"echo {i} > /workspace/p/f")
    assert [await _sh(f, "cat /workspace/p/f") for f in forks] == ["0\n", "1\n", "2\n"]
    assert await _sh(src, "cat /workspace/p/f") == "hello\n"
    for f in forks:
        await f.kill()
    await src.kill()
    async with await AsyncSandbox.create(
        snapshot=snap.name, nats_url=plat.url, prefix=plat.prefix, wait=DEADLINE
    ) as again:
        assert await _sh(again, "cat /workspace/p/f") == "hello\n"
        await again.kill()
    await src.close()


async def test_incremental_snapshots_chain_and_delete_collects_layers(plat: Platform) -> None:
    """A second snapshot adds one layer and names the first as its parent; deleting is refused
    while a sandbox restores from it, then its own layers are collected from the object store
    (the shared ones stay, and the child still restores)."""
    src = await plat.create(f"inc-{uuid.uuid4().hex[:6]}")
    await _sh(src, "seq 1 20000 > /workspace/big && echo 1 > /workspace/small")
    first = await src.snapshot()
    await _sh(src, "echo 2 > /workspace/small")
    second = await src.snapshot()
    assert second.parent == first.name
    assert second.layers == first.layers + 1
    assert second.size_bytes < first.size_bytes
    keys = await _bucket_keys(plat)
    assert len(keys) == second.layers
    fork = (await src.fork(1, snapshot=first.name))[0]
    with pytest.raises(SnapshotInUse):
        await src.snapshots.delete(first.name)
    await fork.kill()
    await src.snapshots.delete(first.name)
    with pytest.raises(ResourceNotFound):
        await src.snapshots.get(first.name)
    assert len(await _bucket_keys(plat)) == second.layers  # all shared with the second
    await src.snapshots.delete(second.name)
    await _until(lambda: _empty(plat), "the layers to be collected")
    await src.kill()
    await src.close()


async def _empty(p: Platform) -> bool:
    return not await _bucket_keys(p)


async def test_a_changed_blob_in_the_object_store_fails_the_restore(plat: Platform) -> None:
    """A layer blob replaced in the object store (and gone from the node's cache) is refused:
    the restored sandbox fails with SnapshotUnavailable, and never starts with other files."""
    src = await plat.create(f"cor-{uuid.uuid4().hex[:6]}")
    await _sh(src, "echo secret > /workspace/f")
    snap = await src.snapshot()
    digest = snap.raw["status"]["layers"][-1]["digest"]
    layer = plat.state / "snapshots" / "layers" / digest.split(":")[1]
    for entry in sorted(layer.rglob("*"), reverse=True):  # forget the node's copy
        if entry.is_dir() and not entry.is_symlink():
            entry.rmdir()
        else:
            entry.unlink()
    layer.rmdir()
    nc = await nats.connect(plat.url)
    try:
        store = await nc.jetstream().object_store(f"{plat.prefix}-snapshots")
        await store.put(digest, b"not the layer")
    finally:
        await nc.close()
    with pytest.raises(SandboxError, match=r"SnapshotUnavailable|changed") as info:
        await AsyncSandbox.create(snapshot=snap.name, nats_url=plat.url, prefix=plat.prefix)
    assert "cannot be restored" in str(info.value)
    await src.kill()
    await src.close()


async def test_failures_are_typed(plat: Platform) -> None:
    """No such source: not found; a snapshot that does not exist cannot be restored."""
    async with await AsyncSandbox.connect("x", nats_url=plat.url, prefix=plat.prefix) as h:
        with pytest.raises(ResourceNotFound):
            await h.snapshots.create("no-such-sandbox")
        with pytest.raises(ResourceInvalid) as info:
            await AsyncSandbox.create(
                snapshot="no-such-snap", nats_url=plat.url, prefix=plat.prefix
            )
        assert info.value.details.get("field") == "spec.snapshotRef.name"
        bad = {"kind": "SandboxSnapshot", "spec": {"sourceRef": {"name": "Bad_Name"}}}
        with pytest.raises(ResourceInvalid):
            await api_call(
                h.bus, h.subjects, "snapshots", "create", ObjectRequest(object=bad), ObjectReply
            )


async def test_a_template_on_a_snapshot_serves_prepared_sandboxes(plat: Platform) -> None:
    """A template naming a snapshot makes every sandbox of it start from the snapshot's files;
    the snapshot cannot be deleted while the template names it."""
    src = await plat.create(f"tpl-{uuid.uuid4().hex[:6]}")
    await _sh(src, "echo prepared > /workspace/ready")
    snap = await src.snapshot()
    tname = f"t-{uuid.uuid4().hex[:6]}"
    await plat.template(tname, {"snapshotRef": {"name": snap.name}})
    sbx = await plat.create(f"use-{uuid.uuid4().hex[:6]}", template=tname)
    assert await _sh(sbx, "cat /workspace/ready") == "prepared\n"
    with pytest.raises(SnapshotInUse):
        await src.snapshots.delete(snap.name)
    for s in (sbx, src):
        await s.kill()
        await s.close()


async def test_another_tenant_cannot_see_snapshot_or_restore(plat: Platform) -> None:
    """Tenant beta cannot get, list, delete or restore acme's snapshot, nor snapshot acme's
    sandbox, by acme's name or by its platform id."""
    bus = await Bus.connect(BusSettings(url=plat.url, name="tenants"))
    try:
        acme, beta = Subjects(plat.prefix, tenant="acme"), Subjects(plat.prefix, tenant="beta")
        name = f"n{uuid.uuid4().hex[:6]}"
        obj = {"kind": "Sandbox", "metadata": {"name": name}, "spec": {}}
        created = await api_call(
            bus,
            acme,
            "sandboxes",
            "create",
            ObjectRequest(object=obj, wait_ready=DEADLINE),
            ObjectReply,
            timeout=DEADLINE + 10,
        )
        sid = created.object["metadata"]["name"]
        snap_obj = {
            "kind": "SandboxSnapshot",
            "metadata": {"name": "mine"},
            "spec": {"sourceRef": {"name": name}},
        }
        made = await api_call(
            bus,
            acme,
            "snapshots",
            "create",
            ObjectRequest(object=snap_obj, wait_ready=DEADLINE),
            ObjectReply,
            timeout=DEADLINE + 10,
        )
        snap_id = made.object["metadata"]["name"]
        assert snap_id != "mine" and snap_id.endswith("mine")
        for target in ("mine", snap_id):
            with pytest.raises(ResourceNotFound):
                await api_call(bus, beta, "snapshots", "get", Ref(name=target), ObjectReply)
            with pytest.raises(ResourceNotFound):
                await api_call(bus, beta, "snapshots", "delete", Ref(name=target), ObjectReply)
            steal = {"kind": "Sandbox", "spec": {"snapshotRef": {"name": target}}}
            with pytest.raises(ResourceInvalid):
                await api_call(
                    bus, beta, "sandboxes", "create", ObjectRequest(object=steal), ObjectReply
                )
        listed = await api_call(bus, beta, "snapshots", "list", Selection(), ObjectsReply)
        assert not [i for i in listed.items if i["metadata"]["name"] == snap_id]
        for source in (name, sid):
            grab = {"kind": "SandboxSnapshot", "spec": {"sourceRef": {"name": source}}}
            with pytest.raises((ResourceNotFound, ResourceInvalid)):
                await api_call(
                    bus, beta, "snapshots", "create", ObjectRequest(object=grab), ObjectReply
                )
        mine = await api_call(bus, acme, "snapshots", "get", Ref(name="mine"), ObjectReply)
        assert mine.object["status"]["phase"] == "Ready"
        await api_call(
            bus, acme, "sandboxes", "delete", Ref(name=name, wait=30), ObjectReply, timeout=40
        )
    finally:
        await bus.close()


async def test_a_lifecycle_killed_mid_capture_converges(plat: Platform) -> None:
    """SIGKILL the lifecycle while it captures a large workspace: after a restart the snapshot
    ends Ready with restorable, complete files (taken again), and no staging debris is left."""
    src = await plat.create(f"kill-{uuid.uuid4().hex[:6]}")
    await _sh(src, "for i in $(seq 40); do head -c 5000000 /dev/urandom > /workspace/f$i; done")
    want = await _sh(src, "cd /workspace && md5sum f* | sort")
    task = asyncio.create_task(src.snapshot(name="killed", wait=DEADLINE * 3))
    staging = plat.state / "snapshots" / "staging"
    await _until(lambda: _nonempty(staging), "the capture to start")
    plat.proc.proc.send_signal(signal.SIGKILL)
    plat.proc.proc.wait()
    task.cancel()  # its answer died with the lifecycle; the object is what counts
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert (await _get_raw(plat, "killed"))["status"]["phase"] == "Pending"  # type: ignore[index]
    plat.proc.restart()
    await plat.answering()
    await _until(lambda: _ready(src, "killed"), "the snapshot to settle", DEADLINE)
    snap = await src.snapshots.get("killed")
    assert snap.phase == "Ready"
    fork = (await src.fork(1, snapshot="killed"))[0]
    assert await _sh(fork, "cd /workspace && md5sum f* | sort") == want
    assert not any(staging.iterdir())
    for s in (fork, src):
        await s.kill()
    await src.close()


async def _get_raw(p: Platform, name: str) -> dict[str, object]:
    """The snapshot object straight from the store's bucket (no lifecycle is answering)."""
    nc = await nats.connect(p.url)
    try:
        kv = await nc.jetstream().key_value(f"{p.prefix}-resources")
        entry = await kv.get(f"SandboxSnapshot.default.{name}")
        obj: dict[str, object] = json.loads(entry.value or b"{}")["object"]
        return obj
    finally:
        await nc.close()


async def _nonempty(d: Path) -> bool:
    return d.exists() and any(d.iterdir())


async def _ready(sbx: AsyncSandbox, name: str) -> bool:
    return (await sbx.snapshots.get(name)).phase != "Pending"


async def test_snapshot_of_a_sandbox_that_is_not_running_fails_with_the_reason(
    plat: Platform,
) -> None:
    """A paused sandbox can be snapshotted (and stays paused); a deleted one cannot."""
    src = await plat.create(f"pz-{uuid.uuid4().hex[:6]}")
    await _sh(src, "echo x > /workspace/x")
    await src.pause()
    snap = await src.snapshot()
    assert snap.phase == "Ready"
    assert (await src.describe()).phase == "Paused"
    await src.resume()
    await src.kill()
    with pytest.raises((ResourceNotFound, SnapshotFailed)):
        await src.snapshot()
    await src.close()


def _cli(p: Platform, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sandpod", *args],
        capture_output=True,
        text=True,
        timeout=DEADLINE * 2,
        check=False,
        env={**os.environ, "SANDPOD_NATS_URL": p.url, "SANDPOD_PREFIX": p.prefix},
    )


async def test_the_cli_snapshots_forks_lists_and_removes(plat: Platform) -> None:
    """sandpod snapshot create/ls/get/rm, fork -n and create --snapshot, as a user types them;
    an in-use snapshot's rm fails with the holder named and exit 125."""
    src = await plat.create(f"cli-{uuid.uuid4().hex[:6]}")
    await _sh(src, "echo cli > /workspace/c")
    made = await asyncio.to_thread(_cli, plat, "snapshot", "create", src.id, "--name", "c1")
    assert made.returncode == 0, made.stderr
    assert made.stdout.split("\n")[1].split()[:3] == ["c1", "Ready", src.id]
    listed = await asyncio.to_thread(_cli, plat, "snapshot", "ls", "-o", "json")
    assert [o["metadata"]["name"] for o in json.loads(listed.stdout)] == ["c1"]
    forked = await asyncio.to_thread(_cli, plat, "fork", src.id, "-n", "2", "--snapshot", "c1")
    assert forked.returncode == 0, forked.stderr
    names = forked.stdout.split()
    assert len(names) == 2
    for name in names:
        async with await AsyncSandbox.connect(name, nats_url=plat.url, prefix=plat.prefix) as f:
            assert await _sh(f, "cat /workspace/c") == "cli\n"
    busy = await asyncio.to_thread(_cli, plat, "snapshot", "rm", "c1")
    assert busy.returncode == 125 and "snapshot.in_use" in busy.stderr
    assert all(n in busy.stderr for n in names)
    for name in names:
        assert (await asyncio.to_thread(_cli, plat, "rm", name)).returncode == 0
    gone = await asyncio.to_thread(_cli, plat, "snapshot", "rm", "c1")
    assert gone.returncode == 0 and "deleted c1" in gone.stdout
    await src.kill()
    await src.close()


async def test_snapshots_in_a_real_s3_server(
    platform: Callable[..., Platform],  # noqa: F811
    tmp_path: Path,
) -> None:
    """With SANDPOD_SNAPSHOT_S3_*, layers go to a real S3-compatible server (versitygw): a
    snapshot restores on a node that lost its copy, and an object changed in the server's
    storage is refused."""
    server = S3Server(tmp_path / "s3root")
    server.start()
    try:
        p = platform(
            SANDPOD_SNAPSHOT_S3_ENDPOINT=server.endpoint,
            SANDPOD_SNAPSHOT_S3_BUCKET="layers",
            SANDPOD_SNAPSHOT_S3_ACCESS_KEY_ID=server.access_key,
            SANDPOD_SNAPSHOT_S3_SECRET_ACCESS_KEY=server.secret_key,
        )
        await p.answering()
        src = await p.create(f"s3-{uuid.uuid4().hex[:6]}")
        await _sh(src, "echo in-s3 > /workspace/f")
        snap = await src.snapshot()
        digests = [x["digest"] for x in snap.raw["status"]["layers"]]
        assert all(server.object_path("layers", d).exists() for d in digests)
        assert await _bucket_keys(p) == []  # not in JetStream
        layers = p.state / "snapshots" / "layers"
        shutil.rmtree(layers)
        layers.mkdir()
        fork = (await src.fork(1, snapshot=snap.name))[0]
        assert await _sh(fork, "cat /workspace/f") == "in-s3\n"
        await fork.kill()
        shutil.rmtree(layers)
        layers.mkdir()
        server.object_path("layers", digests[-1]).write_bytes(b"changed behind its back")
        with pytest.raises(SandboxError, match="cannot be restored"):
            await AsyncSandbox.create(snapshot=snap.name, nats_url=p.url, prefix=p.prefix)
        await src.kill()
        await src.close()
    finally:
        server.stop()


async def test_snapshot_quotas_per_tenant(platform: Callable[..., Platform]) -> None:  # noqa: F811
    """With SANDPOD_SNAPSHOT_QUOTA_COUNT=2 a tenant's third snapshot is refused (typed, naming
    the quota) while another tenant still takes its own; deleting one makes room again."""
    p = platform(SANDPOD_SNAPSHOT_QUOTA_COUNT="2")
    await p.answering()
    bus = await Bus.connect(BusSettings(url=p.url, name="quota"))
    try:
        acme, beta = Subjects(p.prefix, tenant="acme"), Subjects(p.prefix, tenant="beta")

        async def sandbox(subjects: Subjects) -> str:
            obj = {"kind": "Sandbox", "metadata": {"name": "q"}, "spec": {}}
            await api_call(
                bus,
                subjects,
                "sandboxes",
                "create",
                ObjectRequest(object=obj, wait_ready=DEADLINE),
                ObjectReply,
                timeout=DEADLINE + 10,
            )
            return "q"

        async def snap(subjects: Subjects, name: str) -> ObjectReply:
            obj = {
                "kind": "SandboxSnapshot",
                "metadata": {"name": name},
                "spec": {"sourceRef": {"name": "q"}},
            }
            reply: ObjectReply = await api_call(
                bus,
                subjects,
                "snapshots",
                "create",
                ObjectRequest(object=obj, wait_ready=DEADLINE),
                ObjectReply,
                timeout=DEADLINE + 10,
            )
            return reply

        await sandbox(acme)
        await sandbox(beta)
        await snap(acme, "a1")
        await snap(acme, "a2")
        with pytest.raises(SnapshotQuotaExceeded) as info:
            await snap(acme, "a3")
        assert info.value.details["quota"] == "count" and info.value.details["limit"] == 2
        await snap(beta, "b1")  # another tenant's quota is its own
        await api_call(bus, acme, "snapshots", "delete", Ref(name="a1"), ObjectReply)
        await snap(acme, "a3")
        for who in (acme, beta):
            await api_call(
                bus, who, "sandboxes", "delete", Ref(name="q", wait=30), ObjectReply, timeout=40
            )
    finally:
        await bus.close()
