"""Single-path operations: read a byte range, write, mkdir, remove, move, copy, chmod, chown.

All functions are blocking (the handlers run them on worker threads), take host paths, and raise
``OSError`` for the caller to map with :func:`~.paths.os_error`. None of them reads a whole file
into memory: reads return one bounded range, copies go through the kernel
(``copy_file_range``/``sendfile``) in bounded steps.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import stat

from sandpod_execd.files.atomic import AtomicFile, makedirs, rename_noreplace
from sandpod_execd.files.entries import EntryType, entry_type
from sandpod_execd.files.paths import FileTooLarge

__all__ = [
    "Chunk",
    "chmod",
    "chown",
    "copy",
    "exists",
    "mkdir",
    "move",
    "read_chunk",
    "remove",
    "write_file",
]

DIR_MODE = 0o755
COPY_STEP = 8 * 1024 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class Chunk:
    data: bytes
    offset: int
    size: int
    eof: bool
    mtime: float


def _err(code: int, path: str) -> OSError:
    return OSError(code, os.strerror(code), path)


def read_chunk(path: str, offset: int, length: int, max_size: int | None) -> Chunk:
    """Up to ``length`` bytes of ``path`` from ``offset``.

    Regular files are sized by ``fstat``; files the kernel does not size (``/proc``) and devices
    end at the first short read. FIFOs and sockets are refused: a read could block forever.

    Raises:
        OSError: EISDIR for a directory, EINVAL for a FIFO or socket, EFBIG past ``max_size``.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise _err(errno.EISDIR, path)
        if stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file or device (a FIFO or socket)", path)
        if max_size is not None and st.st_size > max_size:
            hint = "read it in ranges (offset/length) or stream it"
            raise FileTooLarge(path, st.st_size, max_size, hint)
        parts: list[bytes] = []
        got = 0
        while got < length:
            part = os.pread(fd, length - got, offset + got)
            if not part:
                break
            parts.append(part)
            got += len(part)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
    finally:
        os.close(fd)
    end = offset + len(data)
    if length == 0:
        eof = offset >= st.st_size
    elif stat.S_ISREG(st.st_mode) and st.st_size > 0:
        eof = len(data) < length or end >= st.st_size
    else:
        eof = len(data) < length
    grown = end if data else 0  # a file that grew since fstat is at least this long
    # Unsized (/proc) files report 0 until eof, then what was read.
    unsized = grown if eof else 0
    return Chunk(data, offset, max(st.st_size, grown) if st.st_size else unsized, eof, st.st_mtime)


def write_file(
    path: str,
    data: bytes,
    *,
    mode: int | None,
    owner: tuple[int, int] | None,
    make_parents: bool,
    exclusive: bool,
    new_owner: tuple[int, int] | None = None,
) -> str:
    """Replace ``path`` with ``data`` atomically; returns the path written (a link's target)."""
    atomic = AtomicFile(
        path, mode=mode, owner=owner, make_parents=make_parents, exclusive=exclusive,
        new_owner=new_owner,
    )  # fmt: skip
    try:
        atomic.write(data)
    except BaseException:
        atomic.abort()
        raise
    return atomic.commit()


