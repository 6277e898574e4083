"""Linux inotify through ctypes: an fd for the event loop and a parser for what it reads.

Why not a library: execd must stay dependency-light (contract, nats-py, msgpack, logging and
metrics only), the kernel API is three calls and one struct that have not changed since 2.6.13,
and the usual libraries (watchdog and friends) bring threads and polling fallbacks that we do not
want in a daemon that already has an event loop. The fd is non-blocking and close-on-exec, so the
loop watches it with ``add_reader`` and no thread ever blocks on it; commands execd spawns never
inherit it.

Data flow: :func:`add_watch` registers a path and returns a watch descriptor (wd); the kernel
queues ``struct inotify_event`` records on the fd; :func:`read_events` drains what is there and
:func:`parse` turns the bytes into :class:`RawEvent` s (wd, mask, cookie, name).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import errno
import os
import struct

__all__ = [
    "ALL_EVENTS",
    "IN_ATTRIB",
    "IN_CREATE",
    "IN_DELETE",
    "IN_DELETE_SELF",
    "IN_IGNORED",
    "IN_ISDIR",
    "IN_MODIFY",
    "IN_MOVED_FROM",
    "IN_MOVED_TO",
    "IN_MOVE_SELF",
    "IN_Q_OVERFLOW",
    "RawEvent",
    "add_watch",
    "init",
    "parse",
    "read_events",
    "rm_watch",
]

# <sys/inotify.h>
IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

# What a watch asks for: every change a client can see; not IN_ACCESS/IN_OPEN/IN_CLOSE_* (noise).
ALL_EVENTS = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_DONT_FOLLOW
    | IN_EXCL_UNLINK
)

_HEADER = struct.Struct("iIII")  # int wd; uint32 mask, cookie, len; then char name[len]
READ_SIZE = 64 * 1024  # holds >= 16 events even with NAME_MAX names

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.inotify_init1.argtypes = [ctypes.c_int]
_libc.inotify_init1.restype = ctypes.c_int
_libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
_libc.inotify_add_watch.restype = ctypes.c_int
_libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.inotify_rm_watch.restype = ctypes.c_int


@dataclasses.dataclass(frozen=True, slots=True)
class RawEvent:
    wd: int  # -1 for IN_Q_OVERFLOW
    mask: int
    cookie: int  # pairs IN_MOVED_FROM with its IN_MOVED_TO
    name: bytes  # entry name inside the watched directory; b"" for events on the watched path


def _raise(what: str, path: str | None = None) -> None:
    code = ctypes.get_errno()
    raise OSError(code, f"{what}: {os.strerror(code)}", path)


def init() -> int:
    """A new non-blocking, close-on-exec inotify fd.

    Raises:
        OSError: EMFILE when the per-user instance limit (fs.inotify.max_user_instances) is hit.
    """
    fd = int(_libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC))
    if fd < 0:
        _raise("inotify_init1")
    return fd


def add_watch(fd: int, path: str, mask: int = ALL_EVENTS) -> int:
    """Watch ``path`` (not following a final symlink); returns its watch descriptor.

    Raises:
        OSError: ENOSPC when fs.inotify.max_user_watches is reached, ENOENT, EACCES, ENOTDIR...
    """
    wd = int(_libc.inotify_add_watch(fd, os.fsencode(path), mask))
    if wd < 0:
        _raise("inotify_add_watch", path)
    return wd


def rm_watch(fd: int, wd: int) -> None:
    """Stop watching ``wd``; a wd the kernel already dropped (EINVAL) is not an error."""
    if _libc.inotify_rm_watch(fd, wd) < 0 and ctypes.get_errno() != errno.EINVAL:
        _raise("inotify_rm_watch")


def read_events(fd: int, limit: int = 64) -> list[RawEvent]:
    """Drain up to ``limit`` reads of what the kernel queued (never blocks)."""
    out: list[RawEvent] = []
    for _ in range(limit):
        try:
            data = os.read(fd, READ_SIZE)
        except BlockingIOError:
            break
        if not data:
            break
        out.extend(parse(data))
    return out


def parse(data: bytes) -> list[RawEvent]:
    """Split a read of the inotify fd into events (names lose their NUL padding)."""
    out = []
    offset = 0
    while offset + _HEADER.size <= len(data):
        wd, mask, cookie, length = _HEADER.unpack_from(data, offset)
        start = offset + _HEADER.size
        name = data[start : start + length].rstrip(b"\0")
        out.append(RawEvent(wd, mask, cookie, name))
        offset = start + length
    return out
