"""Read-only, id-mapped views of a snapshot's layers: one copy on disk, any number of forks.

A snapshot's layers keep the owner they had in the sandbox they were taken from (its uid, one of
the installation's sandbox uids). A fork runs as another uid, so it would read the files as a
stranger's and could not change them. Copying or chowning them per fork would cost time
proportional to the workspace; an *id-mapped mount* costs the same for any size: the kernel
shows the layer with ``source uid <-> fork uid`` swapped (every other id, root's included, as
it is), read-only, and overlayfs stacks that view as a lower layer (kernel >= 5.19). What the
fork writes is copied up into its own writable layer under its own uid; the layer itself never
changes (the mount is read-only, and the source uid is swapped away).

Data flow: :func:`userns_fd` makes a throwaway user namespace carrying the swap (written by us
as root into a child's ``uid_map``/``gid_map``), :func:`mount_idmapped` clones the layer's
directory with ``open_tree``, sets ``MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY`` with
``mount_setattr`` and attaches it with ``move_mount`` where the holder's overlay picks it up.
The holder's private mount namespace keeps its own copy: the caller detaches ours as soon as the
holder is ready (:func:`detach`), so nothing stays mounted on the host.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
from pathlib import Path

__all__ = ["IdmapFailed", "detach", "mount_idmapped", "swap_map", "userns_fd"]

_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_MOUNT_SETATTR = 428, 429, 442  # x86_64 and aarch64
_OPEN_TREE_CLONE, _OPEN_TREE_CLOEXEC = 1, os.O_CLOEXEC
_AT_FDCWD, _AT_EMPTY_PATH = -100, 0x1000
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_IDMAP = 0x1, 0x100000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MNT_DETACH = 2
_MAX_ID = 4294967295  # ids 0 .. 2^32-2 are mappable


class IdmapFailed(OSError):
    """The kernel refused an id-mapped mount (too old a kernel, a filesystem without id-mapping
    support, or no privilege)."""


class _MountAttr(ctypes.Structure):
    _fields_ = (
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    )


_libc = ctypes.CDLL(None, use_errno=True)


def swap_map(a: int, b: int) -> str:
    """A ``uid_map`` that is the identity except ``a <-> b`` (``a == b``: the identity)."""
    lo, hi = sorted((a, b))
    if lo == hi:
        return f"0 0 {_MAX_ID}\n"
    lines = [f"0 0 {lo}"] if lo else []
    lines.append(f"{lo} {hi} 1")
    if hi - lo > 1:
        lines.append(f"{lo + 1} {lo + 1} {hi - lo - 1}")
    lines.append(f"{hi} {lo} 1")
    lines.append(f"{hi + 1} {hi + 1} {_MAX_ID - hi - 1}")
    return "\n".join(lines) + "\n"


def userns_fd(a: int, b: int, unshare: str) -> int:
    """An fd of a new user namespace whose ids are ours with ``a <-> b`` swapped (made by a
    child running util-linux's ``unshare`` at the absolute path ``unshare``).

    Raises:
        IdmapFailed: no user namespace could be made or mapped.
    """
    child = subprocess.Popen(
        [unshare, "--user", "--", "cat"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        ours = os.readlink("/proc/self/ns/user")
        ns = f"/proc/{child.pid}/ns/user"
        # unshare(1) execs cat once its namespace exists: the link changes exactly then
        while True:
            try:
                if os.readlink(ns) != ours:
                    break
            except OSError as exc:
                raise IdmapFailed(exc.errno, f"unshare --user died: {exc}") from exc
            os.sched_yield()
        mapping = swap_map(a, b)
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{child.pid}/{name}", "w") as f:
                f.write(mapping)
        return os.open(ns, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise IdmapFailed(exc.errno or 0, f"cannot make an id-mapping namespace: {exc}") from exc
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.kill()
        child.wait()


def mount_idmapped(source: Path, target: Path, userns: int) -> None:
    """Mount ``source`` read-only at ``target`` (an empty directory) seen through ``userns``.

    Raises:
        IdmapFailed: the kernel refused (errno and step in the message).
    """
    tree = _libc.syscall(
        _SYS_OPEN_TREE, _AT_FDCWD, os.fsencode(source), _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC
    )
    if tree < 0:
        _raise("open_tree", source)
    try:
        attr = _MountAttr(_MOUNT_ATTR_IDMAP | _MOUNT_ATTR_RDONLY, 0, 0, userns)
        if (
            _libc.syscall(
                _SYS_MOUNT_SETATTR,
                tree,
                b"",
                _AT_EMPTY_PATH,
                ctypes.byref(attr),
                ctypes.sizeof(attr),
            )
            < 0
        ):
            _raise("mount_setattr", source)
        if (
            _libc.syscall(
                _SYS_MOVE_MOUNT, tree, b"", _AT_FDCWD, os.fsencode(target), _MOVE_MOUNT_F_EMPTY_PATH
            )
            < 0
        ):
            _raise("move_mount", target)
    finally:
        os.close(tree)


def detach(target: Path) -> None:
    """Lazily unmount ``target`` if it is a mount point (no error if it is not)."""
    if _libc.umount2(os.fsencode(target), _MNT_DETACH) < 0:
        errno = ctypes.get_errno()
        if errno not in (22, 2):  # EINVAL: not a mount point; ENOENT: gone
            raise IdmapFailed(errno, f"cannot unmount {target}: {os.strerror(errno)}")
    with contextlib.suppress(OSError):
        target.rmdir()


def _raise(step: str, path: Path) -> None:
    errno = ctypes.get_errno()
    raise IdmapFailed(errno, f"{step} {path}: {os.strerror(errno)}")
