"""The packer behind ``layers.pack_layer``: a directory tree -> an OCI layer tar stream.

The walk is sorted by the names' bytes and writes owner ids but no owner names, so one tree
always gives one tar (and, with ``mtime`` set, one digest). Overlay state is translated into the
OCI form: a 0/0 character device is a whiteout (``.wh.<name>``), a directory whose
``trusted.overlay.opaque`` or ``user.overlay.opaque`` is ``y`` gets ``.wh..wh..opq``. Files with
several links are written once and then as hard links to that first name.
"""

from __future__ import annotations

import os
import stat
import tarfile
from pathlib import Path
from typing import IO, Final, cast

from sandpod_image._streams import CHUNK, Writable

__all__ = ["write_tar"]

_OPAQUE_XATTRS: Final = ("trusted.overlay.opaque", "user.overlay.opaque")
# What a layer carries of a file's xattrs: the unpacker's allow-list (overlay's own never).
_KEPT_XATTRS: Final = ("security.capability", "system.posix_acl_access", "system.posix_acl_default")


class _Packer:
    def __init__(
        self, tar: tarfile.TarFile, mtime: int | None, owner: tuple[int, int] | None
    ) -> None:
        self._tar = tar
        self._mtime = mtime
        self._owner = owner
        self._inodes: dict[tuple[int, int], str] = {}

    def tree(self, dir_path: Path, prefix: str) -> None:
        names = sorted(os.listdir(dir_path), key=os.fsencode)
        for name in names:
            self._one(dir_path / name, prefix + name)

    def _one(self, path: Path, arcname: str) -> None:
        st = os.lstat(path)
        mode = st.st_mode
        if stat.S_ISCHR(mode) and st.st_rdev == 0:
            parent, _, base = arcname.rpartition("/")
            self._marker(f"{parent}/.wh.{base}" if parent else f".wh.{base}", st)
            return
        info = self._info(arcname, st)
        if stat.S_ISDIR(mode):
            info.type = tarfile.DIRTYPE
            self._xattrs(info, path)
            self._tar.addfile(info)
            if _is_opaque(path):
                self._marker(f"{arcname}/.wh..wh..opq", st)
            self.tree(path, arcname + "/")
        elif stat.S_ISREG(mode):
            self._file(path, info, st)
        elif stat.S_ISLNK(mode):
            info.type = tarfile.SYMTYPE
            info.linkname = os.readlink(path)
            self._tar.addfile(info)
        elif stat.S_ISFIFO(mode):
            info.type = tarfile.FIFOTYPE
            self._tar.addfile(info)
        elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            info.type = tarfile.CHRTYPE if stat.S_ISCHR(mode) else tarfile.BLKTYPE
            info.devmajor, info.devminor = os.major(st.st_rdev), os.minor(st.st_rdev)
            self._tar.addfile(info)
        # sockets have no tar form: a layer cannot carry them

    def _file(self, path: Path, info: tarfile.TarInfo, st: os.stat_result) -> None:
        key = (st.st_dev, st.st_ino)
        if st.st_nlink > 1:
            first = self._inodes.get(key)
            if first is not None:
                info.type = tarfile.LNKTYPE
                info.linkname = first
                self._tar.addfile(info)
                return
            self._inodes[key] = info.name
        info.type = tarfile.REGTYPE
        info.size = st.st_size
        self._xattrs(info, path)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb", buffering=0) as body:
            self._tar.addfile(info, body)

    def _info(self, arcname: str, st: os.stat_result) -> tarfile.TarInfo:
        info = tarfile.TarInfo(arcname)
        info.mode = stat.S_IMODE(st.st_mode)
        info.uid, info.gid = self._owner if self._owner is not None else (st.st_uid, st.st_gid)
        info.uname = info.gname = ""
        info.mtime = self._mtime if self._mtime is not None else st.st_mtime_ns // 1_000_000_000
        return info

    def _marker(self, arcname: str, st: os.stat_result) -> None:
        info = self._info(arcname, st)
        info.mode = 0o644 if info.name.endswith(".wh..wh..opq") else 0
        self._tar.addfile(info)

    @staticmethod
    def _xattrs(info: tarfile.TarInfo, path: Path) -> None:
        try:
            names = os.listxattr(path, follow_symlinks=False)
        except OSError:
            return  # a filesystem without xattrs: nothing to carry
        headers = dict(info.pax_headers)
        for name in sorted(names):
            if (name.startswith("user.") and not name.startswith("user.overlay.")) or (
                name in _KEPT_XATTRS
            ):
                value = os.getxattr(path, name, follow_symlinks=False)
                headers["SCHILY.xattr." + name] = value.decode("utf-8", "surrogateescape")
        info.pax_headers = headers


def _is_opaque(path: Path) -> bool:
    for name in _OPAQUE_XATTRS:
        try:
            if os.getxattr(path, name, follow_symlinks=False) == b"y":
                return True
        except OSError:
            continue
    return False


def write_tar(
    src: Path, out: Writable, *, mtime: int | None, owner: tuple[int, int] | None
) -> None:
    """Write ``src``'s tree (not its root entry) to ``out`` as a PAX tar stream."""
    with tarfile.open(
        fileobj=cast(IO[bytes], out),  # stream mode ("w|") only calls .write()
        mode="w|",
        format=tarfile.PAX_FORMAT,
        bufsize=CHUNK,
        encoding="utf-8",
        errors="surrogateescape",
    ) as tar:
        _Packer(tar, mtime, owner).tree(src, "")
