"""Content-addressed writes: bytes arrive, are hashed on the way to a temp file, and only a file
whose sha256 (and size) match the digest it was asked for is renamed into place.

Every blob the store keeps (from a registry, an OCI layout or a ``docker save`` tarball) goes
through :class:`BlobWriter`, so a tampered or truncated blob never lands under its digest's name:
a mismatch deletes the temp file and raises ``image.digest_mismatch``. The temp file lives in the
store's own ``tmp/`` (the same filesystem, so the final rename is atomic), and a crash leaves only
a temp file that the next prune removes: a retried pull starts that blob again, never trusts it.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Final

from sandpod_contract.errors import ImageDigestMismatch, ImageError, ImageUnsupported

__all__ = ["CHUNK", "BlobWriter", "digest_bytes", "digest_file", "hex_of", "verify_bytes"]

CHUNK: Final = 1 << 20


def hex_of(digest: str) -> str:
    """``sha256:<hex>`` -> ``<hex>``; refuses anything else (a digest becomes a file name)."""
    algo, _, hexpart = digest.partition(":")
    if algo != "sha256" or len(hexpart) != 64 or not all(c in "0123456789abcdef" for c in hexpart):
        raise ImageUnsupported(f"{digest!r} is not a sha256 digest (sha256:<64 hex>)")
    return hexpart


def digest_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def digest_file(path: Path) -> str:
    """The sha256 digest of a file's content."""
    sha = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            sha.update(chunk)
    return "sha256:" + sha.hexdigest()


def verify_bytes(data: bytes, expected: str, *, what: str) -> None:
    """Raise ``image.digest_mismatch`` unless ``data`` hashes to ``expected``."""
    actual = digest_bytes(data)
    if actual != expected:
        raise ImageDigestMismatch(
            f"{what} {expected} arrived as {actual}; nothing was kept",
            expected=expected,
            actual=actual,
        )


class BlobWriter:
    """A temp file that becomes ``dest`` only if its content hashes to ``expected``.

    Use as a context manager: :meth:`write` the bytes, then :meth:`commit`; leaving the block
    without a commit (an error, a cancelled pull) deletes the temp file.
    """

    def __init__(self, tmp_dir: Path, expected: str, size: int | None = None) -> None:
        hex_of(expected)
        self.expected = expected
        self.size = size
        self.count = 0
        self._sha = hashlib.sha256()
        tmp_dir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=tmp_dir, prefix="blob-", suffix=".part")
        self._path = Path(name)
        self._file = os.fdopen(fd, "wb")

    def __enter__(self) -> BlobWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._discard()

    def write(self, chunk: bytes) -> None:
        self.count += len(chunk)
        if self.size is not None and self.count > self.size:
            # A blob longer than its descriptor is refused before it fills the disk.
            raise ImageDigestMismatch(
                f"blob {self.expected} is longer than its {self.size} bytes; nothing was kept",
                expected=self.expected,
                actual=f"(more than {self.size} bytes)",
            )
        self._sha.update(chunk)
        self._file.write(chunk)

    def restart(self) -> None:
        """Forget what was written (a resumed download that the source sent from zero)."""
        self._file.seek(0)
        self._file.truncate()
        self._sha = hashlib.sha256()
        self.count = 0

    def commit(self, dest: Path) -> None:
        """Check the digest (and size) and rename the file to ``dest``.

        Raises:
            ImageDigestMismatch: the content is not what the digest names.
            ImageError: the file could not be written (disk full...).
        """
        actual = "sha256:" + self._sha.hexdigest()
        if actual != self.expected or (self.size is not None and self.count != self.size):
            raise ImageDigestMismatch(
                f"blob {self.expected} arrived as {actual} ({self.count} bytes); nothing was kept",
                expected=self.expected,
                actual=actual,
            )
        try:
            self._file.close()
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(self._path, 0o444)
            os.replace(self._path, dest)
        except OSError as exc:
            raise ImageError(f"cannot store blob {self.expected}: {exc.strerror}") from exc

    def _discard(self) -> None:
        if not self._file.closed:
            self._file.close()
        self._path.unlink(missing_ok=True)
