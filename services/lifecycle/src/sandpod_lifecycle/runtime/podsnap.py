"""Snapshots of Pod sandboxes (Kubernetes mode): captured and restored through the Pod's execd.

A Pod's files are reachable only through its execd, over NATS with the lifecycle's own
credentials. Two parts are captured, in one freeze: the sandbox's ``/workspace`` (its emptyDir,
whole) and what changed in the container's root filesystem since execd started (the writable
layer as the sandbox sees it: ``sandpod_execd.snaptar``, ``podtar``, ``podroot``). Each part
has its layers (``LayerInfo.part``: ``workspace`` or ``podroot``) and its manifest in the
capture record. An execd without a root filesystem to capture (an older one) gives the
workspace only, and the Snapshot's condition says so.

Capture (:meth:`PodSnapshots.capture`):

    sys.snapshot      execd freezes the commands (cgroup freezer or SIGSTOP: the reply says
                      which), writes /workspace and the root filesystem's changes as two tars
                      into private files, thaws them
    fs.read           the lifecycle downloads the files (flow-controlled chunks) into staging,
    fs.remove         then removes them from the Pod
    check + diff      ``podtar.read_archive`` refuses hostile members; ``podtar.changes``
                      against the instance's capture record (its last capture, or the
                      snapshot it was restored from) says what changed
    layer             ``podtar.write_layer`` writes the change as a layer tar, zstd-compressed
                      and stored by digest in the blob store (JetStream object store or S3):
                      the same blobs, digests and ``LayerInfo`` as the local runtime's layers

Restore (:meth:`PodSnapshots.restore_into`, called by the Pod driver once a new Pod is Ready
and before the Sandbox is): every layer is fetched and verified against its digest
(a changed object is ``LayerCorrupt``: the Sandbox fails ``SnapshotUnavailable``), the chain
is merged per part (``podtar.merge_layers``: whiteouts become absences, listings apply) and
streamed into the Pod's ``/workspace`` by the sandbox's own ``tar -x``
(``sandpod_client.archive.extract``: as the sandbox's user, inside the Pod); the root part goes
into the Pod's root filesystem (``podroot.unpack_rootfs``). The restored trees become the
instance's capture record, so the next snapshot of it stores only what changed since.

A capture record is valid for one instance: the execd that answered ``sys.info`` (hostname,
pid, start time), which is new in every Pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import shutil
import tarfile
from pathlib import Path
from typing import Literal

import msgpack
import zstandard

from sandpod_bus import Bus
from sandpod_client import Channel, FileReader
from sandpod_client.archive import extract
from sandpod_contract.errors import BlobCorrupt, SandpodError
from sandpod_contract.messages.common import Empty
from sandpod_contract.messages.fs import FsRemove, FsRemoved
from sandpod_contract.messages.system import Info, Pong, SnapshotTake, SnapshotTaken
from sandpod_contract.resources import ConditionReason
from sandpod_contract.subjects import Subjects
from sandpod_lifecycle.runtime.base import InstanceUnhealthy, RuntimeFailure, SnapshotLayer
from sandpod_lifecycle.runtime.podroot import file_chunks, unpack_rootfs
from sandpod_lifecycle.runtime.podtar import (
    CaptureRefused,
    PodManifest,
    below_root,
    changes,
    merge_layers,
    read_archive,
    write_layer,
)
from sandpod_lifecycle.runtime.snaplayers import (
    LayerCorrupt,
    LayerInfo,
    LayerStore,
    SnapshotStoreFailed,
)

__all__ = ["WORKSPACE_ONLY", "PodCapture", "PodSnapshots"]

RECORD_VERSION = 2
PARTS = ("workspace", "podroot")  # (a local snapshot's rootfs layers are not a Pod's)
WORKSPACE = "/workspace"
FREEZE_TIMEOUT = 10.0  # seconds execd may take to freeze the commands
ARCHIVE_TIMEOUT = 600.0  # seconds execd may take to write the archive (a large workspace)
READY_TIMEOUT = 30.0  # seconds a new Pod's execd has to answer before a restore
CHUNK = 1 << 20
WORKSPACE_ONLY = "/workspace only (this execd cannot capture the container's root filesystem)"


@dataclasses.dataclass(frozen=True, slots=True)
class PodCapture:
    """A capture's result: the whole chain (bottom first) and what :meth:`commit` records."""

    sandbox_id: str
    chain: tuple[LayerInfo, ...]
    new: tuple[LayerInfo, ...]  # 0 or 1 layer
    instance: str  # the execd it was taken from
    manifests: dict[str, PodManifest]  # part -> its tree (the root's: what changed)
    mechanism: str  # how the commands were frozen
    previous: str | None = None  # the committed capture (or restore) this one adds to

    @property
    def workspace_only(self) -> bool:
        return "podroot" not in self.manifests


