"""Snapshots, restores, forks and hibernation in Kubernetes mode: the lifecycle on the real API
server, each Pod's execd run by the fake kubelet, layers in the session's real JetStream object
store or in a real S3-compatible server (versitygw, built from its Go module: ``make s3test``).

A Pod's ``/workspace`` is the directory ``<state>/pods/<name>/workspace`` here (the fake
kubelet's emptyDir), which is how the tests read what a restore wrote. Attacks come from where
they sit: a stored layer changed behind the platform's back, another tenant's requests, and a
hostile tar stream sent through execd's extract.
"""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import stat
import tarfile
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import nats
import pytest

from k8s.cluster import NS, Cluster
from s3server import S3Server
from sandpod import AsyncSandbox
from sandpod.control import api_call
from sandpod.errors import (
    ArchiveFailed,
    BadRequest,
    ResourceInvalid,
    ResourceNotFound,
    SandboxError,
)
from sandpod_bus import Bus, BusSettings
from sandpod_contract.codec import decode_reply, encode
from sandpod_contract.messages.sandboxes import ObjectReply, ObjectRequest, Ref
from sandpod_contract.messages.system import SnapshotTake, SnapshotTaken
from sandpod_contract.subjects import Subjects
from sandpod_kube import delete_all

DEADLINE = 90.0


@pytest.fixture(params=["jetstream", "s3"])
async def snapshots_in(
    request: pytest.FixtureRequest, cluster: Cluster, tmp_path: Path
) -> AsyncIterator[S3Server | None]:
    """The lifecycle (kubernetes runtime) with its layers in JetStream (None) or in versitygw
    (the server: tests find its objects' files)."""
    server = None
    env: dict[str, str] = {}
    if request.param == "s3":
        server = S3Server(tmp_path / "s3root")
        server.start()
        env = {
            "SANDPOD_SNAPSHOT_S3_ENDPOINT": server.endpoint,
            "SANDPOD_SNAPSHOT_S3_BUCKET": "layers",
            "SANDPOD_SNAPSHOT_S3_ACCESS_KEY_ID": server.access_key,
            "SANDPOD_SNAPSHOT_S3_SECRET_ACCESS_KEY": server.secret_key,
        }
    _lifecycle(cluster, **env)
    try:
        await cluster.answering()
        yield server
    finally:
        await asyncio.to_thread(delete_all, cluster.plane.settings, "SandboxSnapshot", [NS])
        if server is not None:
            server.stop()


def _lifecycle(cluster: Cluster, **env: str) -> None:
    cluster.service(
        "sandpod_lifecycle",
        SANDPOD_RUNTIME="kubernetes",
        SANDPOD_RESYNC="0.5",
        SANDPOD_READY_TIMEOUT="30",
        SANDPOD_POD_NATS_CIDRS="127.0.0.1/32",
        **env,
    )


def _conn(cluster: Cluster) -> dict[str, Any]:
    return {"nats_url": cluster.nats.url, "prefix": cluster.prefix, "wait": DEADLINE}


def _ws(cluster: Cluster, name: str) -> Path:
    return cluster.state / "pods" / name / "workspace"


async def _sh(sbx: AsyncSandbox, script: str) -> str:
    r = await sbx.exec("/workspace", ["sh", "-c", script], timeout=60)
    assert r.exit_code == 0, (r.exit_code, r.stderr)
    return r.stdout


def _tree(root: Path) -> dict[str, tuple[str, int, str, str]]:
    """path -> (type, permission bits, content or link target, user.* xattrs) of every entry
    below root."""
    out: dict[str, tuple[str, int, str, str]] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            st = p.lstat()
            rel = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", 0, os.readlink(p), "")
                continue
            attrs = ",".join(
                f"{n}={os.getxattr(p, n)!r}" for n in sorted(os.listxattr(p)) if n[:5] == "user."
            )
            if stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode), "", attrs)
            else:
                out[rel] = ("file", stat.S_IMODE(st.st_mode), p.read_bytes().hex(), attrs)
    return out


XATTRS = (
    "python3 -c \"import os; os.setxattr('a', 'user.note', b'hello'); "
    "os.setxattr('d', 'user.bin', bytes(range(256)))\""
)


