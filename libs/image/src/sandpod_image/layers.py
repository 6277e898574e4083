"""Layer tarballs <-> overlay-ready directories: the one place a layer's bytes touch the disk.

``unpack_layer`` streams a layer blob (plain, gzip or zstd tar) into an empty directory that can
be an overlayfs lower layer as it is: whiteouts become 0/0 character devices, opaque markers the
``overlay.opaque`` xattr, and nothing a hostile layer names can land outside the directory (see
``_unpack``). The diff_id (sha256 of the uncompressed tar) is computed on the way through, so
the caller checks it against the image config without reading the blob twice.

``pack_layer`` is the reverse, for template builds and ``make images``: an overlay upper (or any
directory) -> a deterministic OCI layer tarball, with its digest, diff_id and size.

Data flow, unpack: ``stream -> decompress (sniffed) -> sha256 + byte bound`` on a read-ahead
thread, ``-> tar -> _unpack`` on the caller's;
pack: ``_pack (sorted walk) -> tar -> sha256 (diff_id) -> compress -> sha256 + size -> out``.
A failed unpack leaves ``dest`` half-written: unpack into a fresh directory and rename it into
place only on success (the store does).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final

from sandpod_image._errors import ImageLayerRefused, ImageUnsupported
from sandpod_image._pack import write_tar
from sandpod_image._streams import (
    CHUNK,
    HashingReader,
    HashingWriter,
    ReadAhead,
    compressor,
    decompressed,
)
from sandpod_image._unpack import Extractor

__all__ = [
    "MEDIA_TYPE_TAR",
    "MEDIA_TYPE_TAR_GZIP",
    "MEDIA_TYPE_TAR_ZSTD",
    "ImageLayerRefused",
    "ImageUnsupported",
    "PackResult",
    "UnpackOptions",
    "UnpackReport",
    "compress_tar",
    "pack_layer",
    "unpack_layer",
]

MEDIA_TYPE_TAR: Final = "application/vnd.oci.image.layer.v1.tar"
MEDIA_TYPE_TAR_GZIP: Final = "application/vnd.oci.image.layer.v1.tar+gzip"
MEDIA_TYPE_TAR_ZSTD: Final = "application/vnd.oci.image.layer.v1.tar+zstd"


@dataclass(frozen=True, slots=True)
class UnpackOptions:
    """How to unpack a layer.

    Attributes:
        rootless: the caller is not root (or must not act as it): ownership becomes the
            caller's, privileged xattrs (``security.capability``...) are dropped and opaque
            directories are marked in the ``user.`` xattr namespace (mount with ``userxattr``).
            Forced on when the process is not root.
        max_entry_bytes: refuse a file entry larger than this.
        max_layer_bytes: refuse a layer whose uncompressed tar is larger than this.
    """

    rootless: bool = False
    max_entry_bytes: int = 8 << 30
    max_layer_bytes: int = 64 << 30


@dataclass(frozen=True, slots=True)
class UnpackReport:
    """What ``unpack_layer`` did.

    Attributes:
        entries: tar entries read (skipped ones included).
        bytes: bytes of regular file content written.
        skipped: entry names not unpacked (devices, fifos, aufs metadata; ``name#xattr=x`` for
            an xattr the filesystem refused).
        diff_id: ``sha256:<hex>`` of the uncompressed tar, trailing padding included.
        xattr_namespace: ``trusted`` or ``user``: where the opaque markers are, so the mount
            knows whether it needs ``-o userxattr``.
    """

    entries: int
    bytes: int
    skipped: tuple[str, ...]
    diff_id: str
    xattr_namespace: str = "trusted"


@dataclass(frozen=True, slots=True)
class PackResult:
    """A packed layer: ``digest`` and ``size`` of the compressed blob, ``diff_id`` of its tar."""

    digest: str
    diff_id: str
    size: int
    media_type: str


_DEFAULT_OPTIONS: Final = UnpackOptions()


def unpack_layer(
    stream: BinaryIO,
    dest: Path,
    *,
    media_type: str,
    options: UnpackOptions = _DEFAULT_OPTIONS,
) -> UnpackReport:
    """Unpack the layer blob ``stream`` into the existing, empty directory ``dest``.

    Args:
        stream: the blob as served (compressed or not; the compression is sniffed).
        dest: the layer directory; nothing outside it is ever created, changed or followed.
        media_type: the descriptor's media type (OCI or Docker layer types).
        options: rootless mode and size bounds.

    Returns:
        What was unpacked, with the diff_id.

    Raises:
        ImageUnsupported: ``media_type`` is not a layer tarball type.
        ImageLayerRefused: the layer is corrupt, too large, or an entry would escape ``dest``;
            ``dest`` is left partly written.
    """
    rootless = options.rootless or os.geteuid() != 0
    reader = HashingReader(decompressed(stream, media_type), options.max_layer_bytes)
    with (
        ReadAhead(reader) as ahead,
        Extractor(dest, rootless=rootless, max_entry_bytes=options.max_entry_bytes) as ex,
    ):
        ex.run(ahead)
        ahead.drain()
        totals = ex.totals
        namespace = ex.xattr_namespace
    return UnpackReport(
        entries=totals.entries,
        bytes=totals.bytes,
        skipped=tuple(totals.skipped),
        diff_id=reader.digest(),
        xattr_namespace=namespace,
    )


def pack_layer(
    src: Path,
    out: BinaryIO,
    *,
    compress: str = "gzip",
    mtime: int | None = None,
    owner: tuple[int, int] | None = None,
) -> PackResult:
    """Write the directory ``src`` (an overlay upper or lower) to ``out`` as an OCI layer.

    0/0 character devices become ``.wh.<name>`` whiteouts and directories marked opaque (either
    xattr namespace) get a ``.wh..wh..opq`` entry. Entries are sorted and owner names left
    empty, so the same tree gives the same bytes.

    Args:
        src: the directory to pack (its own root entry is not written).
        out: where the compressed blob goes.
        compress: ``gzip``, ``zstd`` or ``none``.
        mtime: when set, every entry's mtime (reproducible builds); else each file's own.
        owner: when set, every entry's (uid, gid): a rootless build's files owned by root.

    Returns:
        The blob's digest, size and media type, and the tar's diff_id.

    Raises:
        ImageUnsupported: unknown ``compress``.
    """
    blob = HashingWriter(out)
    squeeze, media_type = compressor(blob, compress)
    tar_bytes = HashingWriter(squeeze)
    write_tar(src, tar_bytes, mtime=mtime, owner=owner)
    squeeze.close()
    return PackResult(
        digest=blob.digest(), diff_id=tar_bytes.digest(), size=blob.count, media_type=media_type
    )


def compress_tar(tar: BinaryIO, out: BinaryIO, *, compress: str = "gzip") -> PackResult:
    """Compress an existing layer tarball (``mmdebstrap``'s, a ``docker save`` layer) to ``out``.

    The tar is taken as it is (it is already a layer); only its digests are computed.

    Raises:
        ImageUnsupported: unknown ``compress``.
    """
    blob = HashingWriter(out)
    squeeze, media_type = compressor(blob, compress)
    tar_bytes = HashingWriter(squeeze)
    while chunk := tar.read(CHUNK):
        tar_bytes.write(chunk)
    squeeze.close()
    return PackResult(
        digest=blob.digest(), diff_id=tar_bytes.digest(), size=blob.count, media_type=media_type
    )
