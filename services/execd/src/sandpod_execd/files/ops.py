"""Single-path operations: read a byte range, write, mkdir, remove, move, copy, chmod, chown.

All functions are blocking (the handlers run them on worker threads), take a sandbox's
:class:`~.rooted.Root` and paths in it, and raise ``OSError`` naming those paths for the caller to
map with :func:`~.paths.os_error`. Every path is resolved once, in the root, into a descriptor
(the object, or its directory and a name used without following it); nothing re-resolves a
path string a sandbox process could swap meanwhile. None of them reads a whole file
into memory: reads return one bounded range, copies go through the kernel
(``copy_file_range``/``sendfile``) in bounded steps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import shutil
import stat
from collections.abc import Callable

from sandpod_execd.files import identity
from sandpod_execd.files.atomic import AtomicFile, rename_noreplace
from sandpod_execd.files.copying import (
    KEEP_OWNER,
    check_into_itself,
    copy,
    copy_at,
    prepare_dst,
)
from sandpod_execd.files.entries import EntryType, entry_type
from sandpod_execd.files.paths import FileTooLarge
from sandpod_execd.files.rooted import (
    Root,
    chmod_fd,
    chown_fd,
    naming,
    tree,
)

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


@dataclasses.dataclass(frozen=True, slots=True)
class Chunk:
    data: bytes
    offset: int
    size: int
    eof: bool
    mtime: float


def _err(code: int, path: str, other: str | None = None) -> OSError:
    return OSError(code, os.strerror(code), path, None, other)


def read_chunk(root: Root, path: str, offset: int, length: int, max_size: int | None) -> Chunk:
    """Up to ``length`` bytes of ``path`` from ``offset``.

    Regular files are sized by ``fstat``; files the kernel does not size (``/proc``) and devices
    end at the first short read. FIFOs and sockets are refused: a read could block forever.

    Raises:
        OSError: EISDIR for a directory, EINVAL for a FIFO or socket, EFBIG past ``max_size``.
    """
    fd = root.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
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
        with naming(path):
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
    root: Root,
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
        root,
        path,
        mode=mode,
        owner=owner,
        make_parents=make_parents,
        exclusive=exclusive,
        new_owner=new_owner,
    )
    try:
        atomic.write(data)
    except BaseException:
        atomic.abort()
        raise
    return atomic.commit()


def exists(root: Root, path: str, follow: bool) -> EntryType | None:
    """The type of ``path``, or None when it does not exist (or is a dangling link, if
    ``follow``). Other errors (permission, loops) raise."""
    try:
        st = root.stat(path, follow=follow)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return entry_type(st.st_mode)


def mkdir(
    root: Root, path: str, *, parents: bool, mode: int | None, owner: tuple[int, int] | None
) -> None:
    """``mkdir`` (or ``mkdir -p`` with ``parents``: an existing directory is left as it is).
    ``mode`` applies to ``path``, ``owner`` to every directory created."""
    if parents:
        try:
            st = root.stat(path)
        except OSError:
            pass  # missing, or something in the way that makedirs reports
        else:
            if stat.S_ISDIR(st.st_mode):
                return
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path)
        created = root.makedirs(path, DIR_MODE)
    else:
        with root.parent(path) as (dirfd, name), naming(path):
            os.mkdir(name, DIR_MODE, dir_fd=dirfd)
        created = [path]
    for made in created:
        fd = root.open(made, os.O_PATH | os.O_DIRECTORY)
        try:
            with naming(made):
                if mode is not None and made is created[-1]:
                    chmod_fd(fd, mode)  # not mkdir's mode: that goes through the umask
                if owner is not None:
                    chown_fd(fd, *owner)
        finally:
            os.close(fd)


def remove(root: Root, path: str, *, recursive: bool, missing_ok: bool) -> bool:
    """Delete a file, a link (never its target) or a directory; returns whether it existed."""
    with root.parent(path) as (dirfd, name), naming(path):
        try:
            st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        except FileNotFoundError:
            if missing_ok:
                return False
            raise
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=dirfd)
        elif recursive:
            shutil.rmtree(name, dir_fd=dirfd)  # fd-based: never follows a link in the tree
        else:
            os.rmdir(name, dir_fd=dirfd)
    return True


def move(
    root: Root,
    src: str,
    dst: str,
    *,
    overwrite: bool,
    make_parents: bool,
    new_owner: tuple[int, int] | None = None,
) -> None:
    """Rename ``src`` to ``dst``; across filesystems, copy then delete (owners kept). Parents
    made for ``dst`` belong to ``new_owner`` when given."""
    with root.parent(src) as (sdir, sname):
        st = prepare_dst(
            root, src, dst, make_parents=make_parents, sdir=sdir, sname=sname, owner=new_owner
        )
        with root.parent(dst) as (ddir, dname):
            check_into_itself(st, ddir, src, dst)
            try:
                if overwrite:
                    os.rename(sname, dname, src_dir_fd=sdir, dst_dir_fd=ddir)
                else:
                    rename_noreplace(sname, dname, src_dir=sdir, dst_dir=ddir)
                return
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise _err(exc.errno or errno.EIO, src, dst) from exc
            _check_removable(sdir, st, src)  # before copying: a refused move leaves no copy
            _replace_for_move(ddir, dname, dst, overwrite=overwrite)
            copy_at(sdir, sname, ddir, dname, src=src, dst=dst, merge=False, new_owner=KEEP_OWNER)
            with naming(src):
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(sname, dir_fd=sdir)
                else:
                    os.unlink(sname, dir_fd=sdir)


def _check_removable(sdir: int, st: os.stat_result, src: str) -> None:
    """Raise what unlink/rmdir would (EACCES, EPERM) if the fs identity in force may not remove
    ``src`` (lstat ``st``) from its directory ``sdir``."""
    if not os.access(f"/proc/self/fd/{sdir}", os.W_OK | os.X_OK, effective_ids=True):
        raise _err(errno.EACCES, src)
    ident = identity.current()
    uid = ident.uid if ident is not None else os.geteuid()
    parent = os.fstat(sdir)
    if uid != 0 and parent.st_mode & stat.S_ISVTX and uid not in (st.st_uid, parent.st_uid):
        raise _err(errno.EPERM, src)  # a sticky directory (/tmp): only owners remove


def _replace_for_move(ddir: int, dname: str, dst: str, *, overwrite: bool) -> None:
    """Make room for a copied move like rename(2) would: only an empty directory is replaced."""
    with naming(dst):
        try:
            st = os.stat(dname, dir_fd=ddir, follow_symlinks=False)
        except FileNotFoundError:
            return
        if not overwrite:
            raise _err(errno.EEXIST, dst)
        if stat.S_ISDIR(st.st_mode):
            os.rmdir(dname, dir_fd=ddir)
        else:
            os.unlink(dname, dir_fd=ddir)


def chmod(root: Root, path: str, mode: int, *, recursive: bool) -> None:
    """Set permission bits (recursion skips symlinks: their mode means nothing on Linux)."""
    fd = root.open(path, os.O_PATH)
    try:
        with naming(path):
            chmod_fd(fd, mode)
            if not recursive or not stat.S_ISDIR(os.fstat(fd).st_mode):
                return
            top = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            try:
                for dirfd, name, st in tree(top):
                    if not stat.S_ISLNK(st.st_mode):
                        _at_object(dirfd, name, lambda obj: chmod_fd(obj, mode))
            finally:
                os.close(top)
    finally:
        os.close(fd)


def chown(root: Root, path: str, uid: int, gid: int, *, recursive: bool) -> None:
    """Set owner/group (-1 keeps one); recursion changes links themselves, never follows."""
    fd = root.open(path, os.O_PATH)
    try:
        with naming(path):
            chown_fd(fd, uid, gid)
            if not recursive or not stat.S_ISDIR(os.fstat(fd).st_mode):
                return
            top = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            try:
                for dirfd, name, _ in tree(top):
                    with contextlib.suppress(FileNotFoundError):
                        os.chown(name, uid, gid, dir_fd=dirfd, follow_symlinks=False)
            finally:
                os.close(top)
    finally:
        os.close(fd)


def _at_object(dirfd: int, name: str, change: Callable[[int], None]) -> None:
    """Apply ``change`` to the object ``name`` in ``dirfd`` unless it is now a link."""
    try:
        obj = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
    except FileNotFoundError:
        return
    try:
        if not stat.S_ISLNK(os.fstat(obj).st_mode):
            change(obj)
    finally:
        os.close(obj)