FILES = (
    "mkdir -p d/empty d/deep/er && printf 'alpha' > a && chmod 0751 a && "
    "head -c 300000 /dev/urandom > d/deep/er/blob && ln -s a rel && ln -s /etc/passwd abs && "
    "echo doomed > d/doomed && mkdir gone && echo x > gone/f && chmod 0700 d/deep"
)


async def test_a_pod_snapshot_restores_byte_exact_into_new_pods_and_forks_are_isolated(
    cluster: Cluster, snapshots_in: S3Server | None
) -> None:
    """A Pod sandbox's /workspace is captured through its execd (frozen: the status says how,
    and that only /workspace is captured); a second snapshot after a few changes stores one
    small layer with whiteouts; a sandbox created from it gets exactly the source's files
    (modes, symlinks, empty directories, user.* extended attributes, binary ones too; deleted
    files and directories absent) before it is
    Ready; two forks do not see each other's writes. With S3 the layers are the server's
    objects."""
    src = await AsyncSandbox.create(name=f"ks-{uuid.uuid4().hex[:6]}", **_conn(cluster))
    try:
        await _sh(src, f"{FILES} && {XATTRS}")
        first = await src.snapshot(name=f"s1-{uuid.uuid4().hex[:4]}")
        await _sh(src, "rm d/doomed && rm -r gone && echo later > d/later && chmod 0640 a")
        second = await src.snapshot(name=f"s2-{uuid.uuid4().hex[:4]}")
        s1, s2 = first.raw["status"], second.raw["status"]
        assert len(s2["layers"]) == len(s1["layers"]) + 1  # one layer added to the chain
        assert s2["sizeBytes"] < 10_000 < s1["sizeBytes"]  # the blob was not stored again
        ready = next(c for c in s2["conditions"] if c["type"] == "Ready")
        assert "/workspace and root fs changes" in ready["message"], ready
        assert "frozen by" in ready["message"]
        if snapshots_in is not None:
            digests = [x["digest"] for x in s2["layers"]]
            assert all(snapshots_in.object_path("layers", d).exists() for d in digests)

        restored = await AsyncSandbox.create(snapshot=second.name, **_conn(cluster))
        try:
            assert (await restored.describe()).phase == "Running"
            tree = _tree(_ws(cluster, restored.id))
            assert tree == _tree(_ws(cluster, src.id))
            assert "user.note=b'hello'" in tree["a"][3] and "user.bin" in tree["d"][3]
            assert not (_ws(cluster, restored.id) / "gone").exists()
            assert await _sh(restored, "cat d/later") == "later\n"
        finally:
            await restored.kill()
            await restored.close()

        forks = await src.fork(2, snapshot=first.name)
        try:
            await _sh(forks[0], "echo mine > d/doomed && echo new > only-here")
            assert await _sh(forks[1], "cat d/doomed; ls") == "doomed\na\nabs\nd\ngone\nrel\n"
            assert await _sh(src, "ls") == "a\nabs\nd\nrel\n"  # the source unchanged too
        finally:
            for fork in forks:
                await fork.kill()
                await fork.close()
    finally:
        await src.kill()
        await src.close()


def _root(cluster: Cluster, name: str) -> Path:
    """The Pod's root filesystem here (the fake kubelet's image files: ``IMAGE_FILES``)."""
    return cluster.state / "pods" / name / "rootfs"


ROOT_CHANGES = (
    "echo new > $R/app/new && chmod 0600 $R/app/new && rm $R/app/old && "
    "echo changed > $R/app/readme && mkdir -m 0750 $R/app/made && ln -s readme $R/app/link && "
    "rm -r $R/app/lib && mkdir $R/app/lib && echo other > $R/app/lib/x && echo 1 > $R/etc/added"
)


