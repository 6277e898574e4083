"""A directory of a sandbox as one tar stream, both ways: backup (:func:`archive`) and restore
(:func:`extract`), any size, flow-controlled, written once for the SDK and the gateway.

How: the sandbox's own ``tar``, run through a streaming exec (``exec.start``): the archive is
the command's stdout (acknowledged window by window, so a slow reader slows ``tar``, never
execd's memory), and a restore is fed to its stdin (each write returns once execd put it in the
pipe). A few lines of ``sh`` around ``tar`` turn the usual failures into exit codes this module
maps to a typed error (no ``tar``); the directory is the exec's working directory, so execd
resolves ``path`` as it resolves every fs path (a refused one is classified by ``fs.stat``).

Why the sandbox's ``tar`` rather than execd packing files itself:
- the archive is made and unpacked by the sandbox's own user inside its jail, so a hostile
  archive (``../`` names, absolute names, symlink-then-write, device nodes, setuid bits) can
  reach nothing the sandbox's code could not already write: the jail is the boundary, not a
  path filter of ours;
- GNU tar already knows every file type, hard links, sparse files, xattrs and long names;
- execd gains no code and no dependency.
The cost: the image needs ``sh`` and ``tar`` (Debian, Ubuntu, Alpine and the Python images have
both; a distroless image gets :class:`ArchiveUnsupported` naming what is missing). GNU tar's
``--xattrs --sparse`` are used when the image's tar is GNU; busybox tar gets the plain form.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Callable

from sandpod_client.channel import Link
from sandpod_client.stream import STDIN_CHUNK, ExecStream
from sandpod_client.transfer import REPLY_ROOM
from sandpod_contract.errors import (
    CommandNotFound,
    FsAlreadyExists,
    FsError,
    FsNotADirectory,
    FsPermissionDenied,
    InvalidCwd,
    SandpodError,
    StreamClosed,
)
from sandpod_contract.messages.exec import ExecExit
from sandpod_contract.messages.fs import FsEntry, FsMkdir, FsPath

__all__ = ["ArchiveFailed", "ArchiveUnsupported", "archive", "extract"]

Progress = Callable[[int], None]

# The wrapper's own exit code (tar's are 0-2) for "no tar in the image".
_NO_TAR = 93
_STDERR_TAIL = 4096
_OP_TIMEOUT = 60.0
# The command runs in the directory (the exec's cwd: execd resolves it as every fs path is, so
# "/workspace/x" means the same here as in fs.stat, on every runtime).
_PRELUDE = (
    'command -v tar >/dev/null 2>&1 || exit 93; x=""; '
    "tar --version 2>/dev/null | grep -q GNU && x='--xattrs --sparse'; "
)
_ARCHIVE = _PRELUDE + "exec tar -c $x $1 -f - ."
_EXTRACT = _PRELUDE + "exec tar -x -p $x $1 -f -"


class ArchiveFailed(FsError):
    """``tar`` in the sandbox failed (client-side): ``details`` has its exit code and the end of
    what it printed on stderr."""

    code = "fs.archive_failed"
    summary = "tar in the sandbox failed; its message is in details.stderr"


class ArchiveUnsupported(ArchiveFailed):
    """The sandbox's image has no ``sh`` or ``tar`` (client-side)."""

    code = "fs.archive_unsupported"
    summary = "the sandbox's image has no tar (or no sh): add it to the template's image"


def _argv(script: str, gzip: bool) -> list[str]:
    return ["sh", "-c", script, "sandpod-archive", "-z" if gzip else ""]


async def archive(
    ch: Link,
    path: str,
    *,
    gzip: bool = False,
    progress: Progress | None = None,
    exec_id: str | None = None,
) -> AsyncIterator[bytes]:
    """The tar stream of the directory ``path`` (its contents, names relative to it), in
    chunks as the sandbox produces them; ``progress`` gets the bytes so far.

    Raises (from the iteration):
        FsNotFound, FsNotADirectory, FsPermissionDenied: ``path`` is not a readable directory.
        ArchiveUnsupported: the image has no ``sh`` or ``tar``.
        ArchiveFailed: ``tar`` exited non-zero (a file vanished or became unreadable midway:
            the stream already yielded is then incomplete, never silently short).
    """
    es = ExecStream(ch, argv=_argv(_ARCHIVE, gzip), cwd=path, exec_id=exec_id)
    stderr = bytearray()
    done = 0
    try:
        await _start(ch, es, path)
        async for frame in es.frames():
            if isinstance(frame, ExecExit):
                _check(frame, path, bytes(stderr))
                return
            if frame.stream == "stderr":
                _keep_tail(stderr, frame.data)
                continue
            done += len(frame.data)
            if progress is not None:
                progress(done)
            yield frame.data
    finally:
        await es.close()


