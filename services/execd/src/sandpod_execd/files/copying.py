"""Copying files and trees inside a sandbox's root, descriptor by descriptor.

A file is copied atomically (:class:`~.atomic.AtomicFile`) with its mode; a tree is copied by
walking the source and the destination together through directory descriptors, each child
opened with ``O_NOFOLLOW`` (links are copied as links, never followed; FIFOs, sockets and
devices are skipped: opening one could block or have side effects). Only the descriptors of the
branch being copied are open, so a deep or wide tree costs at most ``2 * MAX_DEPTH`` of them.
Content moves in the kernel (``copy_file_range``/``sendfile``) in bounded steps.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable

from sandpod_execd.files.atomic import AtomicFile
from sandpod_execd.files.rooted import MAX_DEPTH, Root, naming, open_dir, split

__all__ = [
    "KEEP_OWNER",
    "check_into_itself",
    "contains",
    "copy",
    "copy_at",
    "copy_fd",
    "prepare_dst",
]

COPY_STEP = 8 * 1024 * 1024
KEEP_OWNER = (-2, -2)  # as new_owner: each copy keeps its source's owner (a move across disks)


def _err(code: int, path: str, other: str | None = None) -> OSError:
    return OSError(code, os.strerror(code), path, None, other)


def prepare_dst(
    root: Root,
    src: str,
    dst: str,
    *,
    make_parents: bool,
    sdir: int,
    sname: str,
    owner: tuple[int, int] | None = None,
) -> os.stat_result:
    """lstat ``src`` (it must exist: report it, not the destination) and make ``dst``'s
    parents if asked."""
    with naming(src):
        st = os.stat(sname, dir_fd=sdir, follow_symlinks=False)
    if make_parents:
        root.makedirs(split(dst)[0], owner=owner)
    return st


def copy(
    root: Root,
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
    with root.parent(src) as (sdir, sname):
        prepare_dst(
            root, src, dst, make_parents=make_parents, sdir=sdir, sname=sname, owner=new_owner
        )
    sfd = root.open(src, os.O_PATH)  # follows links, in the root
    try:
        st = os.fstat(sfd)
        if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
            readable = _reopen(sfd, os.O_RDONLY | os.O_NONBLOCK)  # no device is ever opened
            os.close(sfd)
            sfd = readable
        if stat.S_ISDIR(st.st_mode):
            if not recursive:
                raise OSError(errno.EISDIR, "is a directory; copy it with recursive", src)
            with root.parent(dst) as (ddir, dname):
                check_into_itself(st, ddir, src, dst)
                if _lstat_at(ddir, dname, dst) is not None and not overwrite:
                    raise _err(errno.EEXIST, dst)
                _copy_dir(sfd, ddir, dname, st, dst, new_owner=new_owner)
            return
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "only files, directories and links are copied", src)
        if (dst_st := _stat_or_none(root, dst)) is not None and stat.S_ISDIR(dst_st.st_mode):
            raise _err(errno.EISDIR, dst)
        atomic = AtomicFile(
            root,
            dst,
            mode=stat.S_IMODE(st.st_mode),
            make_parents=False,
            exclusive=not overwrite,
            new_owner=new_owner,
        )
        try:
            with naming(src):
                copy_fd(sfd, atomic.fd)
        except BaseException:
            atomic.abort()
            raise
        atomic.commit()
    finally:
        os.close(sfd)


def _reopen(fd: int, flags: int) -> int:
    """A new descriptor of ``fd``'s object (``fd`` may be ``O_PATH``) opened with ``flags``: the
    same object, no name resolved again."""
    return os.open(f"/proc/self/fd/{fd}", flags | os.O_CLOEXEC | os.O_NOCTTY)


def _stat_or_none(root: Root, path: str) -> os.stat_result | None:
    try:
        return root.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _lstat_at(dirfd: int, name: str, path: str) -> os.stat_result | None:
    with naming(path):
        try:
            return os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        except FileNotFoundError:
            return None


def copy_at(
    sdir: int,
    sname: str,
    ddir: int,
    dname: str,
    *,
    src: str,
    dst: str,
    merge: bool,
    new_owner: tuple[int, int] | None,
) -> None:
    """Copy the object ``sname`` in ``sdir`` (not followed) to ``dname`` in ``ddir``."""
    with naming(src):
        st = os.stat(sname, dir_fd=sdir, follow_symlinks=False)
    if stat.S_ISDIR(st.st_mode):
        with naming(src):
            sfd = open_dir(sname, sdir)
        try:
            _copy_dir(sfd, ddir, dname, st, dst, new_owner=new_owner, merge=merge)
        finally:
            os.close(sfd)
    else:
        _copy_entry(sdir, sname, st, ddir, dname, dst=dst, new_owner=new_owner)


def _copy_dir(
    sfd: int,
    ddir: int,
    dname: str,
    st: os.stat_result,
    dst: str,
    *,
    new_owner: tuple[int, int] | None,
    merge: bool = True,
) -> None:
    """Copy the tree of readable directory ``sfd`` to ``dname`` in ``ddir``, descriptor by
    descriptor (existing directories are merged into, existing files replaced)."""
    with naming(dst):
        try:
            os.mkdir(dname, 0o700, dir_fd=ddir)
        except FileExistsError:
            if not merge:
                raise
        out = open_dir(dname, ddir)
        try:
            _copy_tree(sfd, out, dst, new_owner, MAX_DEPTH)
            _finish_dir(out, st, new_owner)
        finally:
            os.close(out)


def _copy_tree(sfd: int, dfd: int, dst: str, new_owner: tuple[int, int] | None, depth: int) -> None:
    """Copy the content of directory ``sfd`` into directory ``dfd`` (only the descriptors of
    the current branch are open: at most ``depth`` pairs)."""
    with os.scandir(sfd) as it:
        names = sorted(e.name for e in it)
    for name in names:
        try:
            st = os.stat(name, dir_fd=sfd, follow_symlinks=False)
        except FileNotFoundError:
            continue  # gone meanwhile
        if not stat.S_ISDIR(st.st_mode):
            _copy_entry(sfd, name, st, dfd, name, dst=dst, new_owner=new_owner)
            continue
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=dfd)
        try:
            s_child = open_dir(name, sfd)
        except OSError:
            continue  # swapped for a link or unreadable: not copied
        try:
            d_child = open_dir(name, dfd)
            try:
                if depth > 1:
                    _copy_tree(s_child, d_child, dst, new_owner, depth - 1)
                _finish_dir(d_child, st, new_owner)
            finally:
                os.close(d_child)
        finally:
            os.close(s_child)


def _finish_dir(fd: int, st: os.stat_result, new_owner: tuple[int, int] | None) -> None:
    _chown(lambda uid, gid: os.fchown(fd, uid, gid), st, new_owner)
    os.fchmod(fd, stat.S_IMODE(st.st_mode))


def _chown(
    change: Callable[[int, int], None], st: os.stat_result, new_owner: tuple[int, int] | None
) -> None:
    """Give a copy ``new_owner``, or with KEEP_OWNER the source's owner where we may."""
    if new_owner is None:
        return
    if new_owner == KEEP_OWNER:
        with contextlib.suppress(PermissionError):  # rootless: only our own ids are ours
            change(st.st_uid, st.st_gid)
        return
    change(*new_owner)


