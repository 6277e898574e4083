"""Local snapshots taken from real jails and restored into new ones: exact, isolated, stable.

Each test creates real jails with the local runtime (namespaces, overlayfs, cgroups), captures
them with :class:`LocalSnapshots` into a layer store and restores the chain into other jails
(id-mapped read-only lower layers under a fresh writable layer), then compares what the
sandboxes themselves see. The blob store here is a directory (the lifecycle tests use the
JetStream object store); its objects are tampered with to show a changed layer is refused.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from test_jail import _config, _runtime, background, ok, run

from sandpod_blobs import MemoryBlobStore
from sandpod_lifecycle.runtime import snapdiff
from sandpod_lifecycle.runtime.base import InstanceSpec, InstanceStatus
from sandpod_lifecycle.runtime.local import LocalRuntime
from sandpod_lifecycle.runtime.localsnap import LocalSnapshots
from sandpod_lifecycle.runtime.snapdiff import CaptureFailed
from sandpod_lifecycle.runtime.snaplayers import LayerCorrupt, LayerStore

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="snapshots of the local runtime need root: run as root"
)

# Every property a restore must keep, as the sandbox sees it (uids shown as names: a restored
# sandbox has its own uid, its files are its own).
LISTING = (
    "cd / && find /workspace /var/tmp/snap ! -type d -printf '%p %M %u %g %s %l %n\\n' | sort && "
    "find /workspace /var/tmp/snap -type d -printf '%p %M %u %g\\n' | sort && "
    "find /workspace /var/tmp/snap -type f -exec md5sum {} + | sort && "
    "stat -c 'sparse %s %b' /workspace/sparse && "
    "python3 -c 'import os; [print(p, sorted((n, os.getxattr(p, n)) for n in os.listxattr(p)))"
    ' for p in ("/workspace/attr", "/workspace/dir")]\''
)
PREPARE = """
set -e
mkdir -p /var/tmp/snap/empty /workspace/dir/sub /workspace/emptydir
printf 'exec' > /workspace/run.sh && chmod 0750 /workspace/run.sh
printf 'secret' > /workspace/private && chmod 0600 /workspace/private
head -c 300000 /dev/urandom > /workspace/dir/sub/blob
ln -s dir/sub/blob /workspace/link && ln -s /nowhere /workspace/dangling
printf 'same' > /workspace/hard1 && ln /workspace/hard1 /workspace/hard2
truncate -s 64M /workspace/sparse && printf 'tail' >> /workspace/sparse
printf 'x' > /workspace/attr
python3 -c 'import os; os.setxattr("/workspace/attr", "user.tag", b"blue")'
python3 -c 'import os; os.setxattr("/workspace/dir", "user.dirtag", b"green")'
printf 'keep' > /var/tmp/snap/keep && printf 'gone' > /var/tmp/snap/gone
printf 'gone' > /workspace/gone && chmod 1777 /workspace/emptydir
"""


@pytest.fixture
def state() -> Iterator[Path]:
    path = Path("/var/tmp") / f"sandpod-snap-test-{uuid.uuid4().hex[:8]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def runtime(state: Path) -> AsyncIterator[LocalRuntime]:
    async with _runtime(_config(state / "jails")) as rt:
        yield rt


@pytest.fixture
def base(default_rootfs: Path | None) -> Path:
    if default_rootfs is None:
        pytest.fail("the session could not build the default rootfs (mmdebstrap): see its log")
    return default_rootfs


@pytest.fixture
def snaps(runtime: LocalRuntime, state: Path) -> LocalSnapshots:
    return LocalSnapshots(runtime, LayerStore(state / "snapshots", MemoryBlobStore()))


async def _make(runtime: LocalRuntime, base: Path, **spec: object) -> InstanceStatus:
    sid = f"s-{uuid.uuid4().hex[:10]}"
    return await runtime.create(
        InstanceSpec(sandbox_id=sid, rootfs=base, **spec)  # type: ignore[arg-type]
    )


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for dirpath, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(files + dirs):
            p = Path(dirpath, name)
            st = p.lstat()
            h.update(f"{p.relative_to(root)} {st.st_mode} {st.st_uid} {st.st_size}".encode())
            if p.is_file() and not p.is_symlink():
                h.update(p.read_bytes())
    return h.hexdigest()


async def test_a_restore_is_byte_exact_including_deletions(
    runtime: LocalRuntime, snaps: LocalSnapshots, base: Path
) -> None:
    """Modes, owners, symlinks, hard links, xattrs, sparse files, empty directories and
    deletions (whiteouts, in both parts) come back exactly, in a sandbox of another uid."""
    a = await _make(runtime, base)
    await ok(a, PREPARE)
    first = await snaps.capture(a.sandbox_id)
    snaps.commit(first, "first")
    await ok(a, "rm /var/tmp/snap/gone /workspace/gone && printf more >> /workspace/private")
    second = await snaps.capture(a.sandbox_id)
    assert len(second.chain) == len(first.chain) + len(second.new)
    want = await ok(a, LISTING)
    b = await _make(runtime, base, snapshot=await snaps.restore_layers(second.chain))
    assert b.uid != a.uid
    got = await ok(b, LISTING)
    assert got == want
    assert "gone" not in got and "/var/tmp/snap/keep" in got
    assert "('user.tag', b'blue')" in got and "('user.dirtag', b'green')" in got
    # the sparse file is still sparse (64 MiB apparent, a few KiB allocated)
    size, blocks = next(ln for ln in got.splitlines() if ln.startswith("sparse ")).split()[1:]
    assert int(size) == 64 * 2**20 + 4 and int(blocks) < 64
    # the restored files are the new sandbox's own: it can change them
    await ok(b, "printf b >> /workspace/private && rm /workspace/dir/sub/blob")


async def test_forks_are_isolated_from_each_other_and_the_layers(
    runtime: LocalRuntime, snaps: LocalSnapshots, base: Path
) -> None:
    """Two forks of one snapshot and its source never see each other's writes, and nothing a
    fork does (writes, deletes, chmod, xattrs) changes the shared layer on the host."""
    a = await _make(runtime, base)
    await ok(a, "printf base > /workspace/f && mkdir /workspace/d && printf x > /workspace/d/x")
    cap = await snaps.capture(a.sandbox_id)
    layers = await snaps.restore_layers(cap.chain)
    before = [_tree_digest(layer.path) for layer in layers]
    b = await _make(runtime, base, snapshot=layers)
    c = await _make(runtime, base, snapshot=layers)
    await ok(b, "printf B > /workspace/f && rm -r /workspace/d && chmod 0 /workspace/f")
    await ok(c, "printf C >> /workspace/f")
    await ok(a, "printf A > /workspace/only-a")
    assert await ok(c, "cat /workspace/f; ls /workspace") == "baseCd\nf\n"
    assert await ok(a, "cat /workspace/f") == "base"
    assert (await run(b, "cat /workspace/d/x")).returncode != 0
    assert [_tree_digest(layer.path) for layer in layers] == before
    # the source's uid (swapped away in the forks) cannot reach the layer through a fork
    mounts = await ok(c, "cat /proc/self/mountinfo")
    assert str(snaps.layers.root) not in mounts


async def test_an_incremental_snapshot_stores_only_what_changed(
    runtime: LocalRuntime, snaps: LocalSnapshots, base: Path
) -> None:
    """After one file changes, the next snapshot adds one small layer holding just that file."""
    a = await _make(runtime, base)
    await ok(a, "for i in $(seq 200); do head -c 20000 /dev/urandom > /workspace/f$i; done")
    first = await snaps.capture(a.sandbox_id)
    snaps.commit(first, "first")
    await ok(a, "printf changed > /workspace/f7")
    second = await snaps.capture(a.sandbox_id)
    assert [layer.part for layer in second.new] == ["workspace"]
    files = sorted(p.name for p in snaps.layers.path(second.new[0].digest).rglob("*"))
    assert files == ["f7"]
    b = await _make(runtime, base, snapshot=await snaps.restore_layers(second.chain))
    assert await ok(b, "cat /workspace/f7; ls /workspace | wc -l") == "changed200\n"


async def test_a_snapshot_taken_while_a_process_writes_is_consistent(
    runtime: LocalRuntime, snaps: LocalSnapshots, base: Path
) -> None:
    """A writer replaces a then b (each atomically) in a loop; every snapshot (taken frozen: one
    instant) has b <= a <= b+1, never a pair from two moments, and the writer runs on."""
    a = await _make(runtime, base)
    await background(
        a,
        "cd /workspace; i=0; while :; do i=$((i+1)); echo $i > a.new; mv a.new a; "
        "head -c 200000 /dev/zero > pad; echo $i > b.new; mv b.new b; done",
    )
    await ok(a, "while [ ! -s /workspace/b ]; do :; done")
    for _ in range(5):
        cap = await snaps.capture(a.sandbox_id)
        snaps.commit(cap, "cap")
        fork = await _make(runtime, base, snapshot=await snaps.restore_layers(cap.chain))
        first, second = (await ok(fork, "cat /workspace/a /workspace/b")).split()
        assert int(second) <= int(first) <= int(second) + 1, (first, second)
        await runtime.destroy(fork.sandbox_id)
    n1 = int((await ok(a, "cat /workspace/b")).strip() or 0)
    await ok(a, f"while [ $(cat /workspace/b) -le {n1} ]; do :; done")


async def test_a_changed_layer_object_is_refused(
    runtime: LocalRuntime, snaps: LocalSnapshots, state: Path, base: Path
) -> None:
    """A blob changed in the store is refused on restore (nothing unpacked, no layer kept)."""
    a = await _make(runtime, base)
    await ok(a, "printf data > /workspace/f")
    cap2 = await snaps.capture(a.sandbox_id)
    await snaps.layers.evict(cap2.new[0].digest)  # this node forgets it; the store keeps it
    blobs = snaps.layers.blobs
    assert isinstance(blobs, MemoryBlobStore)
    blobs.tamper(cap2.new[0].digest, b"tampered")
    with pytest.raises(LayerCorrupt):
        await snaps.restore_layers(cap2.chain)
    assert not snaps.layers.has(cap2.new[0].digest)
    assert not any((snaps.layers.root / "staging").iterdir())


async def test_a_directory_swapped_for_a_host_symlink_copies_nothing_of_the_host(
    tmp_path: Path,
) -> None:
    """The capture's copy resolves every path inside its own root: a directory the sandbox
    swapped for a symlink to /etc while it was being copied (the path list still names
    ``d/shadow``) reaches no host file (run without the chroot, it copied /etc/shadow)."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    (src / "d").symlink_to("/etc")
    dest.mkdir()
    with pytest.raises(CaptureFailed):
        await snapdiff._copy(src, dest, ["d/shadow"])
    assert not (dest / "d" / "shadow").exists()
    assert not any(p.is_file() for p in dest.rglob("*"))