async def test_a_pod_snapshot_keeps_the_root_filesystems_changes_deletions_too(
    cluster: Cluster, snapshots_in: S3Server | None
) -> None:
    """What the sandbox changed outside /workspace, in its container's root filesystem, is
    captured in the same snapshot as its own part: files written, made, linked, chmod-ed, and
    the image's files it deleted (a directory replaced by a new one loses what the image had
    in it). A sandbox restored from it has exactly that root filesystem before it is Ready
    (and a snapshot of it stores no layer: the restore's own writes are no change); a second
    snapshot stores only the next change, and its restore applies the whole chain.
    The image's untouched files are never stored."""
    src = await AsyncSandbox.create(name=f"kr-{uuid.uuid4().hex[:6]}", **_conn(cluster))
    try:
        root = _root(cluster, src.id)
        image = _tree(root)
        await _sh(src, f"R={root} && {ROOT_CHANGES}")
        first = await src.snapshot(name=f"r1-{uuid.uuid4().hex[:4]}")
        s1 = first.raw["status"]
        assert {x["part"] for x in s1["layers"]} == {"workspace", "podroot"}, s1
        changed = _tree(root)
        assert changed != image and "app/old" not in changed and "etc/motd" in changed

        restored = await AsyncSandbox.create(snapshot=first.name, **_conn(cluster))
        try:
            assert (await restored.describe()).phase == "Running"
            assert _tree(_root(cluster, restored.id)) == changed
            # nothing changed since the restore (which wrote into the image's directories)
            same = await restored.snapshot(name=f"r0-{uuid.uuid4().hex[:4]}")
            assert len(same.raw["status"]["layers"]) == len(s1["layers"]), same.raw["status"]
            await _sh(
                restored,
                f"R={_root(cluster, restored.id)} && rm $R/app/new && "
                "echo again > $R/app/made/f && rm $R/etc/motd",
            )
            second = await restored.snapshot(name=f"r2-{uuid.uuid4().hex[:4]}")
            s2 = second.raw["status"]
            assert len(s2["layers"]) == len(s1["layers"]) + 1, s2  # the root part's change
            assert s2["sizeBytes"] < 10_000, s2
            again = _tree(_root(cluster, restored.id))
        finally:
            await restored.kill()
            await restored.close()
        third = await AsyncSandbox.create(snapshot=second.name, **_conn(cluster))
        try:
            tree = _tree(_root(cluster, third.id))
            assert tree == again, (tree, again)
            assert "app/new" not in tree and "etc/motd" not in tree and "app/lib/mod.py" not in tree
            assert tree["app/made/f"][2] == b"again\n".hex()
        finally:
            await third.kill()
            await third.close()
    finally:
        await src.kill()
        await src.close()


async def test_a_changed_layer_object_is_refused_on_restore(
    cluster: Cluster, snapshots_in: S3Server | None
) -> None:
    """A layer whose object was changed behind the platform's back (in the S3 server's
    storage, or put again in the JetStream object store) is never unpacked: the restored
    Sandbox fails (SnapshotUnavailable), it does not start empty or with other files."""
    async with await AsyncSandbox.create(
        name=f"kc-{uuid.uuid4().hex[:6]}", **_conn(cluster)
    ) as src:
        await _sh(src, "echo precious > f")
        snap = await src.snapshot()
        digest = snap.raw["status"]["layers"][-1]["digest"]
        if snapshots_in is not None:
            snapshots_in.object_path("layers", digest).write_bytes(b"changed behind its back")
        else:
            nc = await nats.connect(cluster.nats.url)
            try:
                store = await nc.jetstream().object_store(f"{cluster.prefix}-snapshots")
                await store.put(digest, b"changed behind its back")
            finally:
                await nc.close()
        with pytest.raises(SandboxError, match="cannot be restored"):
            await AsyncSandbox.create(snapshot=snap.name, **_conn(cluster))
        await src.kill()


async def _until(what: str, done: Callable[[], Any], timeout: float = DEADLINE) -> None:
    async with asyncio.timeout(timeout):
        while not await done():
            await asyncio.sleep(0.05)
    assert await done(), what  # the loop ended on it