@dataclasses.dataclass(frozen=True, slots=True)
class _Record:
    name: str
    chain: tuple[LayerInfo, ...]
    manifests: dict[str, PodManifest]


class PodSnapshots:
    def __init__(self, layers: LayerStore, bus: Bus, subjects: Subjects) -> None:
        self.layers = layers
        self._bus = bus
        self._subjects = subjects
        self._records = layers.root / "pod-instances"
        self._records.mkdir(mode=0o700, exist_ok=True)
        self._fetched: dict[Path, tuple[LayerInfo, ...]] = {}  # staging dir -> its chain

    def _channel(self, sandbox_id: str) -> Channel:
        return Channel(self._bus, self._subjects, sandbox_id)

    async def _instance(self, ch: Channel) -> tuple[str, str]:
        """(the execd instance's identity, its root filesystem: "" if it captures none)."""
        info = await ch.call("sys", "info", Empty(), Info, 10.0)
        return f"{info.hostname}/{info.pid}/{info.started_at!r}", info.rootfs

    async def capture(self, sandbox_id: str, restored: tuple[LayerInfo, ...] = ()) -> PodCapture:
        """Capture the running Pod sandbox ``sandbox_id``; ``restored``: the chain it was
        created from, used when it has no capture record.

        Raises:
            SandpodError: execd refused or is unreachable (SandboxUnavailable...).
            CaptureRefused: the archive holds a hostile member. CaptureFailed,
                SnapshotStoreFailed: the layer could not be made or stored.
        """
        ch = self._channel(sandbox_id)
        instance, _ = await self._instance(ch)
        staged = self.layers.staging()
        try:
            files = {part: staged / f"{part}.tar" for part in PARTS}
            taken = await self._download(ch, files)
            record = self._load(sandbox_id, instance)
            manifests: dict[str, PodManifest] = {}
            new: list[LayerInfo] = []
            for part, full in files.items():
                if not full.exists():  # no root part: an execd that cannot capture it
                    continue
                manifests[part] = manifest = await asyncio.to_thread(read_archive, full)
                base = None if record is None else record.manifests.get(part)
                if base is not None and base.entries == manifest.entries:
                    continue
                diff = changes(base, manifest, whiteouts=part == "workspace")
                if diff == ([""], []) and (base is not None or part == "podroot"):
                    continue  # the root's own metadata is never restored: no change
                layer = staged / f"{part}.layer.tar"
                await asyncio.to_thread(write_layer, full, manifest, diff, layer)
                await asyncio.to_thread(full.unlink)
                owner = manifests["workspace"].entries[""][2]
                new.append(await self._seal(layer, part, owner))
            chain = restored if record is None else record.chain
            previous = None if record is None else record.name
            return PodCapture(
                sandbox_id,
                (*chain, *new),
                tuple(new),
                instance,
                manifests,
                taken.mechanism,
                previous,
            )
        finally:
            await asyncio.to_thread(shutil.rmtree, staged, True)

    async def _download(self, ch: Channel, dest: dict[str, Path]) -> SnapshotTaken:
        """``sys.snapshot`` of the workspace and the root filesystem's changes, read into
        ``dest[part]`` (the root's only when execd wrote it) and removed from the Pod."""
        request = SnapshotTake(path=WORKSPACE, timeout=FREEZE_TIMEOUT, rootfs=True)
        taken = await ch.call("sys", "snapshot", request, SnapshotTaken, ARCHIVE_TIMEOUT)
        files = [("workspace", taken.file, taken.size)]
        if taken.rootfs_file:
            files.append(("podroot", taken.rootfs_file, taken.rootfs_size))
        try:
            for part, file, size in files:
                # never more than execd wrote: the sandbox may replace the file once thawed
                reader = FileReader(ch, file, size_hint=size, max_size=size)
                try:
                    with dest[part].open("wb") as out:
                        async for chunk in reader:
                            await asyncio.to_thread(out.write, chunk)
                finally:
                    await reader.aclose()
        finally:
            for _, file, _ in files:
                with contextlib.suppress(SandpodError):
                    await ch.call("fs", "remove", FsRemove(path=file), FsRemoved, 30.0)
        return taken

    async def _seal(self, tar: Path, part: str, owner: int) -> LayerInfo:
        """Compress, hash and store the layer tar ``tar``; its LayerInfo."""
        blob = tar.with_suffix(".zst")
        digest, size = await asyncio.to_thread(_compress, tar, blob)
        unpacked = (await asyncio.to_thread(tar.stat)).st_size
        try:
            stored = await self.layers.blobs.put_file(blob)
        except SandpodError as exc:
            raise SnapshotStoreFailed(f"cannot store a layer: {exc}") from exc
        if stored.digest != digest:
            raise SnapshotStoreFailed(f"layer {digest} was stored as {stored.digest}")
        return LayerInfo(digest, size, part, owner, unpacked)

    def commit(self, capture: PodCapture, name: str) -> None:
        """Record ``capture`` (stored as snapshot ``name``): the next capture diffs from it."""
        self._write(capture.sandbox_id, name, capture.instance, capture.chain, capture.manifests)

    def _write(
        self,
        sandbox_id: str,
        name: str,
        instance: str,
        chain: tuple[LayerInfo, ...],
        manifests: dict[str, PodManifest],
    ) -> None:
        raw = {
            "version": RECORD_VERSION,
            "name": name,
            "instance": instance,
            "chain": [dataclasses.asdict(layer) for layer in chain],
            "manifests": {part: m.encode() for part, m in manifests.items()},
        }
        path = self._records / sandbox_id
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(msgpack.packb(raw))
        tmp.rename(path)

    def _load(self, sandbox_id: str, instance: str) -> _Record | None:
        try:
            raw = msgpack.unpackb((self._records / sandbox_id).read_bytes())
            if raw.get("version") != RECORD_VERSION or raw["instance"] != instance:
                return None  # another Pod of the same name: its files are not ours
            chain = tuple(LayerInfo(**layer) for layer in raw["chain"])
            manifests = {str(p): PodManifest.decode(m) for p, m in raw["manifests"].items()}
            return _Record(str(raw["name"]), chain, manifests)
        except (OSError, ValueError, TypeError, KeyError, msgpack.UnpackException):
            return None

    def forget(self, sandbox_id: str) -> None:
        """Drop the capture record of an instance that is gone."""
        with contextlib.suppress(FileNotFoundError):
            (self._records / sandbox_id).unlink()

    async def restore_layers(self, chain: tuple[LayerInfo, ...]) -> tuple[SnapshotLayer, ...]:
        """The chain's layer tars, fetched and verified into one staging directory (removed
        by :meth:`restore_into`).

        Raises:
            LayerCorrupt: a stored layer was changed. SnapshotStoreFailed: cannot fetch.
        """
        staged = self.layers.staging()
        out = []
        try:
            for i, layer in enumerate(x for x in chain if x.part in PARTS):
                blob, tar = staged / f"{i}.zst", staged / f"{i}.tar"
                try:
                    await self.layers.blobs.get_file(layer.digest, blob)  # checks the digest
                except BlobCorrupt as exc:
                    raise LayerCorrupt(
                        f"layer {layer.digest} does not match its digest: the stored object "
                        "was changed; this snapshot cannot be restored",
                        digest=layer.digest,
                    ) from exc
                except SandpodError as exc:
                    raise SnapshotStoreFailed(f"cannot fetch layer {layer.digest}: {exc}") from exc
                await asyncio.to_thread(_decompress, blob, tar)
                part: Literal["workspace", "podroot"] = (
                    "podroot" if layer.part == "podroot" else "workspace"
                )
                out.append(SnapshotLayer(tar, part, layer.owner))
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, staged, True)
            raise
        if not out:
            await asyncio.to_thread(shutil.rmtree, staged, True)
        else:
            self._fetched[staged] = chain
        return tuple(out)

    async def restore_into(
        self, sandbox_id: str, name: str, layers: tuple[SnapshotLayer, ...]
    ) -> int:
        """Unpack the layers (from :meth:`restore_layers`) into the Pod's ``/workspace`` and
        root filesystem; the number of entries restored. The Pod's execd is waited for
        (``READY_TIMEOUT``). A Pod with a capture record already (restored or captured before:
        a lifecycle restarted while its Sandbox was Pending) is left as it is (0).

        Raises:
            InstanceUnhealthy: SnapshotUnavailable (terminal): a layer holds a hostile member,
                or the Pod's execd cannot restore a root filesystem the snapshot holds.
            RuntimeFailure: execd did not answer, or its ``tar`` refused the stream.
        """
        ch = self._channel(sandbox_id)
        staged = layers[0].path.parent if layers else None
        try:
            if staged is None:
                return 0
            await _answering(ch)
            try:
                instance, rootfs = await self._instance(ch)
                if self._load(sandbox_id, instance) is not None:
                    return 0  # this Pod was restored (or captured) already: its files are newer
                manifests, entries = await self._unpack(ch, staged, layers, rootfs)
            except SandpodError as exc:
                raise RuntimeFailure(f"cannot restore {sandbox_id}'s files: {exc}") from exc
            except CaptureRefused as exc:  # never unpacked: the Sandbox fails, saying why
                raise InstanceUnhealthy(
                    f"snapshot {name} cannot be restored: {exc}",
                    reason=ConditionReason.SNAPSHOT_UNAVAILABLE,
                    terminal=True,
                ) from exc
            chain = self._fetched.get(staged)
            if chain is not None:
                self._write(sandbox_id, name, instance, chain, manifests)
            return entries
        finally:
            if staged is not None:
                self._fetched.pop(staged, None)
                await asyncio.to_thread(shutil.rmtree, staged, True)

    async def _unpack(
        self, ch: Channel, staged: Path, layers: tuple[SnapshotLayer, ...], rootfs: str
    ) -> tuple[dict[str, PodManifest], int]:
        """Each part's chain merged, checked and unpacked into the Pod: (manifests, entries)."""
        manifests: dict[str, PodManifest] = {}
        entries = 0
        for part in PARTS:
            tars = [x.path for x in layers if x.part == part]
            if not tars and part == "podroot" and not rootfs:
                continue  # neither captured nor capturable: the workspace alone, as before
            merged = staged / f"{part}.merged.tar"
            if not tars:  # nothing of it in the chain: the root as the image has it
                await asyncio.to_thread(_empty_tree, merged)
            entries += await asyncio.to_thread(merge_layers, tars, merged) if tars else 0
            manifests[part] = await asyncio.to_thread(read_archive, merged)
            if part == "workspace":
                # not the root: /workspace is the kubelet's, its mode and times not ours to set
                start = await asyncio.to_thread(below_root, merged)
                await extract(ch, WORKSPACE, file_chunks(merged, start))
            elif not rootfs:
                raise CaptureRefused(
                    "the snapshot holds root filesystem changes, and this Pod's execd cannot "
                    "restore them (it is older than the snapshot's: update the execd image)"
                )
            elif tars:
                await unpack_rootfs(ch, rootfs, merged)
        return manifests, entries