def _copy_entry(
    sdir: int,
    sname: str,
    st: os.stat_result,
    ddir: int,
    dname: str,
    *,
    dst: str,
    new_owner: tuple[int, int] | None,
) -> None:
    """Copy one non-directory: a link as a link, a regular file by content; others skipped."""
    with naming(dst):
        old = _lstat_at(ddir, dname, dst)
        if old is not None and not stat.S_ISDIR(old.st_mode):
            os.unlink(dname, dir_fd=ddir)
        if stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(sname, dir_fd=sdir), dname, dir_fd=ddir)
            _chown(
                lambda u, g: os.chown(dname, u, g, dir_fd=ddir, follow_symlinks=False),
                st,
                new_owner,
            )
            return
        if not stat.S_ISREG(st.st_mode):
            return  # FIFOs, sockets, devices: reading one could block or have side effects
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        src_fd = os.open(sname, flags, dir_fd=sdir)
        try:
            out_flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            out = os.open(dname, out_flags, 0o600, dir_fd=ddir)
            try:
                copy_fd(src_fd, out)
                _chown(lambda u, g: os.fchown(out, u, g), st, new_owner)
                os.fchmod(out, stat.S_IMODE(st.st_mode))
                os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
            finally:
                os.close(out)
        finally:
            os.close(src_fd)


def copy_fd(src: int, dst: int) -> None:
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


def contains(outer: os.stat_result, dirfd: int) -> bool:
    """Whether directory ``dirfd`` is ``outer`` or below it (climbing ``..``, bounded)."""
    fd = os.dup(dirfd)
    try:
        for _ in range(MAX_DEPTH * 8):
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == (outer.st_dev, outer.st_ino):
                return True
            up = os.open("..", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            top = os.fstat(up)
            os.close(fd)
            fd = up
            if (top.st_dev, top.st_ino) == (st.st_dev, st.st_ino):
                return False  # the top of this process's world
    finally:
        os.close(fd)
    return False


def check_into_itself(st: os.stat_result, ddir: int, src: str, dst: str) -> None:
    if stat.S_ISDIR(st.st_mode) and contains(st, ddir):
        raise OSError(errno.EINVAL, "cannot move or copy a directory into itself", src, None, dst)
