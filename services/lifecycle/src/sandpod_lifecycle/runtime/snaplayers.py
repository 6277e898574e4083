"""A node's snapshot layers: unpacked for overlay mounts, packed as blobs for the object store.

A snapshot is a stack of *layers*, each one directory in overlay format (whiteouts are 0/0
character devices, opaque directories carry ``trusted.overlay.opaque``) holding what changed in
one part of a sandbox (``rootfs``: its writable layer; ``workspace``) since the layer below.
A layer is named by the digest of its blob -- GNU tar (POSIX format: modes, numeric owners,
hard links, symlinks, devices, every xattr namespace, sparse files) compressed with zstd --
so it is stored once however many snapshots share it, and a blob read back is verified
against its name before anything is unpacked (a changed object is refused, never used).

On disk, under ``root``::

    layers/<hex>/fs/          the unpacked layer (read-only use: forks mount it id-mapped)
    layers/<hex>/layer.json   its LayerInfo (written last: a directory without it is unfinished)
    staging/<random>/         captures and downloads in progress (removed at start and on error)

Data flow: capture (``snapdiff.py``) fills a staging directory -> :meth:`LayerStore.seal`
packs it into a blob (hashing as it writes), uploads it and renames the staging directory to
its digest. A node missing a layer :meth:`fetch`-es the blob, checks it, unpacks it into
staging and renames it the same way. Both are idempotent: a crash leaves staging debris only.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import shutil
import uuid
from pathlib import Path

import zstandard

from sandpod_blobs import BlobStore
from sandpod_contract.errors import BlobCorrupt, SandpodError
from sandpod_lifecycle.runtime.base import RuntimeFailure

__all__ = ["LayerCorrupt", "LayerInfo", "LayerStore", "SnapshotStoreFailed"]

CHUNK = 1 << 20
LAYER_VERSION = 1
TAR_CREATE = (
    "tar",
    "--create",
    "--format=posix",
    "--numeric-owner",
    "--xattrs",
    "--xattrs-include=*",
    "--sparse",
    "--acls",
    "--file=-",
)
TAR_EXTRACT = (
    "tar",
    "--extract",
    "--numeric-owner",
    "--same-owner",
    "--preserve-permissions",
    "--xattrs",
    "--xattrs-include=*",
    "--acls",
    "--file=-",
)


class SnapshotStoreFailed(RuntimeFailure):
    """A layer could not be packed, stored, fetched or unpacked (disk full, store down)."""

    code = "snapshot.store_failed"
    retryable = True


class LayerCorrupt(SnapshotStoreFailed):
    """A blob read back does not match its digest: it was changed; it is never used."""

    code = "snapshot.corrupt"
    retryable = False


@dataclasses.dataclass(frozen=True, slots=True)
class LayerInfo:
    """One layer: its blob's digest and size, what it is part of, whose files it holds."""

    digest: str  # sha256:<hex> of the blob
    size: int  # bytes of the blob (compressed)
    part: str  # rootfs | workspace
    owner: int  # the uid (= gid) of the sandbox it was captured from
    unpacked: int  # bytes of its files

    def to_json(self) -> str:
        return json.dumps({"version": LAYER_VERSION, **dataclasses.asdict(self)})

    @classmethod
    def from_json(cls, text: str) -> LayerInfo:
        raw = json.loads(text)
        if raw.pop("version", None) != LAYER_VERSION:
            raise ValueError("unknown layer record version")
        return cls(**raw)


