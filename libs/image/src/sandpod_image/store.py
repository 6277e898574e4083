"""The node's image store: content-addressed blobs and unpacked layers every sandbox shares.

Layout under ``root`` (one per node, ``<state dir>/images``)::

    blobs/sha256/<hex>               manifests, configs and layer blobs, each verified
    layers/sha256/<diff_id>/fs       one layer unpacked ONCE (an overlay lower dir), read-only top
    layers/sha256/<diff_id>/layer.json
    images/<hash of ref>.json        a reference -> manifest digest, config, ordered layers
    uses/<holder>.json               a sandbox using an image: GC never removes its layers
    tmp/, locks/                     downloads in flight; flock files

The runtime calls :meth:`ImageStore.resolve` (cached only, no network) and
:meth:`ImageStore.pull`, then :meth:`ImageStore.use` when a sandbox mounts the layers and
:meth:`ImageStore.release` when it goes. :meth:`ImageStore.remove` forgets a reference (refused
while used); :meth:`ImageStore.prune` deletes every blob and layer no reference and no use names.
Pulls hold ``locks/gc.lock`` shared and prune exclusive, so GC never deletes a layer a pull in
flight is about to record. From async code call the synchronous methods that take that lock
(``prune``, ``remove``, ``use``) in a thread (``asyncio.to_thread``).
"""

from __future__ import annotations

import builtins
import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from sandpod_contract.errors import BadRequest, ImageError, ImageInUse, ImageNotFound
from sandpod_image._pull import install, layer_complete, remove_tree
from sandpod_image._records import (
    ImageRecord,
    LayerRecord,
    Layout,
    UseRecord,
    async_lock,
    read_record,
    sync_lock,
    write_record,
)
from sandpod_image.auth import AuthConfig, AuthFile
from sandpod_image.layers import UnpackOptions
from sandpod_image.manifest import ImageConfig, Platform, host_platform, parse_config
from sandpod_image.progress import PullProgress
from sandpod_image.reference import parse_reference
from sandpod_image.registry import Registry
from sandpod_image.sources import open_source, source_key

__all__ = ["ImageStore", "ResolvedImage", "StoredImage"]

_HOLDER: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class ResolvedImage:
    """An image present in the store, ready to mount.

    Attributes:
        reference: the store key (``docker.io/library/python:3.12-slim``, ``oci:/path:tag``).
        digest: the platform manifest's digest.
        layers: the unpacked layer directories (overlay lower dirs), BOTTOM first.
        config: what the sandbox honours from the image config.
        size: unpacked bytes of all its layers.
        diff_ids: the layers' diff_ids, bottom first.
        index_digest: the index's digest when the reference named a multi-platform image.
        xattr_namespace: ``user`` when a layer marks opaque dirs with ``user.`` xattrs (mount
            with ``userxattr``), else ``trusted``.
    """

    reference: str
    digest: str
    layers: tuple[Path, ...]
    config: ImageConfig
    size: int
    diff_ids: tuple[str, ...] = ()
    index_digest: str | None = None
    xattr_namespace: str = "trusted"


@dataclass(frozen=True, slots=True)
class StoredImage:
    """A line of ``sandpod image ls``."""

    reference: str
    digest: str
    size: int
    layers: int
    platform: str
    pulled_at: float
    holders: tuple[str, ...]


