"""``sandpod cp``: copy files between this machine and a sandbox, streamed, any size.

``-r`` copies a directory as one tar stream (``sbx.fs.archive``/``extract``): into a sandbox it
is unpacked by the sandbox's own ``tar`` as its user; out of one it is unpacked here by Python's
``tarfile`` with its ``data`` filter (the sandbox is not trusted: no absolute or ``../`` names,
no hard links out of the target, nothing written through a link, no devices, no setuid bits;
symlinks keep their targets). ``-`` with ``-r`` is the tar stream itself on stdin or stdout.

``SANDBOX:PATH`` names a path in a sandbox (as ``scp`` does; a local path containing ``:`` can be
written ``./a:b``), ``-`` is stdin or stdout, anything else is a local path. Uploads and
downloads are atomic on the receiving side and keep the file's mode; a large transfer shows its
progress on stderr when stderr is a terminal.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tarfile
import time
from collections.abc import AsyncIterator
from typing import Any

from sandpod.aio import AsyncSandbox
from sandpod.errors import SandpodError
from sandpod_contract.subjects import SANDBOX_ID_RE

__all__ = ["add_parsers"]

EXIT_SANDPOD_ERROR = 125
PROGRESS_FROM = 8 * 1024 * 1024  # smaller transfers finish before a progress line helps
STDIO_CHUNK = 512 * 1024


def add_parsers(sub: Any) -> None:
    """Register this module's subcommands on the ``sandpod`` parser."""
    p = sub.add_parser(
        "cp",
        help="copy a file into or out of a sandbox",
        description="Copy a file between this machine and a sandbox (streamed, atomic, mode kept).",
        epilog="examples:  sandpod cp ./data.csv default:/workspace/data.csv\n"
        "           sandpod cp default:/workspace/out.tar.gz .\n"
        "           tar cz src | sandpod cp - default:src.tgz\n"
        "           sandpod cp default:log.txt - | tail\n"
        "           sandpod cp -r ./src default:/workspace/src\n"
        "           sandpod cp -r default:/workspace/out ./out\n"
        "           sandpod cp -r default:/workspace - | tar t",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("src", help="SANDBOX:PATH, a local path, or - for stdin")
    p.add_argument("dst", help="SANDBOX:PATH, a local path or directory, or - for stdout")
    p.add_argument(
        "-r", "--recursive", action="store_true", help="copy a directory (as one tar stream)"
    )
    p.add_argument("-z", "--gzip", action="store_true", help="with -r and -: a gzip'ed tar")
    p.add_argument("-m", "--mode", type=_octal, help="mode of the new file (octal, e.g. 755)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    p.add_argument("--nats-url", help="NATS URL (default: $SANDPOD_NATS_URL, $NATS_URL)")
    p.add_argument("--prefix", help="subject prefix (default: sandpod)")
    p.set_defaults(run=_run_cp)


def _octal(text: str) -> int:
    try:
        mode = int(text, 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an octal mode such as 644") from None
    if not 0 <= mode <= 0o7777:
        raise argparse.ArgumentTypeError(f"{text!r} is not a mode between 0 and 7777")
    return mode


def _remote(arg: str) -> tuple[str, str] | None:
    """``(sandbox, path)`` for ``SANDBOX:PATH``, else None (a local path or ``-``)."""
    sandbox, sep, path = arg.partition(":")
    if sep and SANDBOX_ID_RE.fullmatch(sandbox):
        return sandbox, path or "/workspace"
    return None


def _run_cp(args: argparse.Namespace) -> int:
    src, dst = _remote(args.src), _remote(args.dst)
    if (src is None) == (dst is None):
        print("error: exactly one of SRC and DST must be SANDBOX:PATH", file=sys.stderr)
        return 2
    local = args.dst if src is not None else args.src
    local_dir = local != "-" and os.path.isdir(local)
    args.local_is_dir = local_dir  # decided here: the async side does no blocking path calls
    args.local_name = os.path.basename(os.path.abspath(local))
    if dst is not None and local_dir and not args.recursive:
        print(
            f"error: {local} is a directory; copy it with -r: sandpod cp -r {local} {args.dst}",
            file=sys.stderr,
        )
        return 2
    try:
        return asyncio.run(_cp(args, src, dst, local_dir=local_dir))
    except SandpodError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if exc.retryable:
            print("hint: this error is retryable; try again", file=sys.stderr)
        return EXIT_SANDPOD_ERROR
    except (OSError, tarfile.TarError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


async def _cp(
    args: argparse.Namespace,
    src: tuple[str, str] | None,
    dst: tuple[str, str] | None,
    *,
    local_dir: bool,
) -> int:
    sandbox = (src or dst or ("", ""))[0]
    progress = None if args.quiet or not sys.stderr.isatty() else _Progress()
    async with await AsyncSandbox.connect(
        sandbox, nats_url=args.nats_url, prefix=args.prefix
    ) as sbx:
        if args.recursive:
            await _cp_tree(sbx, args, src, dst, progress)
        elif src is not None:
            local = args.dst
            if local_dir:
                local = os.path.join(local, os.path.basename(src[1].rstrip("/")) or "file")
            await _download(sbx, src[1], local, progress)
        else:
            if dst is None:  # parse_cp refuses two local sides; -O must not drop the check
                raise SystemExit("sandpod cp: one side must be <sandbox>:<path>")
            await _upload(sbx, args.src, dst[1], args.mode, progress)
    if progress is not None:
        progress.finish()
    return 0


async def _download(sbx: AsyncSandbox, path: str, local: str, progress: _Progress | None) -> None:
    if local == "-":
        out = sys.stdout.buffer
        async with sbx.fs.read_stream(path) as reader:
            done = 0
            async for chunk in reader:
                out.write(chunk)
                done += len(chunk)
                if progress is not None:
                    progress(done, reader.size or None)
        out.flush()
        return
    await sbx.fs.download(path, local, progress=progress)


async def _upload(
    sbx: AsyncSandbox, local: str, path: str, mode: int | None, progress: _Progress | None
) -> None:
    if local != "-" and (path.endswith("/") or await _is_dir(sbx, path)):
        path = path.rstrip("/") + "/" + os.path.basename(local.rstrip("/"))
    if local != "-":
        await sbx.fs.upload(local, path, mode=mode, progress=progress)
        return
    loop = asyncio.get_running_loop()
    fd = sys.stdin.fileno()
    async with sbx.fs.open_writer(path, mode=mode) as writer:
        while data := await loop.run_in_executor(None, os.read, fd, STDIO_CHUNK):
            await writer.write(data)
            if progress is not None:
                progress(writer.written, None)


async def _cp_tree(
    sbx: AsyncSandbox,
    args: argparse.Namespace,
    src: tuple[str, str] | None,
    dst: tuple[str, str] | None,
    progress: _Progress | None,
) -> None:
    """``cp -r`` either way, as ``cp -r`` names things: into an existing directory, the copy
    goes under it by the source's name; otherwise it becomes that name."""
    gzip = bool(args.gzip) and (args.src == "-" or args.dst == "-")
    if src is not None:
        path, local = src[1], args.dst
        if local == "-":
            async for chunk in sbx.fs.archive(path, gzip=gzip, progress=progress):
                await asyncio.to_thread(sys.stdout.buffer.write, chunk)
            sys.stdout.buffer.flush()
            return
        if args.local_is_dir:
            local = os.path.join(local, os.path.basename(path.rstrip("/")) or "workspace")
        await _unpack_here(sbx.fs.archive(path, progress=progress), local)
        return
    if dst is None:
        raise SystemExit("sandpod cp: one side must be <sandbox>:<path>")
    path = dst[1]
    if args.src == "-":
        await sbx.fs.extract(path, sys.stdin.buffer, gzip=gzip, progress=progress)
        return
    if not args.local_is_dir:
        raise NotADirectoryError(f"{args.src}: not a directory (copy a file without -r)")
    if path.endswith("/") or await _is_dir(sbx, path):
        path = path.rstrip("/") + "/" + args.local_name
    await sbx.fs.extract(path, _pack_here(args.src), progress=progress)


async def _unpack_here(chunks: AsyncIterator[bytes], local: str) -> None:
    """Unpack a sandbox's tar stream into ``local`` with :func:`_untrusted` as the filter, on a
    thread fed through a pipe (bounded: the sandbox's tar waits while this side writes)."""
    made = await asyncio.to_thread(_make_dir, local)
    try:
        await _unpack_into(chunks, local)
    except BaseException:
        if made:  # a failed copy leaves no empty directory behind (a partial one stays)
            with contextlib.suppress(OSError):
                os.rmdir(local)
        raise


def _untrusted(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    """``tarfile``'s ``data`` filter (no absolute or ``../`` names, no hard links out, no
    devices, no setuid bits), except that a symlink keeps its target as the sandbox made it
    (``/etc/ssl/certs`` is all absolute links); every later member's *real* path must still be
    inside ``dest``, so nothing is ever written through such a link."""
    if member.issym():
        return tarfile.tar_filter(member, dest)
    return tarfile.data_filter(member, dest)


def _make_dir(path: str) -> bool:
    """Make ``path`` (and parents); whether it was not there before."""
    try:
        os.makedirs(path)
    except FileExistsError:
        if not os.path.isdir(path):
            raise
        return False
    return True


async def _unpack_into(chunks: AsyncIterator[bytes], local: str) -> None:
    rfd, wfd = os.pipe()

    def unpack() -> None:
        with os.fdopen(rfd, "rb") as pipe, tarfile.open(fileobj=pipe, mode="r|") as tf:
            tf.extractall(local, filter=_untrusted)  # noqa: S202 - every member is filtered

    worker = asyncio.create_task(asyncio.to_thread(unpack))
    try:
        with os.fdopen(wfd, "wb", buffering=0) as out:
            async for chunk in chunks:
                if worker.done():  # the unpacker stopped (a refused member): its error says why
                    break
                await asyncio.to_thread(out.write, chunk)
    except BrokenPipeError:
        pass  # the unpacker stopped reading: its error says why
    except BaseException:
        # The sandbox side failed (no such directory, tar failed): that is the error to show,
        # not the unpacker's complaint about the short stream it then saw.
        with contextlib.suppress(Exception):
            await worker
        raise
    await worker


async def _pack_here(local: str) -> AsyncIterator[bytes]:
    """A local directory as a tar stream (names relative to it), made on a thread."""
    rfd, wfd = os.pipe()

    def pack() -> None:
        with os.fdopen(wfd, "wb") as pipe, tarfile.open(fileobj=pipe, mode="w|") as tf:
            tf.add(local, arcname=".")

    worker = asyncio.create_task(asyncio.to_thread(pack))
    with os.fdopen(rfd, "rb", buffering=0) as pipe:
        while chunk := await asyncio.to_thread(pipe.read, STDIO_CHUNK):
            yield chunk
    await worker


async def _is_dir(sbx: AsyncSandbox, path: str) -> bool:
    try:
        return (await sbx.fs.stat(path, follow_symlinks=True)).is_dir
    except SandpodError:
        return False


class _Progress:
    """A throttled ``\\r`` progress line on stderr (only created when stderr is a terminal)."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.shown = 0.0
        self.done = 0
        self.total: int | None = None

    def __call__(self, done: int, total: int | None) -> None:
        self.done, self.total = done, total
        now = time.monotonic()
        if done >= PROGRESS_FROM and now - self.shown >= 0.1:
            self.shown = now
            self._render(now)

    def _render(self, now: float) -> None:
        rate = self.done / max(now - self.started, 1e-6) / 2**20
        line = f"{self.done / 2**20:10.1f} MiB"
        if self.total:
            line += f" / {self.total / 2**20:.1f} MiB {100 * self.done / self.total:5.1f}%"
        sys.stderr.write(f"\r{line}  {rate:7.1f} MiB/s ")
        sys.stderr.flush()

    def finish(self) -> None:
        if self.shown:  # a line was drawn: draw the final numbers and end it
            self._render(time.monotonic())
            sys.stderr.write("\n")
            sys.stderr.flush()