def exists(path: str, follow: bool) -> EntryType | None:
    """The type of ``path``, or None when it does not exist (or is a dangling link, if
    ``follow``). Other errors (permission, loops) raise."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return entry_type(st.st_mode)


def mkdir(path: str, *, parents: bool, mode: int | None, owner: tuple[int, int] | None) -> None:
    """``mkdir`` (or ``mkdir -p`` with ``parents``: an existing directory is left as it is)."""
    if parents and os.path.isdir(path):
        return
    if parents:
        os.makedirs(path, mode=DIR_MODE if mode is None else mode, exist_ok=True)
    else:
        os.mkdir(path, DIR_MODE if mode is None else mode)
    if mode is not None:
        os.chmod(path, mode)  # mkdir's mode went through the umask
    if owner is not None:
        os.chown(path, *owner)


def remove(path: str, *, recursive: bool, missing_ok: bool) -> bool:
    """Delete a file, a link (never its target) or a directory; returns whether it existed."""
    path = path.rstrip("/") or "/"  # "link/" would otherwise follow the link
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if missing_ok:
            return False
        raise
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
    elif recursive:
        shutil.rmtree(path)  # fd-based: never follows a link planted inside the tree
    else:
        os.rmdir(path)
    return True


def _inside(path: str, parent: str) -> bool:
    real, top = os.path.realpath(path), os.path.realpath(parent)
    return real == top or real.startswith(top.rstrip("/") + "/")


def _prepare_dst(src: str, dst: str, *, make_parents: bool) -> os.stat_result:
    st = os.lstat(src)  # the source must exist: report it, not the destination
    if make_parents:
        makedirs(os.path.dirname(dst) or ".")
    if stat.S_ISDIR(st.st_mode) and _inside(dst, src):
        raise OSError(errno.EINVAL, "cannot move or copy a directory into itself", src, None, dst)
    return st


def move(src: str, dst: str, *, overwrite: bool, make_parents: bool) -> None:
    """Rename ``src`` to ``dst``; across filesystems, copy then delete."""
    _prepare_dst(src, dst, make_parents=make_parents)
    try:
        if overwrite:
            os.rename(src, dst)
        else:
            rename_noreplace(src, dst)
        return
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    if os.path.lexists(dst):
        if not overwrite:
            raise _err(errno.EEXIST, dst)
        if os.path.isdir(dst) and not os.path.islink(dst):
            os.rmdir(dst)  # like rename(2): only an empty directory is replaced
        else:
            os.unlink(dst)
    shutil.move(src, dst)


def copy(
    src: str,
    dst: str,
    *,
    recursive: bool,
    overwrite: bool,
    make_parents: bool,
    new_owner: tuple[int, int] | None = None,
) -> None:
    """Copy a file atomically (mode kept), or a directory tree (links copied as links); what is
    created belongs to ``new_owner`` when given."""
    _prepare_dst(src, dst, make_parents=make_parents)
    st = os.stat(src)
    if stat.S_ISDIR(st.st_mode):
        if not recursive:
            raise OSError(errno.EISDIR, "is a directory; copy it with recursive", src)
        if os.path.lexists(dst) and not overwrite:
            raise _err(errno.EEXIST, dst)
        shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=overwrite)
        if new_owner is not None:
            chown(dst, *new_owner, recursive=True)
        return
    if os.path.isdir(dst):
        raise _err(errno.EISDIR, dst)
    atomic = AtomicFile(dst, mode=stat.S_IMODE(st.st_mode), make_parents=False,
                        exclusive=not overwrite, new_owner=new_owner)  # fmt: skip
    try:
        with open(src, "rb") as source:
            _copy_fd(source.fileno(), atomic.fd)
    except BaseException:
        atomic.abort()
        raise
    atomic.commit()


def _copy_fd(src: int, dst: int) -> None:
    """Copy all of ``src`` to ``dst`` in the kernel, in bounded steps."""
    try:
        while os.copy_file_range(src, dst, COPY_STEP):
            pass
        return
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            raise
    while os.sendfile(dst, src, None, COPY_STEP):
        pass


def chmod(path: str, mode: int, *, recursive: bool) -> None:
    """Set permission bits (recursion skips symlinks: their mode means nothing on Linux)."""
    os.chmod(path, mode)
    if recursive and os.path.isdir(path) and not os.path.islink(path):
        for top, dirs, files in os.walk(path):
            for name in (*dirs, *files):
                child = os.path.join(top, name)
                if not os.path.islink(child):
                    os.chmod(child, mode)


def chown(path: str, uid: int, gid: int, *, recursive: bool) -> None:
    """Set owner/group (-1 keeps one); recursion changes links themselves, never follows."""
    os.chown(path, uid, gid)
    if recursive and os.path.isdir(path) and not os.path.islink(path):
        for top, dirs, files in os.walk(path):
            for name in (*dirs, *files):
                os.lchown(os.path.join(top, name), uid, gid)