class ImageStore:
    """The content-addressed image store under ``root``.

    Args:
        root: the store's directory (created on first use).
        auth_file: credentials by registry, used when a pull gives no ``auth``.
        insecure: registry hosts reached over plain HTTP (loopback ones always are).
        unpack: layer unpack options (rootless mode, size limits).
        transport: an httpx transport for every registry (tests, proxies).
    """

    def __init__(
        self,
        root: Path,
        *,
        auth_file: AuthFile | None = None,
        insecure: frozenset[str] = frozenset(),
        unpack: UnpackOptions | None = None,
        transport: Any = None,
    ) -> None:
        self.root = Path(root)
        self.layout = Layout(self.root)
        self._auth_file = auth_file
        self._insecure = insecure
        self._unpack = unpack or UnpackOptions()
        self._transport = transport

    # -- reading ---------------------------------------------------------------------------

    def resolve(self, ref: str) -> ResolvedImage | None:
        """The image ``ref`` names if it is in the store (no network), else None."""
        record = read_record(self.layout.image(source_key(ref)), ImageRecord)
        return None if record is None else self._resolved(record)

    def _resolved(self, record: ImageRecord) -> ResolvedImage | None:
        if not all(layer_complete(self.layout, d) for d in record.layers):
            return None
        try:
            config = parse_config(self.layout.blob(record.config_digest).read_bytes())
        except OSError:
            return None
        namespaces = {
            getattr(
                read_record(self.layout.layer(d) / "layer.json", LayerRecord), "xattr_namespace", ""
            )
            for d in record.layers
        }
        return ResolvedImage(
            reference=record.reference,
            digest=record.digest,
            layers=tuple(self.layout.layer(d) / "fs" for d in record.layers),
            config=config,
            size=record.size,
            diff_ids=record.layers,
            index_digest=record.index_digest,
            xattr_namespace="user" if "user" in namespaces else "trusted",
        )

    def list(self) -> list[StoredImage]:
        """Every reference in the store, with the holders using it."""
        holders: dict[str, builtins.list[str]] = {}
        for use in self._uses():
            holders.setdefault(use.digest, []).append(use.holder)
        out = []
        for record in self._records():
            out.append(
                StoredImage(
                    reference=record.reference,
                    digest=record.digest,
                    size=record.size,
                    layers=len(record.layers),
                    platform=record.platform,
                    pulled_at=record.pulled_at,
                    holders=tuple(sorted(holders.get(record.digest, ()))),
                )
            )
        return sorted(out, key=lambda s: s.reference)

    def _records(self) -> builtins.list[ImageRecord]:
        paths = sorted(self.layout.images.glob("*.json")) if self.layout.images.is_dir() else []
        return [r for p in paths if (r := read_record(p, ImageRecord)) is not None]

    def _uses(self) -> builtins.list[UseRecord]:
        paths = sorted(self.layout.uses.glob("*.json")) if self.layout.uses.is_dir() else []
        return [r for p in paths if (r := read_record(p, UseRecord)) is not None]

    # -- pulling ---------------------------------------------------------------------------

    async def pull(
        self,
        ref: str,
        *,
        auth: AuthConfig | None = None,
        platform: Platform | None = None,
        progress: Callable[[PullProgress], None] | None = None,
    ) -> ResolvedImage:
        """Bring ``ref`` into the store (a registry, ``oci:`` or ``docker-archive:``).

        Layers already present are not fetched again; a layer another pull is unpacking is
        waited for, not unpacked twice.

        Args:
            ref: the reference.
            auth: credentials for its registry (default: the store's auth file's entry).
            platform: the platform to pick from a multi-platform image (default: the host's).
            progress: called with each step (see ``progress``).

        Returns:
            The image, ready to mount.

        Raises:
            ImageNotFound, ImageAuthFailed, ImageDigestMismatch, ImageUnsupported,
            ImageLayerRefused, ImageError (retryable: network, registry or disk trouble);
            InvalidReference (a bad_request) for a malformed reference.
        """
        key = source_key(ref)
        source = open_source(
            ref,
            auth=auth or self._auth_for(ref),
            insecure=self._is_insecure(ref),
            transport=self._transport,
        )
        try:
            async with async_lock(self.layout.gc_lock, shared=True):
                record = await install(
                    self.layout,
                    source,
                    key=key,
                    platform=platform or host_platform(),
                    options=self._unpack,
                    progress=progress,
                )
        finally:
            await source.aclose()
        resolved = self._resolved(record)
        if resolved is None:
            raise ImageError(f"{key}: pulled, but its layers vanished (a concurrent prune?)")
        return resolved

    def _auth_for(self, ref: str) -> AuthConfig | None:
        if self._auth_file is None or ref.startswith(("oci:", "docker-archive:")):
            return None
        return self._auth_file.lookup(parse_reference(ref).registry)

    def _is_insecure(self, ref: str) -> bool:
        if ref.startswith(("oci:", "docker-archive:")):
            return False
        return parse_reference(ref).registry in self._insecure

    async def push(self, ref: str, target: str, *, auth: AuthConfig | None = None) -> str:
        """Push a stored image to a registry reference (its blobs, config, then manifest).

        Returns:
            The manifest's digest.

        Raises:
            ImageNotFound: ``ref`` is not in the store; the registry's errors as for a pull.
        """
        record = read_record(self.layout.image(source_key(ref)), ImageRecord)
        if record is None:
            raise ImageNotFound(f"{ref} is not in the store; pull it first", reference=ref)
        missing = [b for b in record.blobs if not self.layout.blob(b).is_file()]
        if missing:
            # A layer unpacked from another image's blob (same diff_id, other compression)
            # keeps that blob, not this one's.
            raise ImageNotFound(
                f"{ref}: blob {missing[0]} is not kept in the store; remove and pull it again",
                reference=ref,
            )
        dest = parse_reference(target)
        registry = Registry(
            dest.api_host,
            auth=auth or self._auth_for(target),
            insecure=dest.registry in self._insecure,
            transport=self._transport,
        )
        async with registry:
            for digest in record.blobs[1:]:
                await registry.push_blob(dest.repository, digest, self.layout.blob(digest))
            body = self.layout.blob(record.digest).read_bytes()
            return await registry.put_manifest(
                dest.repository, dest.tag or record.digest, body, record.manifest_media_type
            )

    # -- in-use records and GC -------------------------------------------------------------

    def use(self, holder_id: str, image: ResolvedImage) -> None:
        """Record that ``holder_id`` (a sandbox) mounts ``image``: GC keeps its layers."""
        path = self.layout.use(_holder(holder_id))
        with sync_lock(self.layout.gc_lock, shared=True):
            for diff_id in image.diff_ids:
                if not layer_complete(self.layout, diff_id):
                    raise ImageNotFound(
                        f"{image.reference}: layer {diff_id} is gone; pull it again",
                        reference=image.reference,
                    )
            record = UseRecord(holder_id, image.reference, image.digest, image.diff_ids)
            write_record(path, record)

    def release(self, holder_id: str) -> None:
        """Forget ``holder_id``'s use (idempotent)."""
        self.layout.use(_holder(holder_id)).unlink(missing_ok=True)

    def remove(self, ref: str) -> None:
        """Forget a reference (its layers go at the next prune).

        Raises:
            ImageNotFound: not in the store.
            ImageInUse: a holder uses the image (``details.holders``).
        """
        path = self.layout.image(source_key(ref))
        with sync_lock(self.layout.gc_lock):
            record = read_record(path, ImageRecord)
            if record is None:
                raise ImageNotFound(f"{ref} is not in the store", reference=ref)
            holders = sorted(u.holder for u in self._uses() if u.digest == record.digest)
            if holders:
                raise ImageInUse(
                    f"{ref} is used by {len(holders)} sandbox(es): {', '.join(holders)}; "
                    "delete them first",
                    reference=ref,
                    holders=holders,
                )
            path.unlink()

    def prune(self) -> int:
        """Delete every blob and layer no reference and no holder names, stale temp files and
        the lock files of layers.

        Returns:
            The bytes reclaimed.
        """
        with sync_lock(self.layout.gc_lock):
            records, uses = self._records(), self._uses()
            keep_layers = {d for r in records for d in r.layers} | {
                d for u in uses for d in u.layers
            }
            keep_blobs = {b for r in records for b in r.blobs}
            freed = _sweep(self.layout.layers, {d.removeprefix("sha256:") for d in keep_layers})
            freed += _sweep(self.layout.blobs, {b.removeprefix("sha256:") for b in keep_blobs})
            freed += _sweep(self.layout.tmp, set())
            # Layer lock files: every pull takes its layer locks under the shared gc lock, so
            # none is held (or about to be opened) while this exclusive one is.
            freed += _sweep(self.layout.locks, {self.layout.gc_lock.name})
        return freed


def _sweep(directory: Path, keep: set[str]) -> int:
    if not directory.is_dir():
        return 0
    freed = 0
    for entry in directory.iterdir():
        if entry.name not in keep:
            with contextlib.suppress(FileNotFoundError):
                freed += remove_tree(entry)
    return freed


def _holder(holder_id: str) -> str:
    if not _HOLDER.fullmatch(holder_id):
        raise BadRequest(
            f"holder id {holder_id!r} is not [A-Za-z0-9][A-Za-z0-9._-]{{0,127}}",
            field="holder_id",
        )
    return holder_id
