"""The unpacker behind ``layers.unpack_layer``: tar entries -> files under one directory fd.

Every path is walked from the layer root's directory fd one component at a time with
``O_NOFOLLOW | O_DIRECTORY`` (``_Dirs``), never as a joined string, so no entry can reach outside
the layer whatever the names and symlinks before it did: a ``..`` or absolute name is refused up
front, and a walk that meets a symlink or a non-directory is refused (the symlink-then-write
trick). Hard links may only point at non-directory entries this layer wrote earlier. Directory
modes and mtimes are applied at the end (children change a directory's mtime, and a read-only
directory would stop its own children being written in rootless mode).

Whiteouts become what overlayfs reads: ``.wh.<name>`` -> a 0/0 character device ``<name>``,
``.wh..wh..opq`` -> the ``<ns>.overlay.opaque=y`` xattr on the directory (``trusted`` as root,
``user`` rootless, which the mount reads with ``-o userxattr``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from sandpod_image._errors import ImageLayerRefused
from sandpod_image._streams import Readable
from sandpod_image._tar import DIRECTORY, HARDLINK, REGULAR, SYMLINK, Entry, Reader

__all__ = ["Extractor", "Totals"]

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_WHITEOUT: Final = ".wh."
_OPAQUE: Final = ".wh..wh..opq"
_MAX_PATH: Final = 4096
_MAX_NAME: Final = 255
_FD_CACHE: Final = 256
# xattrs a layer may set on its files as root; rootless, only user.* (overlay's own excepted).
_ROOT_XATTRS: Final = ("security.capability", "system.posix_acl_access", "system.posix_acl_default")

Parts = tuple[str, ...]


def _refuse(reason: str, entry: str, message: str) -> ImageLayerRefused:
    return ImageLayerRefused(f"layer entry {entry!r}: {message}", reason=reason, entry=entry)


def split_name(name: str) -> Parts:
    """The components of a tar entry name, refusing absolute names, ``..`` and over-long ones."""
    if name.startswith("/"):
        raise _refuse("path_escape", name, "absolute name")
    parts = tuple(p for p in name.split("/") if p and p != ".")
    if ".." in parts:
        raise _refuse("path_escape", name, "'..' in the name")
    if len(name) > _MAX_PATH or any(len(os.fsencode(p)) > _MAX_NAME for p in parts):
        raise _refuse("name_too_long", name, "name too long")
    return parts


class _Dirs:
    """Directory fds under the root, by components, each opened relative to its parent's fd."""

    def __init__(self, root_fd: int) -> None:
        self.root = root_fd
        self._open: dict[Parts, int] = {}

    def lookup(self, parts: Parts, entry: str, *, create: bool) -> int:
        """The fd of directory ``parts``, valid until ``trim``/``forget`` (never during one
        entry: an entry may hold two, e.g. a hard link's source and destination parents)."""
        return self._walk(parts, entry, create)

    def trim(self) -> None:
        """Bound the open fds; called between entries only."""
        if len(self._open) >= _FD_CACHE:
            self.forget()

    def _walk(self, parts: Parts, entry: str, create: bool) -> int:
        if not parts:
            return self.root
        fd = self._open.get(parts)
        if fd is not None:
            return fd
        parent = self._walk(parts[:-1], entry, create)
        try:
            fd = self._open_dir(parts[-1], parent, create)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise _refuse("path_escape", entry, "goes through a symlink or a file") from exc
            raise
        self._open[parts] = fd
        return fd

    @staticmethod
    def _open_dir(name: str, parent: int, create: bool) -> int:
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise
        # A parent the layer never listed (tar -x makes these too): a plain 0755 directory.
        os.mkdir(name, 0o755, dir_fd=parent)
        return os.open(name, _DIR_FLAGS, dir_fd=parent)

    def forget(self) -> None:
        """Close every cached fd: after a directory is removed they may name stale inodes."""
        for fd in self._open.values():
            os.close(fd)
        self._open.clear()


@dataclass(slots=True)
class Totals:
    entries: int = 0
    bytes: int = 0
    skipped: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _DirAttrs:
    mode: int
    mtime_ns: int


