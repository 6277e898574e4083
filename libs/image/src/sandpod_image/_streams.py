"""Byte streams around a layer tarball: decompression on the way in, compression on the way out,
and the digests of both sides computed while the bytes pass.

Unpacking reads ``blob -> decompress -> HashingReader -> tar parser``: the reader's sha256 is the
layer's diff_id and its byte count is bounded (a decompression bomb stops at ``limit``). Packing
writes ``tar -> HashingWriter (diff_id) -> compressor -> HashingWriter (digest, size) -> out``.
The compression of an incoming layer is sniffed from its magic bytes, as containerd does, because
registries serve Docker ``diff.tar.gzip`` blobs that are plain tar now and then.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import queue
import threading
import zlib
from typing import IO, BinaryIO, Final, Protocol, cast

import zstandard

from sandpod_image._errors import ImageLayerRefused, ImageUnsupported

__all__ = [
    "CHUNK",
    "HashingReader",
    "HashingWriter",
    "ReadAhead",
    "Readable",
    "compressor",
    "decompressed",
]

# Big reads amortise the per-call Python overhead; 1 MiB is past the knee on this host.
CHUNK: Final = 1 << 20
_GZIP_MAGIC: Final = b"\x1f\x8b"
_ZSTD_MAGIC: Final = b"\x28\xb5\x2f\xfd"


class Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


class _Prefixed:
    """A stream with its first bytes (read to sniff the compression) put back in front."""

    def __init__(self, head: bytes, rest: Readable) -> None:
        self._head = head
        self._rest = rest

    def read(self, size: int = -1, /) -> bytes:
        if self._head:
            if size < 0 or size >= len(self._head):
                head, self._head = self._head, b""
                more = self._rest.read(size - len(head) if size >= 0 else -1)
                return head + more
            head, self._head = self._head[:size], self._head[size:]
            return head
        return self._rest.read(size)


class _GzipReader:
    """Multi-member gzip through zlib directly: ``gzip.GzipFile`` adds a Python buffer per read."""

    def __init__(self, raw: Readable) -> None:
        self._raw = raw
        self._z = zlib.decompressobj(zlib.MAX_WBITS | 16)
        self._pending = b""
        self._eof = False

    def read(self, size: int = -1, /) -> bytes:
        want = CHUNK if size < 0 else size
        while not self._eof:
            if not self._pending:
                self._pending = self._raw.read(CHUNK)
                if not self._pending:
                    if not self._z.eof:
                        raise ImageLayerRefused("gzip stream ends early", reason="corrupt")
                    self._eof = True
                    break
            out = self._z.decompress(self._pending, want)
            self._pending = self._z.unconsumed_tail
            if self._z.eof:
                # The next gzip member, if any (pigz and some registries write several).
                self._pending = self._z.unused_data + self._pending
                self._z = zlib.decompressobj(zlib.MAX_WBITS | 16)
                if not self._pending:
                    self._pending = self._raw.read(CHUNK)
                    if not self._pending:
                        self._eof = True
            if out:
                return out
        return b""


def decompressed(raw: BinaryIO, media_type: str) -> Readable:
    """Return the uncompressed tar stream of a layer blob, sniffing gzip/zstd by magic bytes.

    Raises:
        ImageUnsupported: the media type is not a layer tarball.
    """
    if not _is_layer_type(media_type):
        raise ImageUnsupported(f"not a layer media type: {media_type}", media_type=media_type)
    head = raw.read(4)
    stream = _Prefixed(head, raw)
    if head.startswith(_GZIP_MAGIC):
        return _GzipReader(stream)
    if head.startswith(_ZSTD_MAGIC):
        reader: Readable = zstandard.ZstdDecompressor().stream_reader(
            cast(IO[bytes], stream), read_size=CHUNK, read_across_frames=True
        )
        return reader
    return stream


_LAYER_TYPES: Final = frozenset(
    {
        "application/vnd.oci.image.layer.v1.tar",
        "application/vnd.oci.image.layer.v1.tar+gzip",
        "application/vnd.oci.image.layer.v1.tar+zstd",
        "application/vnd.oci.image.layer.nondistributable.v1.tar",
        "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
        "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
        "application/vnd.docker.image.rootfs.diff.tar",
        "application/vnd.docker.image.rootfs.diff.tar.gzip",
        "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
    }
)


def _is_layer_type(media_type: str) -> bool:
    return media_type in _LAYER_TYPES


class HashingReader:
    """sha256 and byte count of everything read through it, refusing past ``limit`` bytes."""

    def __init__(self, inner: Readable, limit: int) -> None:
        self._inner = inner
        self._limit = limit
        self.sha = hashlib.sha256()
        self.count = 0

    def read(self, size: int = -1, /) -> bytes:
        try:
            data = self._inner.read(size)
        except (zlib.error, zstandard.ZstdError, EOFError, gzip.BadGzipFile) as exc:
            raise ImageLayerRefused(f"corrupt compressed layer: {exc}", reason="corrupt") from exc
        self.count += len(data)
        if self.count > self._limit:
            raise ImageLayerRefused(
                "layer is larger than allowed", reason="too_large", limit=self._limit
            )
        self.sha.update(data)
        return data

    def drain(self) -> None:
        """Read to the end, so the digest covers the tar's trailing padding too."""
        while self.read(CHUNK):
            pass

    def digest(self) -> str:
        return "sha256:" + self.sha.hexdigest()