async def test_an_idle_pod_sandbox_hibernates_without_its_pod_and_exec_wakes_it(
    cluster: Cluster,
) -> None:
    """idlePolicy Hibernate in Kubernetes mode: idle, the sandbox's files go into its
    hibernation snapshot and its Pod is deleted while the Sandbox stays, listed Hibernated
    (FilesOnly); the next exec wakes it into a new Pod restored from that snapshot (the old
    Pod's emptyDir is gone, as on a real node) with its files intact."""
    _lifecycle(cluster)
    await cluster.answering()
    sbx = await AsyncSandbox.create(
        name=f"kh-{uuid.uuid4().hex[:6]}", idle_timeout=2, idle_policy="Hibernate", **_conn(cluster)
    )
    try:
        await _sh(sbx, "mkdir -p keep/empty && echo kept > keep/f && chmod 0604 keep/f")
        before = await cluster.pod_uids(sbx.id)
        assert len(before) == 1

        async def hibernated() -> bool:
            return (await sbx.describe()).phase == "Hibernated"

        await _until("Hibernated", hibernated)
        assert await cluster.pod_uids(sbx.id) == []
        await cluster.kubelet.until("execd stopped", lambda: sbx.id in cluster.kubelet.stopped)
        listed = await AsyncSandbox.list(nats_url=cluster.nats.url, prefix=cluster.prefix)
        assert [x.phase for x in listed if x.name == sbx.id] == ["Hibernated"]
        cond = (await sbx.describe()).condition("Hibernated") or {}
        assert (cond.get("status"), cond.get("reason")) == ("True", "FilesOnly")
        shutil.rmtree(_ws(cluster, sbx.id))  # a deleted Pod's emptyDir is gone

        assert await _sh(sbx, "cat keep/f; stat -c %a keep/f; ls keep") == "kept\n604\nempty\nf\n"
        after = await cluster.pod_uids(sbx.id)
        assert len(after) == 1 and after != before
        assert (await sbx.describe()).phase == "Running"
    finally:
        await sbx.kill()
        await sbx.close()
        await asyncio.to_thread(delete_all, cluster.plane.settings, "SandboxSnapshot", [NS])


async def test_another_tenant_cannot_restore_a_pod_snapshot(cluster: Cluster) -> None:
    """Tenant beta cannot get, delete, restore from, or fork acme's snapshot of a Pod sandbox,
    by acme's name or by its platform id."""
    _lifecycle(cluster)
    await cluster.answering()
    bus = await Bus.connect(BusSettings(url=cluster.nats.url, name="tenants"))
    try:
        acme = Subjects(cluster.prefix, tenant="acme")
        beta = Subjects(cluster.prefix, tenant="beta")
        obj = {"kind": "Sandbox", "metadata": {"name": "src"}, "spec": {}}
        request = ObjectRequest(object=obj, wait_ready=DEADLINE)
        await api_call(bus, acme, "sandboxes", "create", request, ObjectReply, timeout=DEADLINE)
        snap_obj = {
            "kind": "SandboxSnapshot",
            "metadata": {"name": "mine"},
            "spec": {"sourceRef": {"name": "src"}},
        }
        request = ObjectRequest(object=snap_obj, wait_ready=DEADLINE)
        made = await api_call(
            bus, acme, "snapshots", "create", request, ObjectReply, timeout=DEADLINE
        )
        snap_id = made.object["metadata"]["name"]
        assert made.object["status"]["phase"] == "Ready"
        for target in ("mine", snap_id):
            with pytest.raises(ResourceNotFound):
                await api_call(bus, beta, "snapshots", "get", Ref(name=target), ObjectReply)
            with pytest.raises(ResourceNotFound):
                await api_call(bus, beta, "snapshots", "delete", Ref(name=target), ObjectReply)
            steal = {"kind": "Sandbox", "spec": {"snapshotRef": {"name": target}}}
            request = ObjectRequest(object=steal, wait_ready=DEADLINE)
            with pytest.raises(ResourceInvalid):
                await api_call(bus, beta, "sandboxes", "create", request, ObjectReply, timeout=30)
        await api_call(bus, acme, "sandboxes", "delete", Ref(name="src"), ObjectReply)
    finally:
        await bus.close()
        await asyncio.to_thread(delete_all, cluster.plane.settings, "SandboxSnapshot", [NS])