class Extractor:
    """One layer's extraction into ``dest``; use as a context manager (it owns fds)."""

    def __init__(self, dest: Path, *, rootless: bool, max_entry_bytes: int) -> None:
        self.rootless = rootless
        self.xattr_namespace = "user" if rootless else "trusted"
        self._max_entry = max_entry_bytes
        self._dirs = _Dirs(os.open(dest, _DIR_FLAGS & ~os.O_NOFOLLOW))
        self._seen: set[Parts] = set()  # every path this layer created (whiteouts spare them)
        self._files: set[Parts] = set()  # non-directories: the only valid hard link targets
        self._dir_attrs: dict[Parts, _DirAttrs] = {}
        self.totals = Totals()

    def __enter__(self) -> Extractor:
        return self

    def __exit__(self, *exc: object) -> None:
        self._dirs.forget()
        os.close(self._dirs.root)

    def run(self, stream: Readable) -> None:
        """Extract every entry of the tar ``stream``.

        Raises:
            ImageLayerRefused: a hostile or corrupt entry (nothing outside ``dest`` was touched).
        """
        reader = Reader(stream)
        for info in reader.entries():
            self.totals.entries += 1
            self._entry(reader, info)
        self._finish_dirs()

    def _entry(self, reader: Reader, info: Entry) -> None:
        self._dirs.trim()
        parts = split_name(info.name)
        base = parts[-1] if parts else ""
        if base.startswith(_WHITEOUT):
            self._whiteout(parts, info.name)
        elif info.kind == DIRECTORY:
            self._dir(parts, info)
        elif not parts:
            raise _refuse("path_escape", info.name, "a non-directory at the layer root")
        elif info.kind in REGULAR and not info.sparse:
            self._file(reader, parts, info)
        elif info.kind == SYMLINK:
            self._symlink(parts, info)
        elif info.kind == HARDLINK:
            self._hardlink(parts, info)
        else:  # devices, fifos, sparse files: nothing a rootfs layer needs or may carry safely
            self.totals.skipped.append(info.name)

    # -- entry kinds ---------------------------------------------------------------------------

    def _whiteout(self, parts: Parts, entry: str) -> None:
        parent = self._dirs.lookup(parts[:-1], entry, create=True)
        if parts[-1] == _OPAQUE:
            os.setxattr(parent, f"{self.xattr_namespace}.overlay.opaque", b"y")
            return
        if parts[-1].startswith(_WHITEOUT + _WHITEOUT):
            self.totals.skipped.append(entry)  # aufs metadata (.wh..wh.plnk...): not for overlay
            return
        target = parts[-1][len(_WHITEOUT) :]
        if target in ("", ".", ".."):
            raise _refuse("path_escape", entry, "whiteout of no name")
        if (*parts[:-1], target) in self._seen:
            return  # OCI: a whiteout hides lower layers only, never its own layer's entries
        with contextlib.suppress(FileExistsError):
            os.mknod(target, stat.S_IFCHR, os.makedev(0, 0), dir_fd=parent)

    def _dir(self, parts: Parts, info: Entry) -> None:
        if parts:
            parent = self._dirs.lookup(parts[:-1], info.name, create=True)
            try:
                os.mkdir(parts[-1], 0o700, dir_fd=parent)
            except FileExistsError:
                st = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode):
                    self._remove(parent, parts)
                    parent = self._dirs.lookup(parts[:-1], info.name, create=True)
                    os.mkdir(parts[-1], 0o700, dir_fd=parent)
            self._seen.add(parts)
        fd = self._dirs.lookup(parts, info.name, create=False)
        self._own(fd, info)
        self._dir_attrs[parts] = _DirAttrs(info.mode & 0o7777, info.mtime_ns)

    def _file(self, reader: Reader, parts: Parts, info: Entry) -> None:
        if info.size > self._max_entry:
            raise _refuse("too_large", info.name, f"{info.size} bytes is over the entry limit")
        parent = self._dirs.lookup(parts[:-1], info.name, create=True)
        fd = self._create(parent, parts, info.name)
        try:
            reader.copy_to(fd, info.size)
            self._own(fd, info)
            os.fchmod(fd, info.mode & 0o7777)  # after chown, which clears setuid/setgid
            ns = info.mtime_ns
            os.utime(fd, ns=(ns, ns))
        finally:
            os.close(fd)
        self.totals.bytes += info.size
        self._created(parts)

    def _symlink(self, parts: Parts, info: Entry) -> None:
        parent = self._dirs.lookup(parts[:-1], info.name, create=True)
        try:
            os.symlink(info.linkname, parts[-1], dir_fd=parent)
        except FileExistsError:
            self._remove(parent, parts)
            parent = self._dirs.lookup(parts[:-1], info.name, create=True)
            os.symlink(info.linkname, parts[-1], dir_fd=parent)
        if not self.rootless:
            os.chown(parts[-1], info.uid, info.gid, dir_fd=parent, follow_symlinks=False)
        ns = info.mtime_ns
        os.utime(parts[-1], ns=(ns, ns), dir_fd=parent, follow_symlinks=False)
        self._created(parts)

    def _hardlink(self, parts: Parts, info: Entry) -> None:
        source = split_name(info.linkname)
        if source == parts:
            return  # a link to itself: the file is already there
        if source not in self._files:
            raise _refuse("link_escape", info.name, "hard link to no earlier file of this layer")
        src_parent = self._dirs.lookup(source[:-1], info.name, create=False)
        parent = self._dirs.lookup(parts[:-1], info.name, create=True)
        for attempt in (0, 1):
            try:
                os.link(
                    source[-1],
                    parts[-1],
                    src_dir_fd=src_parent,
                    dst_dir_fd=parent,
                    follow_symlinks=False,
                )
                break
            except FileExistsError:
                if attempt:
                    raise
                self._remove(parent, parts)
                src_parent = self._dirs.lookup(source[:-1], info.name, create=False)
                parent = self._dirs.lookup(parts[:-1], info.name, create=True)
        self._created(parts)

    # -- helpers -------------------------------------------------------------------------------

    def _created(self, parts: Parts) -> None:
        self._seen.add(parts)
        self._files.add(parts)

    def _create(self, parent: int, parts: Parts, entry: str) -> int:
        try:
            return os.open(parts[-1], _FILE_FLAGS, 0o600, dir_fd=parent)
        except FileExistsError:
            pass
        # Later entries win (as in Docker); the old one goes first, never written through.
        self._remove(parent, parts)
        parent = self._dirs.lookup(parts[:-1], entry, create=True)
        return os.open(parts[-1], _FILE_FLAGS, 0o600, dir_fd=parent)

    def _remove(self, parent: int, parts: Parts) -> None:
        st = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(parts[-1], dir_fd=parent)
            self._files.discard(parts)
            return
        shutil.rmtree(parts[-1], dir_fd=parent)
        self._dirs.forget()
        depth = len(parts)
        for gone in [p for p in self._seen if p[:depth] == parts]:
            self._seen.discard(gone)
            self._files.discard(gone)
            self._dir_attrs.pop(gone, None)

    def _own(self, fd: int, info: Entry) -> None:
        if not self.rootless:
            os.fchown(fd, info.uid, info.gid)
        for name, value in info.xattrs.items():
            if not self._xattr_allowed(name):
                continue
            try:
                os.setxattr(fd, name, value)
            except OSError as exc:
                if exc.errno not in (errno.ENOTSUP, errno.EPERM, errno.EINVAL):
                    raise
                self.totals.skipped.append(f"{info.name}#xattr={name}")

    def _xattr_allowed(self, name: str) -> bool:
        if name.startswith("user."):
            return not name.startswith("user.overlay.")  # only the unpacker marks overlay state
        return not self.rootless and name in _ROOT_XATTRS

    def _finish_dirs(self) -> None:
        # Deepest first, so setting a parent read-only never blocks a child's update.
        for parts in sorted(self._dir_attrs, key=len, reverse=True):
            attrs = self._dir_attrs[parts]
            try:
                fd = self._dirs.lookup(parts, "/".join(parts), create=False)
            except (ImageLayerRefused, FileNotFoundError):
                continue  # replaced by a later non-directory entry: nothing to apply
            os.fchmod(fd, attrs.mode)
            os.utime(fd, ns=(attrs.mtime_ns, attrs.mtime_ns))