class LayerStore:
    def __init__(self, root: Path, blobs: BlobStore) -> None:
        self.root = root
        self.blobs = blobs
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        root.chmod(0o700)  # layers hold sandboxes' files (setuid ones too): for root's eyes only
        (root / "layers").mkdir(exist_ok=True)
        staging = root / "staging"
        shutil.rmtree(staging, ignore_errors=True)  # debris of a crashed capture or download
        staging.mkdir(mode=0o700)

    def staging(self) -> Path:
        """A new, empty directory for one capture or download (0700: only we look inside)."""
        path = self.root / "staging" / uuid.uuid4().hex
        path.mkdir(mode=0o700)
        return path

    def path(self, digest: str) -> Path:
        """The unpacked files of layer ``digest`` (see :meth:`has`)."""
        return self._dir(digest) / "fs"

    def info(self, digest: str) -> LayerInfo | None:
        try:
            return LayerInfo.from_json((self._dir(digest) / "layer.json").read_text())
        except (OSError, ValueError, TypeError):
            return None

    def has(self, digest: str) -> bool:
        return self.info(digest) is not None

    def local(self) -> list[str]:
        """Digests of every complete layer on this node."""
        return [
            "sha256:" + d.name
            for d in (self.root / "layers").iterdir()
            if (d / "layer.json").exists()
        ]

    async def seal(self, staged: Path, *, part: str, owner: int) -> LayerInfo:
        """Pack ``staged/fs`` into a blob, store it and keep ``staged`` as the layer.

        Raises:
            SnapshotStoreFailed: packing or storing failed (``staged`` is removed).
        """
        blob = staged / "blob"
        try:
            digest, size = await _pack(staged / "fs", blob)
            unpacked = await asyncio.to_thread(_du, staged / "fs")
            try:
                stored = await self.blobs.put_file(blob)  # idempotent: one copy per content
            except SandpodError as exc:
                raise SnapshotStoreFailed(f"cannot store a layer: {exc}") from exc
            if stored.digest != digest:  # the file changed under us: never name it wrongly
                raise SnapshotStoreFailed(f"layer {digest} was stored as {stored.digest}")
            info = LayerInfo(digest=digest, size=size, part=part, owner=owner, unpacked=unpacked)
            blob.unlink()
            return await asyncio.to_thread(self._install, staged, info)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, staged, True)
            raise

    async def fetch(self, digest: str, *, part: str, owner: int) -> LayerInfo:
        """Layer ``digest`` on this node: kept, or downloaded, verified and unpacked.

        Raises:
            LayerCorrupt: the blob does not hash to ``digest``.
            SnapshotStoreFailed: it cannot be downloaded or unpacked.
        """
        known = self.info(digest)
        if known is not None:
            return known
        staged = self.staging()
        try:
            blob = staged / "blob"
            try:
                size = await self.blobs.get_file(digest, blob)  # verified against the digest
            except BlobCorrupt as exc:
                raise LayerCorrupt(
                    f"layer {digest} does not match its digest: the stored object was "
                    "changed; this snapshot cannot be restored",
                    digest=digest,
                ) from exc
            except SandpodError as exc:
                raise SnapshotStoreFailed(f"cannot fetch layer {digest}: {exc}") from exc
            await _unpack(blob, staged / "fs")
            blob.unlink()
            unpacked = await asyncio.to_thread(_du, staged / "fs")
            info = LayerInfo(digest=digest, size=size, part=part, owner=owner, unpacked=unpacked)
            return await asyncio.to_thread(self._install, staged, info)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, staged, True)
            raise

    async def remove(self, digest: str) -> None:
        """Forget layer ``digest`` here and in the blob store (callers check nothing uses it)."""
        await self.evict(digest)
        try:
            await self.blobs.delete(digest)
        except SandpodError as exc:
            raise SnapshotStoreFailed(f"cannot delete layer {digest}: {exc}") from exc

    async def stored(self) -> list[str]:
        """Digests of every blob in the store (for collection)."""
        try:
            return [ref.digest for ref in await self.blobs.list()]
        except SandpodError as exc:
            raise SnapshotStoreFailed(f"cannot list the layer store: {exc}") from exc

    async def evict(self, digest: str) -> None:
        """Drop this node's unpacked copy of ``digest`` (the blob store keeps it)."""
        d = self._dir(digest)
        with contextlib.suppress(FileNotFoundError):
            (d / "layer.json").unlink()  # first: a half-removed layer is never "complete"
        await asyncio.to_thread(shutil.rmtree, d, True)

    def _dir(self, digest: str) -> Path:
        algo, _, hexa = digest.partition(":")
        if algo != "sha256" or len(hexa) != 64 or not all(c in "0123456789abcdef" for c in hexa):
            raise ValueError(f"not a layer digest: {digest!r}")
        return self.root / "layers" / hexa

    def _install(self, staged: Path, info: LayerInfo) -> LayerInfo:
        final = self._dir(info.digest)
        (staged / "layer.json.tmp").write_text(info.to_json())
        if final.exists():  # the same content captured twice: one copy is enough
            shutil.rmtree(staged, ignore_errors=True)
            return self.info(info.digest) or info
        (staged / "layer.json.tmp").rename(staged / "layer.json")
        staged.chmod(0o755)
        staged.rename(final)
        return info


async def _pack(fs: Path, blob: Path) -> tuple[str, int]:
    """tar ``fs`` | zstd > ``blob``, hashing on the way: (digest, size)."""
    proc = await asyncio.create_subprocess_exec(
        *TAR_CREATE,
        "--directory",
        str(fs),
        ".",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    if proc.stdout is None:
        raise SnapshotStoreFailed("tar gave no output pipe")
    sha, size = hashlib.sha256(), 0
    comp = zstandard.ZstdCompressor(level=3, threads=-1).compressobj()
    with blob.open("wb") as out:

        def emit(data: bytes) -> None:
            nonlocal size
            if data:
                sha.update(data)
                out.write(data)
                size += len(data)

        while chunk := await proc.stdout.read(CHUNK):
            emit(await asyncio.to_thread(comp.compress, chunk))
        emit(comp.flush())
    err = await proc.stderr.read() if proc.stderr is not None else b""
    if await proc.wait() != 0:
        raise SnapshotStoreFailed(f"cannot pack a layer: {err.decode(errors='replace')[-400:]}")
    return "sha256:" + sha.hexdigest(), size


async def _unpack(blob: Path, fs: Path) -> None:
    await asyncio.to_thread(fs.mkdir)
    proc = await asyncio.create_subprocess_exec(
        *TAR_EXTRACT,
        "--directory",
        str(fs),
        stdin=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    if proc.stdin is None:
        raise SnapshotStoreFailed("tar gave no input pipe")
    dec = zstandard.ZstdDecompressor().decompressobj()
    try:
        with blob.open("rb") as f:
            while chunk := await asyncio.to_thread(f.read, CHUNK):
                proc.stdin.write(dec.decompress(chunk))
                await proc.stdin.drain()
        proc.stdin.close()
    except (zstandard.ZstdError, ConnectionError) as exc:
        proc.kill()
        await proc.wait()
        raise LayerCorrupt(f"a layer's blob does not decompress: {exc}") from exc
    err = await proc.stderr.read() if proc.stderr is not None else b""
    if await proc.wait() != 0:
        raise SnapshotStoreFailed(f"cannot unpack a layer: {err.decode(errors='replace')[-400:]}")


def _du(root: Path) -> int:
    """Bytes of the files below ``root`` (allocated blocks: a sparse file counts its data)."""
    total = 0
    for entry in root.rglob("*"):
        with contextlib.suppress(OSError):
            st = entry.lstat()
            total += st.st_blocks * 512
    return total
