"""Atomic file replacement: write a temporary file next to the target, fsync, rename over it.

The target is a path in a sandbox's :class:`~.rooted.Root`; its directory is resolved there
once and used as a descriptor from then on.

A reader of the target sees the old content or the new, never a mix, and a crash leaves at worst
a stray ``.sandpod-*.tmp`` file. The temporary file is created in the target's directory (a
rename cannot cross filesystems) with a short name (the target's name may already be 255 bytes).
A target that is a symlink is written through: the link's final target is replaced and the link
stays. Without an explicit mode or owner an existing file keeps its own, so rewriting a script
does not lose its ``+x``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
import stat
from collections.abc import Callable

from sandpod_execd.files.rooted import Root, naming, split

__all__ = ["DEFAULT_MODE", "AtomicFile", "rename_noreplace"]

DEFAULT_MODE = 0o644
_RENAME_NOREPLACE = 1
_AT_FDCWD = -100
_libc: ctypes.CDLL | None = None


def _renameat2() -> Callable[..., int] | None:
    global _libc  # noqa: PLW0603 - loaded once, on first use
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    fn: Callable[..., int] | None = getattr(_libc, "renameat2", None)
    return fn


def _renameat2_call(src_dir: int, src: str, dst_dir: int, dst: str, flags: int) -> int:
    fn = _renameat2()
    if fn is None:
        return -1
    rc = fn(src_dir, os.fsencode(src), dst_dir, os.fsencode(dst), flags)
    return 0 if rc == 0 else ctypes.get_errno()


def rename_noreplace(
    src: str, dst: str, *, src_dir: int = _AT_FDCWD, dst_dir: int = _AT_FDCWD
) -> None:
    """Rename ``src`` to ``dst`` (each relative to its directory descriptor, if given) unless
    ``dst`` exists, atomically where the kernel can.

    Raises:
        FileExistsError: ``dst`` exists.
        OSError: as ``os.rename``.
    """
    err = _renameat2_call(src_dir, src, dst_dir, dst, _RENAME_NOREPLACE)
    if err == 0:
        return
    if err not in (-1, errno.EINVAL, errno.ENOSYS):  # -1, EINVAL, ENOSYS: fall back below
        raise OSError(err, os.strerror(err), src, None, dst)
    try:  # a small race remains on filesystems without RENAME_NOREPLACE
        os.stat(dst, dir_fd=_fd(dst_dir), follow_symlinks=False)
    except FileNotFoundError:
        os.rename(src, dst, src_dir_fd=_fd(src_dir), dst_dir_fd=_fd(dst_dir))
        return
    raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)


def _fd(dirfd: int) -> int | None:
    return None if dirfd == _AT_FDCWD else dirfd


class AtomicFile:
    """A write in progress to ``path`` in ``root``: :meth:`write` chunks, then :meth:`commit`
    or :meth:`abort`. Blocking; raises ``OSError`` naming the path (the caller maps it).

    The target's directory is resolved once, in the root, and held as a descriptor: the
    temporary file is created in it with ``O_NOFOLLOW`` and renamed over the target's name in
    it, so swapping a directory of the path for a link meanwhile cannot redirect the write.
    """

    def __init__(
        self,
        root: Root,
        path: str,
        *,
        mode: int | None = None,
        owner: tuple[int, int] | None = None,
        make_parents: bool = True,
        exclusive: bool = False,
        new_owner: tuple[int, int] | None = None,
        at: tuple[int, str] | None = None,
    ) -> None:
        """``at``: the target's directory descriptor (borrowed, duplicated) and name, when the
        caller holds them already (a tree walk); ``path`` then only names it in errors."""
        if at is None:
            path = root.follow_last(path)  # write through a link, keep the link
            directory, name = split(path)
            if make_parents:
                root.makedirs(directory, owner=new_owner)  # the sandbox's, like the file
            dirfd = root.open(directory, os.O_PATH | os.O_DIRECTORY)
        else:
            dirfd, name = os.dup(at[0]), at[1]
        self.root = root
        self.target = path
        self.dirfd, self.name = dirfd, name
        self.exclusive = exclusive
        self.fd = -1
        self.tmp = f".sandpod-{secrets.token_hex(8)}.tmp"
        try:
            with naming(path):
                self._open(mode, owner, new_owner)
        except BaseException:
            os.close(self.dirfd)
            self.dirfd = -1
            raise
        self.size = 0

    def _open(
        self, mode: int | None, owner: tuple[int, int] | None, new_owner: tuple[int, int] | None
    ) -> None:
        existing = _lstat_or_none(self.name, self.dirfd)
        if existing is not None:
            if stat.S_ISDIR(existing.st_mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), self.target)
            if self.exclusive:
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), self.target)
            if stat.S_ISLNK(existing.st_mode):
                existing = None  # a link appeared after we followed it: replaced, not copied
        self.mode = (
            mode
            if mode is not None
            else (stat.S_IMODE(existing.st_mode) if existing is not None else DEFAULT_MODE)
        )
        # An explicit owner must be applied; an existing file's is kept when execd may (root);
        # a new file gets ``new_owner`` (the sandbox's user when execd works for a jail).
        self._owner_required = owner is not None
        self.owner = owner
        if owner is None:
            self.owner = (existing.st_uid, existing.st_gid) if existing is not None else new_owner
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
        self.fd = os.open(self.tmp, flags, 0o600, dir_fd=self.dirfd)

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
            self.size += n

    def commit(self) -> str:
        """fsync, apply mode and owner, rename into place; returns the target path. With the
        sandbox user's rights (its root's identity), like the rest of the upload."""
        with self.root.acting():
            return self._commit()

    def _commit(self) -> str:
        try:
            os.fchmod(self.fd, self.mode)
            if self.owner is not None and self.owner != (-1, -1):
                try:
                    os.fchown(self.fd, *self.owner)
                except PermissionError:
                    if self._owner_required:
                        raise
            os.fsync(self.fd)
        except BaseException:
            self.abort()
            raise
        os.close(self.fd)
        self.fd = -1
        try:
            with naming(self.target):
                if self.exclusive:
                    rename_noreplace(self.tmp, self.name, src_dir=self.dirfd, dst_dir=self.dirfd)
                else:
                    os.replace(self.tmp, self.name, src_dir_fd=self.dirfd, dst_dir_fd=self.dirfd)
        except BaseException:
            self.abort()
            raise
        os.close(self.dirfd)
        self.dirfd = -1
        return self.target

    def abort(self) -> None:
        """Drop the temporary file (idempotent, never raises)."""
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
        if self.dirfd >= 0:
            with contextlib.suppress(OSError), self.root.acting():
                os.unlink(self.tmp, dir_fd=self.dirfd)
            with contextlib.suppress(OSError):
                os.close(self.dirfd)
            self.dirfd = -1


def _lstat_or_none(name: str, dirfd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        return None
