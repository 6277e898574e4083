"""A session's private directory for command files, touched by execd only through a dir fd.

The shell reads each command's text and stdin from here and writes its stdout and stderr here,
so in the local runtime the directory lives *inside* the sandbox (its ``/tmp``) and belongs to
the sandbox's user. execd runs as root there, so it never follows a path the sandbox could have
swapped for a symlink: its parent (the sandbox's ``/tmp``) is opened through the sandbox's
:class:`~sandpod_execd.files.rooted.Root` (``openat2`` with ``RESOLVE_IN_ROOT``: a ``/tmp`` that
is a link leads where it leads inside the sandbox, never to the host), the directory is created
in that descriptor and opened once (``O_NOFOLLOW``), then every
file is created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and read with ``O_NOFOLLOW`` relative to
that descriptor. Renaming the directory or planting links in it cannot make execd write or read
anything else.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import secrets
import shutil
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandpod_execd.files.rooted import Root

__all__ = ["SessionDir"]

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class SessionDir:
    """A fresh directory in ``parent`` (a directory as the shell sees it, resolved in ``root``);
    ``owner`` (uid, gid) gets the directory and the files execd writes.

    Raises:
        OSError: ``parent`` is not a directory in ``root``.
        FsError: a jailed ``root`` cannot be resolved safely (no ``openat2``).
    """

    def __init__(self, root: Root, parent: str, owner: tuple[int, int] | None) -> None:
        self._owner = owner
        self._parent = root.open(parent, DIR_FLAGS)
        try:
            self.name = self._make()
            self.fd = os.open(self.name, DIR_FLAGS | os.O_NOFOLLOW, dir_fd=self._parent)
            if owner is not None:
                os.fchown(self.fd, *owner)
        except BaseException:
            os.close(self._parent)
            raise
        self.inside = posixpath.join(parent, self.name)

    def _make(self) -> str:
        while True:
            name = f"sandpod-session-{secrets.token_hex(8)}"
            try:
                os.mkdir(name, 0o700, dir_fd=self._parent)
            except FileExistsError:
                continue
            return name

    def path(self, name: str) -> str:
        """Where the shell finds ``name``."""
        return posixpath.join(self.inside, name)

    def write(self, name: str, data: bytes) -> None:
        """Create ``name`` with ``data``; whatever the sandbox planted under that name (a link,
        a file) is unlinked first, never followed."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        for _ in range(8):  # a planted entry that keeps coming back ends in FileExistsError
            self.unlink(name)
            try:
                fd = os.open(name, flags, 0o600, dir_fd=self.fd)
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(f"cannot create {name} in the session directory")
        try:
            if self._owner is not None:
                os.fchown(fd, *self._owner)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)

    def size(self, name: str) -> int:
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_size
        except OSError:
            return 0

    def read(self, name: str, offset: int, size: int) -> bytes:
        if size <= 0:
            return b""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
        except OSError:
            return b""
        try:
            return os.pread(fd, size, offset)
        finally:
            os.close(fd)

    def unlink(self, *names: str) -> None:
        for name in names:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=self.fd)

    def remove(self) -> None:
        """Delete the directory and everything in it; idempotent."""
        if self.fd < 0:
            return
        shutil.rmtree(self.name, ignore_errors=True, dir_fd=self._parent)
        os.close(self.fd)
        os.close(self._parent)
        self.fd = -1