def _hostile_tar(outside: Path) -> bytes:
    """A tar with ``../`` names and the symlink-then-file trick aimed at ``outside``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> None:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, link
            data = b"pwned" if kind == tarfile.REGTYPE else b""
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)

        add("../../../../../../" + str(outside).lstrip("/") + "/dotdot")
        add("abs", tarfile.SYMTYPE, str(outside))
        add("abs/through-absolute")
        add("up", tarfile.SYMTYPE, "../../../../../../" + str(outside).lstrip("/"))
        add("up/through-relative")
        add("fine")
    return buf.getvalue()


async def test_a_restore_stream_cannot_write_outside_the_workspace_through_execd(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The restore path (execd's extract: the sandbox's own tar) refuses members named with
    ``..`` and files placed through a symlink the same stream made (absolute or relative):
    nothing lands outside the target; the tar says it refused (ArchiveFailed). execd's
    ``sys.snapshot`` answers bad input with a typed error."""
    _lifecycle(cluster)
    await cluster.answering()
    outside = tmp_path / "outside"
    outside.mkdir()
    async with await AsyncSandbox.create(
        name=f"ka-{uuid.uuid4().hex[:6]}", **_conn(cluster)
    ) as sbx:
        with pytest.raises(ArchiveFailed, match="Member name contains"):
            await sbx.fs.extract("/workspace/in", _hostile_tar(outside))
        assert list(outside.iterdir()) == []
        assert (_ws(cluster, sbx.id) / "in" / "fine").read_bytes() == b"pwned"

        bus = await Bus.connect(BusSettings(url=cluster.nats.url, name="bad-input"))
        try:
            subject = Subjects(cluster.prefix).sandbox(sbx.id, "sys", "snapshot")
            bad_input = (
                SnapshotTake(path="/etc"),
                SnapshotTake(path="/workspace/../../etc"),
                SnapshotTake(timeout=0),
            )
            for bad in bad_input:
                reply = await bus.request(subject, encode(bad), 10)
                with pytest.raises(BadRequest):
                    decode_reply(SnapshotTaken, reply)
        finally:
            await bus.close()
        await sbx.kill()


LOOP = "i=0; while :; do i=$((i+1)); echo $i > counter; sleep 0.02; done"


def _count(path: Path) -> int:
    try:
        return int(path.read_text().strip() or 0)
    except (OSError, ValueError):  # not written yet, or caught mid-write
        return 0


@pytest.mark.parametrize("freezer", ["signals", "auto"])
async def test_a_snapshot_freezes_the_commands_for_the_copy_then_lets_them_run_on(
    cluster: Cluster, freezer: str
) -> None:
    """A background writer is frozen for the copy (the condition names the mechanism: signals
    or the cgroup freezer) and runs on afterwards; a paused sandbox's snapshot leaves it
    paused. A second snapshot with nothing changed adds no layer."""
    cluster.kubelet.execd_env["SANDPOD_EXECD_FREEZER"] = freezer
    _lifecycle(cluster)
    await cluster.answering()
    try:
        async with await AsyncSandbox.create(
            name=f"kf-{uuid.uuid4().hex[:6]}", **_conn(cluster)
        ) as sbx:
            counter = _ws(cluster, sbx.id) / "counter"
            await sbx.proc.start(LOOP)

            async def counting(above: int) -> bool:
                return _count(counter) > above

            await _until("the counter runs", lambda: counting(2))
            info = (await sbx.pause()).phase
            assert info == "Paused"
            snap = await sbx.snapshot()
            ready = next(c for c in snap.raw["status"]["conditions"] if c["type"] == "Ready")
            mechanism = "signals" if freezer == "signals" else "cgroup"
            assert f"frozen by {mechanism}" in ready["message"]
            assert (await sbx.describe()).phase == "Paused"
            held = _count(counter)
            again = await sbx.snapshot()
            assert again.raw["status"]["layers"] == snap.raw["status"]["layers"]
            assert _count(counter) == held  # still frozen after both snapshots
            await sbx.resume()
            await _until("the counter runs on", lambda: counting(held + 2))
            await sbx.snapshot()
            after = _count(counter)
            await _until("and on after a snapshot", lambda: counting(after + 2))
            await sbx.kill()
    finally:
        await asyncio.to_thread(delete_all, cluster.plane.settings, "SandboxSnapshot", [NS])