def _empty_tree(path: Path) -> None:
    """A tar of one empty root directory (a part with no layer)."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        root = tarfile.TarInfo(".")
        root.type, root.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(root)


async def _answering(ch: Channel) -> None:
    """Until the Pod's execd answers ``sys.ping`` (it subscribes just after the Pod is Ready)."""
    deadline = asyncio.get_running_loop().time() + READY_TIMEOUT
    while True:
        try:
            await ch.call("sys", "ping", Empty(), Pong, 1.0)
            return
        except SandpodError as exc:
            if asyncio.get_running_loop().time() >= deadline:
                raise RuntimeFailure(f"execd of {ch.sandbox_id} did not answer: {exc}") from exc
            await asyncio.sleep(0.05)


def _compress(src: Path, blob: Path) -> tuple[str, int]:
    """zstd ``src`` into ``blob``, hashing what is written: (digest, size)."""
    sha, size = hashlib.sha256(), 0
    comp = zstandard.ZstdCompressor(level=3).compressobj()
    with src.open("rb") as f, blob.open("wb") as out:
        while True:
            chunk = f.read(CHUNK)
            data = comp.compress(chunk) if chunk else comp.flush()
            sha.update(data)
            out.write(data)
            size += len(data)
            if not chunk:
                return "sha256:" + sha.hexdigest(), size


def _decompress(blob: Path, dest: Path) -> None:
    """zstd -d ``blob`` into ``dest``. Raises LayerCorrupt when it does not decompress."""
    dec = zstandard.ZstdDecompressor().decompressobj()
    try:
        with blob.open("rb") as f, dest.open("wb") as out:
            while chunk := f.read(CHUNK):
                out.write(dec.decompress(chunk))
    except zstandard.ZstdError as exc:
        raise LayerCorrupt(f"a layer's blob does not decompress: {exc}") from exc
    blob.unlink()