async def extract(
    ch: Link,
    path: str,
    source: AsyncIterable[bytes],
    *,
    gzip: bool = False,
    progress: Progress | None = None,
    exec_id: str | None = None,
) -> int:
    """Unpack the tar stream ``source`` into the directory ``path`` (made if missing; what is
    there stays unless the archive replaces it). Returns the bytes read from ``source``.

    Raises:
        FsNotADirectory, FsPermissionDenied: ``path`` is a file, or cannot be made or entered.
        ArchiveUnsupported: the image has no ``sh`` or ``tar``.
        ArchiveFailed: ``tar`` refused the stream (not a tar, truncated, no space...).
    """
    try:
        await ch.call("fs", "mkdir", FsMkdir(path=path, parents=True), FsEntry, _OP_TIMEOUT)
    except FsAlreadyExists as exc:  # something that is not a directory is there
        raise FsNotADirectory(f"{path}: exists and is not a directory", path=path) from exc
    es = ExecStream(ch, argv=_argv(_EXTRACT, gzip), cwd=path, stdin_open=True, exec_id=exec_id)
    stderr = bytearray()
    try:
        await _start(ch, es, path)
        reader = asyncio.create_task(_collect(es, stderr), name=f"extract:{es.exec_id}")
        try:
            # One request per chunk, each awaited (stdin is ordered): as large as the server's
            # messages allow, so the round trips are few (256 KiB requests ran at a third).
            chunk = max(STDIN_CHUNK, ch.limits.max_payload - REPLY_ROOM)
            sent = await _feed(es, source, progress, chunk)
        except BaseException:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, SandpodError):
                await reader
            raise
        _check(await reader, path, bytes(stderr))
        return sent
    finally:
        await es.close()


async def _start(ch: Link, es: ExecStream, path: str) -> None:
    """Start the command; a refused cwd becomes the fs error ``fs.stat`` gives for ``path``."""
    try:
        await es.start()
    except CommandNotFound as exc:
        raise ArchiveUnsupported("the sandbox's image has no sh: add it", path=path) from exc
    except InvalidCwd as exc:
        entry = await ch.call("fs", "stat", FsPath(path=path, follow=True), FsEntry, _OP_TIMEOUT)
        if entry.type != "dir":
            raise FsNotADirectory(f"{path}: not a directory", path=path) from exc
        raise FsPermissionDenied(f"{path}: the sandbox's user cannot enter it", path=path) from exc


async def _feed(
    es: ExecStream, source: AsyncIterable[bytes], progress: Progress | None, chunk: int
) -> int:
    """Everything from ``source`` into stdin in ``chunk``-byte requests, then EOF; stops early
    (no error: the exit says why) if the command stopped reading."""
    sent = 0
    pending = bytearray()
    try:
        async for piece in source:
            pending += piece
            while len(pending) >= chunk:
                await es.stdin(bytes(pending[:chunk]))
                del pending[:chunk]
                sent += chunk
                if progress is not None:
                    progress(sent)
        if pending:
            await es.stdin(bytes(pending))
            sent += len(pending)
            if progress is not None:
                progress(sent)
        await es.stdin(b"", eof=True)
    except StreamClosed:  # tar exited before reading everything: its exit frame tells why
        pass
    return sent


async def _collect(es: ExecStream, stderr: bytearray) -> ExecExit:
    """Read the command's frames (keeping the end of stderr) until its exit."""
    async for frame in es.frames():
        if isinstance(frame, ExecExit):
            return frame
        _keep_tail(stderr, frame.data)
    raise ArchiveFailed("the stream ended without an exit")  # frames() always ends on the exit


def _keep_tail(buf: bytearray, data: bytes) -> None:
    buf += data
    if len(buf) > _STDERR_TAIL:
        del buf[: len(buf) - _STDERR_TAIL]


def _check(frame: ExecExit, path: str, stderr: bytes) -> None:
    code = frame.exit_code
    if code == 0:
        return
    said = stderr.decode("utf-8", "replace").strip()
    if code == _NO_TAR:
        raise ArchiveUnsupported(
            "the sandbox's image has no tar: add it to the template (e.g. a build step "
            "installing tar), or copy files one by one",
            path=path,
        )
    how = f"exit code {code}" if code is not None else f"signal {frame.signal}"
    raise ArchiveFailed(
        f"tar in the sandbox failed ({how}): {said[-300:] or 'no message'}",
        path=path,
        exit_code=code,
        stderr=said,
    )
