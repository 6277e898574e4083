"""Layer tarballs built entry by entry with ``tarfile``, for the image tests.

Each helper returns one ``(TarInfo, body)`` member; ``layer()`` joins them into an uncompressed
tar in memory, in the order given (hostile layers depend on the order). ``snapshot()`` records a
directory tree (type, mode, owner, size, content, link target, mtime) so a test can prove an
attack changed nothing outside the layer.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
from pathlib import Path

import zstandard

__all__ = [
    "Member",
    "device",
    "directory",
    "fifo",
    "file",
    "gzipped",
    "hardlink",
    "layer",
    "snapshot",
    "symlink",
    "zstded",
]

Member = tuple[tarfile.TarInfo, bytes | None]
MTIME = 1_700_000_000


def _info(name: str, kind: bytes, mode: int, **attrs: object) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.mtime = MTIME
    for key, value in attrs.items():
        setattr(info, key, value)
    return info


def file(name: str, body: bytes = b"", mode: int = 0o644, **attrs: object) -> Member:
    info = _info(name, tarfile.REGTYPE, mode, **attrs)
    info.size = len(body)
    return info, body


def directory(name: str, mode: int = 0o755, **attrs: object) -> Member:
    return _info(name, tarfile.DIRTYPE, mode, **attrs), None


def symlink(name: str, target: str) -> Member:
    return _info(name, tarfile.SYMTYPE, 0o777, linkname=target), None


def hardlink(name: str, target: str) -> Member:
    return _info(name, tarfile.LNKTYPE, 0o644, linkname=target), None


def device(name: str, kind: bytes = tarfile.CHRTYPE, major: int = 1, minor: int = 3) -> Member:
    return _info(name, kind, 0o666, devmajor=major, devminor=minor), None


def fifo(name: str) -> Member:
    return _info(name, tarfile.FIFOTYPE, 0o644), None


def layer(*members: Member) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, body in members:
            tar.addfile(info, io.BytesIO(body) if body is not None else None)
    return out.getvalue()


def gzipped(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def zstded(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


def snapshot(root: Path, skip: Path | None = None) -> dict[str, tuple[object, ...]]:
    """Every entry under ``root`` (``skip`` and below excluded) with what identifies its state."""
    found: dict[str, tuple[object, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if skip is not None:
            dirnames[:] = [d for d in dirnames if Path(dirpath, d) != skip]
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = os.lstat(path)
            body: object = None
            if stat.S_ISREG(st.st_mode):
                body = path.read_bytes()
            elif stat.S_ISLNK(st.st_mode):
                body = os.readlink(path)
            found[str(path)] = (st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, body)
    return found
