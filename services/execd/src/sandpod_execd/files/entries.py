"""What a path is: :class:`Entry` from ``lstat``/``stat``, owner names, and owner resolution.

User and group names come from the host's databases through ``pwd``/``grp`` (NSS), cached in a
small LRU because a listing asks for the same few ids thousands of times.
"""

from __future__ import annotations

import dataclasses
import functools
import grp
import os
import pwd
import stat
from typing import Literal

from sandpod_contract.errors import BadRequest
from sandpod_execd.files.rooted import Root

__all__ = [
    "Entry",
    "EntryType",
    "entry_at",
    "entry_of",
    "entry_type",
    "group_name",
    "make_entry",
    "owner_ids",
    "user_name",
]

EntryType = Literal["file", "dir", "symlink", "other"]


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """One file system object (its path in the sandbox's root; the handlers map it for display)."""

    name: str
    path: str
    type: EntryType
    size: int
    mode: int  # st_mode & 0o7777
    permissions: str  # stat.filemode, e.g. "drwxr-xr-x"
    uid: int
    gid: int
    mtime: float
    target: str | None = None  # symlink target as stored


def entry_type(mode: int) -> EntryType:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def entry_of(root: Root, path: str, *, follow: bool = False) -> Entry:
    """Describe ``path`` in ``root`` (``lstat`` unless ``follow``). Raises ``OSError``."""
    st = root.stat(path, follow=follow)
    target = root.readlink(path) if stat.S_ISLNK(st.st_mode) else None
    return make_entry(path, st, target)


def entry_at(dirfd: int, name: str, path: str, st: os.stat_result) -> Entry:
    """Describe ``name`` in directory ``dirfd`` (a walk's child, shown as ``path``)."""
    target = os.readlink(name, dir_fd=dirfd) if stat.S_ISLNK(st.st_mode) else None
    return make_entry(path, st, target)


def make_entry(path: str, st: os.stat_result, target: str | None) -> Entry:
    kind = entry_type(st.st_mode)
    return Entry(
        name=os.path.basename(path.rstrip("/")) or "/",
        path=path,
        type=kind,
        size=st.st_size,
        mode=stat.S_IMODE(st.st_mode),
        permissions=stat.filemode(st.st_mode),
        uid=st.st_uid,
        gid=st.st_gid,
        mtime=st.st_mtime,
        target=target,
    )


@functools.lru_cache(maxsize=256)
def user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


@functools.lru_cache(maxsize=256)
def group_name(gid: int) -> str | None:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return None


def owner_ids(
    uid: int | None, gid: int | None, user: str | None, group: str | None
) -> tuple[int, int]:
    """``(uid, gid)`` for ``os.chown``; -1 leaves that one unchanged.

    Raises:
        BadRequest: a user or group name the sandbox does not know.
    """
    if user is not None:
        try:
            uid = pwd.getpwnam(user).pw_uid
        except KeyError:
            raise BadRequest(f"no user named {user!r} in the sandbox", user=user) from None
    if group is not None:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise BadRequest(f"no group named {group!r} in the sandbox", group=group) from None
    return (-1 if uid is None else uid), (-1 if gid is None else gid)