class Writable(Protocol):
    def write(self, data: bytes, /) -> int: ...


class HashingWriter:
    """sha256 and byte count of everything written through it to ``inner``."""

    def __init__(self, inner: Writable) -> None:
        self._inner = inner
        self.sha = hashlib.sha256()
        self.count = 0

    def write(self, data: bytes, /) -> int:
        self.sha.update(data)
        self.count += len(data)
        self._inner.write(data)
        return len(data)

    def digest(self) -> str:
        return "sha256:" + self.sha.hexdigest()


class _Compressor(Protocol):
    def compress(self, data: bytes, /) -> bytes: ...
    def flush(self) -> bytes: ...


class _CompressingWriter:
    def __init__(self, inner: Writable, comp: _Compressor) -> None:
        self._inner = inner
        self._comp = comp

    def write(self, data: bytes, /) -> int:
        out = self._comp.compress(data)
        if out:
            self._inner.write(out)
        return len(data)

    def close(self) -> None:
        self._inner.write(self._comp.flush())


class _Plain:
    def __init__(self, inner: Writable) -> None:
        self._inner = inner

    def write(self, data: bytes, /) -> int:
        return self._inner.write(data)

    def close(self) -> None:
        pass


class ClosingWriter(Protocol):
    def write(self, data: bytes, /) -> int: ...
    def close(self) -> None: ...


def compressor(inner: Writable, compress: str) -> tuple[ClosingWriter, str]:
    """Return a writer compressing into ``inner`` and the OCI layer media type it produces.

    Raises:
        ImageUnsupported: ``compress`` is not ``gzip``, ``zstd`` or ``none``.
    """
    if compress == "gzip":
        # zlib's own gzip header: mtime 0, no file name, so equal input gives equal bytes.
        gz = zlib.compressobj(6, zlib.DEFLATED, zlib.MAX_WBITS | 16)
        return _CompressingWriter(inner, gz), "application/vnd.oci.image.layer.v1.tar+gzip"
    if compress == "zstd":
        zc = zstandard.ZstdCompressor(level=3).compressobj()
        return _CompressingWriter(inner, zc), "application/vnd.oci.image.layer.v1.tar+zstd"
    if compress == "none":
        return _Plain(inner), "application/vnd.oci.image.layer.v1.tar"
    raise ImageUnsupported(f"unknown layer compression: {compress}", compress=compress)


_END: Final = b""


class ReadAhead:
    """Reads ``inner`` (decompression and hashing) on a second thread, a bounded queue ahead.

    zlib, zstandard and hashlib release the GIL on large buffers, so decompressing and hashing
    run on one core while the unpacker's file syscalls run on another -- what ``tar -xz`` gets
    from its separate ``gzip`` process. The queue holds at most ``depth`` chunks (memory bound
    ``depth * CHUNK``). Use as a context manager: leaving it stops and joins the thread, and an
    error raised by ``inner`` on the thread is raised again by ``read``.
    """

    def __init__(self, inner: Readable, depth: int = 8) -> None:
        self._inner = inner
        self._queue: queue.Queue[bytes | BaseException] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pump, name="layer-read-ahead", daemon=True)
        self._left = b""
        self._done = False

    def __enter__(self) -> ReadAhead:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        while self._thread.is_alive():
            # Unblock a put() waiting on a full queue, then wait a little for the thread's end.
            with contextlib.suppress(queue.Empty):
                self._queue.get_nowait()
            self._thread.join(0.01)

    def _pump(self) -> None:
        try:
            while not self._stop.is_set():
                chunk = self._inner.read(CHUNK)
                self._put(chunk)
                if not chunk:
                    return
        except BaseException as exc:  # handed to the reading thread, raised there
            self._put(exc)

    def _put(self, item: bytes | BaseException) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def read(self, size: int = -1, /) -> bytes:
        if not self._left and not self._done:
            item = self._queue.get()
            if isinstance(item, BaseException):
                self._done = True
                raise item
            if item is _END or not item:
                self._done = True
            self._left = item
        if size < 0 or size >= len(self._left):
            out, self._left = self._left, b""
            return out
        out, self._left = self._left[:size], self._left[size:]
        return out

    def drain(self) -> None:
        """Read to the end (the digest then covers the whole stream)."""
        while self.read(CHUNK):
            pass
