"""The store's own files: versioned JSON records, and the fcntl locks that order its writers.

Three records, each a frozen dataclass written atomically (temp file + rename) and read back by
any process on the node: :class:`ImageRecord` (``images/<key-hash>.json``: a reference and what it
resolved to), :class:`LayerRecord` (``layers/sha256/<diff_id>/layer.json``, written with the
unpacked ``fs`` before both are renamed into place together) and :class:`UseRecord`
(``uses/<holder>.json``: a sandbox holding an image's layers, so GC spares them).

Locks are ``flock`` on files under ``locks/``: per layer (so one pull unpacks it and a concurrent
one waits, then finds it done) and one ``gc.lock`` that pulls and uses hold shared and
prune/remove exclusive. ``flock`` binds to an open file, so two pulls in one process exclude each
other as two processes do.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

from sandpod_contract.errors import ImageError
from sandpod_image.blobs import hex_of

__all__ = [
    "ImageRecord",
    "LayerRecord",
    "Layout",
    "UseRecord",
    "async_lock",
    "read_record",
    "sync_lock",
    "write_record",
]

VERSION: Final = 1
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Layout:
    """The store's paths under its root."""

    root: Path

    @property
    def blobs(self) -> Path:
        return self.root / "blobs" / "sha256"

    @property
    def layers(self) -> Path:
        return self.root / "layers" / "sha256"

    @property
    def images(self) -> Path:
        return self.root / "images"

    @property
    def uses(self) -> Path:
        return self.root / "uses"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def locks(self) -> Path:
        return self.root / "locks"

    @property
    def gc_lock(self) -> Path:
        return self.locks / "gc.lock"

    def blob(self, digest: str) -> Path:
        return self.blobs / hex_of(digest)

    def layer(self, diff_id: str) -> Path:
        return self.layers / hex_of(diff_id)

    def layer_lock(self, diff_id: str) -> Path:
        return self.locks / f"layer-{hex_of(diff_id)}.lock"

    def image(self, key: str) -> Path:
        return self.images / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".json")

    def use(self, holder: str) -> Path:
        return self.uses / f"{holder}.json"


@dataclass(frozen=True, slots=True)
class ImageRecord:
    """A pulled reference (``reference`` is the store key, see ``sources.source_key``)."""

    reference: str
    digest: str  # the platform manifest's digest
    config_digest: str
    layers: tuple[str, ...]  # diff_ids, bottom first
    blobs: tuple[str, ...]  # manifest, config and layer blob digests
    size: int  # unpacked bytes of the layers
    platform: str
    pulled_at: float
    index_digest: str | None = None
    manifest_media_type: str = ""
    version: int = VERSION


@dataclass(frozen=True, slots=True)
class LayerRecord:
    """An unpacked layer."""

    diff_id: str
    blob: str
    media_type: str
    bytes: int
    entries: int
    skipped: int
    xattr_namespace: str
    version: int = VERSION


@dataclass(frozen=True, slots=True)
class UseRecord:
    """A holder (a sandbox) using an image's layers."""

    holder: str
    reference: str
    digest: str
    layers: tuple[str, ...]  # diff_ids
    version: int = VERSION


def write_record(path: Path, record: Any) -> None:
    """Write a record atomically (readers see the old file or the new one, never half)."""
    data = json.dumps(dataclasses.asdict(record), sort_keys=True, indent=1).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".rec-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise ImageError(f"cannot write {path}: {exc.strerror}") from exc


def read_record(path: Path, cls: Callable[..., T]) -> T | None:
    """Read a record, or None when it is missing, unreadable or of a newer version."""
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("version", 0) > VERSION:
        return None
    names = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    try:
        kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in doc.items() if k in names}
        return cls(**kwargs)
    except TypeError:
        return None


def _open_lock(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


@contextlib.contextmanager
def sync_lock(path: Path, *, shared: bool = False) -> Iterator[None]:
    """Hold ``flock`` on ``path`` (blocking)."""
    fd = _open_lock(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the file releases the lock


@contextlib.asynccontextmanager
async def async_lock(
    path: Path, *, shared: bool = False, contended: Callable[[], None] | None = None
) -> AsyncIterator[None]:
    """Hold ``flock`` on ``path``, waiting in a thread so the event loop runs meanwhile.

    Args:
        contended: called once when the lock is held elsewhere and this call has to wait.
    """
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    fd = _open_lock(path)
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        if contended is not None:
            contended()
        waiter = asyncio.get_running_loop().run_in_executor(None, fcntl.flock, fd, mode)
        try:
            await asyncio.shield(waiter)
        except BaseException:
            # Cancelled while the thread still waits: the fd is closed (and the lock, if it
            # was ever taken, released) when the thread returns.
            waiter.add_done_callback(lambda _: os.close(fd))
            raise
    try:
        yield
    finally:
        os.close(fd)
