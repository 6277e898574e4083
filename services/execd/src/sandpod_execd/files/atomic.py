"""Atomic file replacement: write a temporary file next to the target, fsync, rename over it.

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

__all__ = ["DEFAULT_MODE", "AtomicFile", "makedirs", "rename_noreplace"]

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


def makedirs(directory: str) -> None:
    """``mkdir -p directory``; a file in the way is ENOTDIR (as the kernel says one level down)."""
    try:
        os.makedirs(directory, exist_ok=True)
    except FileExistsError:
        # Something that is not a directory is in the way; stat says what (ELOOP for a loop).
        if not stat.S_ISDIR(os.stat(directory).st_mode):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), directory) from None


def rename_noreplace(src: str, dst: str) -> None:
    """Rename ``src`` to ``dst`` unless ``dst`` exists, atomically where the kernel can.

    Raises:
        FileExistsError: ``dst`` exists.
        OSError: as ``os.rename``.
    """
    fn = _renameat2()
    if fn is not None:
        rc = fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE)
        if rc == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS):  # not supported here: fall back below
            raise OSError(err, os.strerror(err), src, None, dst)
    if os.path.lexists(dst):  # a small race remains on filesystems without RENAME_NOREPLACE
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)
    os.rename(src, dst)


class AtomicFile:
    """A write in progress to ``target``: :meth:`write` chunks, then :meth:`commit` or
    :meth:`abort`. Blocking; raises ``OSError`` (the caller maps it)."""

    def __init__(
        self,
        target: str,
        *,
        mode: int | None = None,
        owner: tuple[int, int] | None = None,
        make_parents: bool = True,
        exclusive: bool = False,
        new_owner: tuple[int, int] | None = None,
    ) -> None:
        if os.path.islink(target):
            target = os.path.realpath(target)  # write through the link, keep the link
        self.target = target
        self.exclusive = exclusive
        directory = os.path.dirname(target) or "."
        if make_parents:
            makedirs(directory)
        existing = _stat_or_none(target)
        if existing is not None:
            if stat.S_ISDIR(existing.st_mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), target)
            if exclusive:
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), target)
        self.mode = mode if mode is not None else (
            stat.S_IMODE(existing.st_mode) if existing is not None else DEFAULT_MODE
        )  # fmt: skip
        # An explicit owner must be applied; an existing file's is kept when execd may (root);
        # a new file gets ``new_owner`` (the sandbox's user when execd works for a jail).
        self._owner_required = owner is not None
        self.owner = owner
        if owner is None:
            self.owner = (existing.st_uid, existing.st_gid) if existing is not None else new_owner
        self.tmp = os.path.join(directory, f".sandpod-{secrets.token_hex(8)}.tmp")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
        self.fd = os.open(self.tmp, flags, 0o600)
        self.size = 0

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
            self.size += n

    def commit(self) -> str:
        """fsync, apply mode and owner, rename into place; returns the target path."""
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
            if self.exclusive:
                rename_noreplace(self.tmp, self.target)
            else:
                os.replace(self.tmp, self.target)
        except BaseException:
            self.abort()
            raise
        return self.target

    def abort(self) -> None:
        """Drop the temporary file (idempotent, never raises)."""
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)


def _stat_or_none(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
