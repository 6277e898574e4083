"""``openat2(2)``, which Python does not wrap: resolving a path inside a directory as if it were
the root (``RESOLVE_IN_ROOT``), so a sandbox's symlinks and ``..`` cannot lead a host process
out of the sandbox's tree. Used by execd's file API (``sandpod_execd.files.rooted``) and by the
lifecycle when it writes into a running jail.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform

__all__ = [
    "EAGAIN_RETRIES",
    "RESOLVE_BENEATH",
    "RESOLVE_IN_ROOT",
    "RESOLVE_NO_MAGICLINKS",
    "RESOLVE_NO_SYMLINKS",
    "RESOLVE_NO_XDEV",
    "openat2",
    "openat2_available",
]

# struct open_how's resolve flags (linux/openat2.h).
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10
_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437, "arm64": 437}  # same number on both (asm-generic)
# openat2(2): with RESOLVE_IN_ROOT or RESOLVE_BENEATH, a ".." resolved while anything on the
# system was renamed or mounted fails with EAGAIN, and "the caller may choose to retry". On a
# busy host that is a matter of chance, not of the path: retry at once, a bounded number of times.
EAGAIN_RETRIES = 64


class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))


@functools.cache
def _syscall() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    if platform.machine() not in _SYS_OPENAT2:
        return None
    fn = ctypes.CDLL(None, use_errno=True).syscall
    fn.restype = ctypes.c_long
    return fn


def openat2(dirfd: int, path: str, flags: int, mode: int = 0, resolve: int = 0) -> int:
    """The ``openat2(2)`` system call; returns a new descriptor (``O_CLOEXEC`` is added).

    A scoped resolution's EAGAIN (a rename or mount elsewhere raced a "..") is retried up to
    ``EAGAIN_RETRIES`` times before it is raised.

    Raises:
        OSError: as the kernel says; ENOSYS where the call does not exist.
    """
    fn = _syscall()
    if fn is None:
        raise OSError(errno.ENOSYS, "openat2 is not wired for this architecture", path)
    how = _OpenHow(
        flags | os.O_CLOEXEC, mode if flags & (os.O_CREAT | os.O_TMPFILE) else 0, resolve
    )
    for _ in range(EAGAIN_RETRIES):
        fd = int(
            fn(
                ctypes.c_long(_SYS_OPENAT2[platform.machine()]),
                ctypes.c_long(dirfd),  # syscall(2) reads every argument as a long
                os.fsencode(path),
                ctypes.byref(how),
                ctypes.c_size_t(ctypes.sizeof(how)),
            )
        )
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err != errno.EAGAIN:
            break
    raise OSError(err, os.strerror(err), path)


@functools.cache
def openat2_available() -> bool:
    """Whether this kernel has ``openat2`` with ``RESOLVE_IN_ROOT`` (probed once on ``/``)."""
    try:
        os.close(openat2(-100, "/", os.O_PATH, 0, RESOLVE_IN_ROOT))
    except OSError:
        return False
    return True
