"""Uploads: streamed atomic writes that span several requests.

An upload is an :class:`~.atomic.AtomicFile` plus what was received so far: a byte count (data
is only ever appended at that offset) and a running SHA-256. execd never holds more of the file
than the chunk being written. Chunks of one upload are applied one at a time in offset order: a
chunk that arrives ahead of its predecessor (pipelining clients) waits for it, at most
``GAP_WAIT`` seconds and ``MAX_WAITERS`` chunks deep, then the gap is refused. A chunk wholly
received already is acknowledged without being written again, so re-sending is harmless.

The table is bounded (``max_open`` uploads per execd, beyond which ``busy``) and swept: an upload
with no request for ``idle_timeout`` seconds is aborted and its temporary file removed. Uploads
belong to one sandbox; another sandbox's subjects cannot name them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import structlog

from sandpod_contract.errors import BadRequest, Busy, FsUploadNotFound
from sandpod_execd.files.atomic import AtomicFile

__all__ = ["GAP_WAIT", "MAX_WAITERS", "Upload", "UploadTable"]

log = structlog.get_logger("sandpod.execd.fs")

T = TypeVar("T")
RunBlocking = Callable[..., Awaitable[Any]]
Spawn = Callable[[Coroutine[Any, Any, None], str], None]

GAP_WAIT = 2.0  # seconds a chunk ahead of the received bytes waits for the missing ones
MAX_WAITERS = 8  # chunks that may wait at once per upload (each holds its data in memory)


class Upload:
    def __init__(self, upload_id: str, sandbox_id: str, file: AtomicFile, path: str) -> None:
        self.id = upload_id
        self.sandbox_id = sandbox_id
        self.file = file
        self.path = path  # as the client named it, for messages
        self.received = 0
        self.sha256 = hashlib.sha256()
        self.last_used = time.monotonic()
        self.busy = 0  # requests working on it now (the sweeper leaves it alone)
        self.lock = asyncio.Lock()
        self.advanced = asyncio.Condition(self.lock)
        self.waiters = 0
        self.dropped = False

    def append(self, data: bytes | memoryview) -> None:
        """Blocking: write ``data`` at ``received`` and hash it."""
        self.file.write(data)
        self.sha256.update(data)
        self.received += len(data)


class UploadTable:
    """The open uploads of one execd (see the module docstring)."""

    def __init__(
        self, run: RunBlocking, spawn: Spawn, *, max_open: int, idle_timeout: float
    ) -> None:
        self._run = run  # runs a blocking function off the event loop
        self._spawn = spawn  # starts an owned background task (the sweeper)
        self.max_open = max_open
        self.idle_timeout = idle_timeout
        self._uploads: dict[str, Upload] = {}
        self._sweeping = False
        self._closed = asyncio.Event()

    def __len__(self) -> int:
        return len(self._uploads)

    def add(self, sandbox_id: str, file: AtomicFile, path: str) -> Upload:
        if len(self._uploads) >= self.max_open:
            file.abort()
            raise Busy(
                f"{len(self._uploads)} uploads open (limit {self.max_open}); commit or abort "
                "some, or retry shortly",
                limit=self.max_open,
            )
        upload = Upload(secrets.token_hex(16), sandbox_id, file, path)
        self._uploads[upload.id] = upload
        if not self._sweeping and not self._closed.is_set():
            self._sweeping = True
            self._spawn(self._sweep(), "fs-upload-sweeper")
        return upload

    async def _sweep(self) -> None:
        """Abort idle uploads while any are open (ends with the last one, or at close)."""
        interval = max(self.idle_timeout / 4, 0.05)
        try:
            while self._uploads and not self._closed.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closed.wait(), interval)
                for upload in self.sweep():
                    log.info(
                        "upload_expired",
                        upload_id=upload.id,
                        path=upload.path,
                        received=upload.received,
                    )
        finally:
            self._sweeping = False

    def get(self, sandbox_id: str, upload_id: str) -> Upload:
        upload = self._uploads.get(upload_id)
        if upload is None or upload.sandbox_id != sandbox_id:
            raise FsUploadNotFound(
                f"no upload {upload_id!r} (committed, aborted, or idle for more than "
                f"{self.idle_timeout:g}s); start it again",
                upload_id=upload_id,
            )
        upload.last_used = time.monotonic()
        return upload

    async def chunk(self, sandbox_id: str, upload_id: str, offset: int, data: bytes) -> int:
        """Apply one chunk; returns the bytes received. Errors other than a gap abort it."""
        upload = self.get(sandbox_id, upload_id)
        upload.busy += 1
        try:
            async with upload.lock:
                if offset > upload.received:
                    await self._wait_for_gap(upload, offset)
                if upload.dropped:
                    self.get(sandbox_id, upload_id)  # raises: aborted while we waited
                upload.last_used = time.monotonic()
                skip = upload.received - offset
                if skip < len(data):
                    try:
                        await self._run(upload.append, memoryview(data)[skip:] if skip else data)
                    except BaseException:
                        self.drop(upload)
                        raise
                    upload.advanced.notify_all()
                return upload.received
        finally:
            self._release(upload)

    async def _wait_for_gap(self, upload: Upload, offset: int) -> None:
        if upload.waiters >= MAX_WAITERS:
            raise self._gap(upload, offset)
        upload.waiters += 1
        try:
            await asyncio.wait_for(
                upload.advanced.wait_for(lambda: offset <= upload.received or upload.dropped),
                GAP_WAIT,
            )
        except TimeoutError:
            if upload.dropped:
                self.get(upload.sandbox_id, upload.id)  # raises: dropped while we waited
            raise self._gap(upload, offset) from None
        finally:
            upload.waiters -= 1

    @staticmethod
    def _gap(upload: Upload, offset: int) -> BadRequest:
        return BadRequest(
            f"chunk at offset {offset} leaves a gap: {upload.received} bytes received so far; "
            "send chunks in order",
            upload_id=upload.id,
            offset=offset,
            received=upload.received,
        )

    async def commit(
        self, sandbox_id: str, upload_id: str, size: int | None, sha256: str | None
    ) -> str:
        """Verify and rename into place; returns the target's path (in the sandbox's root)."""
        upload = self.get(sandbox_id, upload_id)
        upload.busy += 1
        try:
            async with upload.lock:
                if upload.dropped:
                    self.get(sandbox_id, upload_id)  # raises: aborted while we waited
                self._verify(upload, size, sha256)
                del self._uploads[upload.id]
                try:
                    target: str = await self._run(upload.file.commit)
                except BaseException:
                    await self._run(upload.file.abort)
                    raise
                return target
        finally:
            self._release(upload)

    def _verify(self, upload: Upload, size: int | None, sha256: str | None) -> None:
        problem = None
        if size is not None and size != upload.received:
            problem = f"{size} bytes declared, {upload.received} received"
        elif sha256 is not None and sha256.lower() != upload.sha256.hexdigest():
            problem = f"sha256 {sha256.lower()} declared, {upload.sha256.hexdigest()} received"
        if problem:
            self.drop(upload)
            raise BadRequest(
                f"upload of {upload.path} does not match: {problem}; it was aborted",
                upload_id=upload.id,
                received=upload.received,
            )

    def drop(self, upload: Upload) -> None:
        """Forget ``upload`` and remove its temporary file (a small blocking unlink).

        While a request is writing to it the file is closed by that request when it finishes:
        closing a descriptor another thread writes to could let a new file reuse its number.
        """
        if self._uploads.pop(upload.id, None) is not None:
            upload.dropped = True
            if not upload.busy:
                upload.file.abort()

    @staticmethod
    def _release(upload: Upload) -> None:
        upload.busy -= 1
        upload.last_used = time.monotonic()
        if upload.dropped and not upload.busy:
            upload.file.abort()

    def abort(self, sandbox_id: str, upload_id: str) -> int:
        """Drop an upload; unknown ids are fine (abort is idempotent). Returns bytes received."""
        upload = self._uploads.get(upload_id)
        if upload is None or upload.sandbox_id != sandbox_id:
            return 0
        self.drop(upload)
        return upload.received

    def sweep(self, now: float | None = None) -> list[Upload]:
        """Abort uploads idle for longer than ``idle_timeout``; returns them."""
        now = time.monotonic() if now is None else now
        stale = [
            u
            for u in self._uploads.values()
            if not u.busy and now - u.last_used > self.idle_timeout
        ]
        for upload in stale:
            self.drop(upload)
        return stale

    def close(self) -> None:
        """Abort every upload and stop the sweeper (shutdown)."""
        self._closed.set()
        for upload in list(self._uploads.values()):
            self.drop(upload)
