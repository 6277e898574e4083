"""Writing a blob to disk so that a wrong byte never lands at the destination.

A store streams the bytes it holds into :class:`VerifiedFile`, which writes them to a temporary
file next to the destination (same directory, so the final rename is atomic), hashing and counting
as it goes. :meth:`VerifiedFile.commit` compares size and sha256 with the digest the caller asked
for and only then renames; on a mismatch, or on any exception inside the ``with`` block, the
temporary file is deleted, so the destination holds either the whole verified blob or nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Self

from sandpod_contract.errors import BlobCorrupt

__all__ = ["VerifiedFile"]


class VerifiedFile:
    """A temporary file that becomes ``dest`` only if its bytes match ``digest`` and ``size``.

    Use as a context manager: ``write`` chunks, then ``commit``. Leaving the block without a
    commit (an error mid-transfer) removes the temporary file.
    """

    def __init__(self, dest: Path, digest: str, size: int | None) -> None:
        """``size``: the size the store announced (None when it announced none)."""
        self.dest = dest
        self.digest = digest
        self.size = size
        self.written = 0
        self._hash = hashlib.sha256()
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
        self._tmp = Path(tmp)
        self._file = os.fdopen(fd, "wb")
        self._done = False

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._done:
            self._discard()

    def write(self, chunk: bytes) -> None:
        """Append ``chunk``. Raises BlobCorrupt as soon as more bytes arrive than announced."""
        self.written += len(chunk)
        if self.size is not None and self.written > self.size:
            self._discard()
            raise BlobCorrupt(
                f"{self.digest}: the store sent more than the {self.size} bytes it announced",
                digest=self.digest,
                size=self.written,
            )
        self._hash.update(chunk)
        self._file.write(chunk)

    def commit(self) -> int:
        """Check size and digest, then rename onto ``dest``. Returns the size.

        Raises:
            BlobCorrupt: the bytes do not match (the temporary file is gone, ``dest`` untouched).
        """
        actual = f"sha256:{self._hash.hexdigest()}"
        if actual != self.digest or (self.size is not None and self.written != self.size):
            self._discard()
            raise BlobCorrupt(
                f"{self.digest}: the stored bytes hash to {actual} ({self.written} bytes)",
                digest=self.digest,
                actual=actual,
                size=self.written,
            )
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._tmp.replace(self.dest)
        self._done = True
        return self.written

    def _discard(self) -> None:
        self._done = True
        self._file.close()
        with contextlib.suppress(FileNotFoundError):
            self._tmp.unlink()
