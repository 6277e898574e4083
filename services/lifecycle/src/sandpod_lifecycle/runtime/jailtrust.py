"""The egress trust files of a *running* jail, rewritten when its policy's injections change.

At creation :func:`~sandpod_lifecycle.network.trust.write_trust` writes them into the new
writable layer. Once the jail runs, a domain added to (or removed from) ``inject`` changes the
authorities it must trust, and its files are in the holder's mount namespace: the lifecycle (root
on the host) reaches them at ``/proc/<holder>/root``, and resolves every path there with
``openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)``, so a symlink or ``..`` the sandbox planted
resolves inside the sandbox, never on the host. Each file is replaced whole: the new text goes
to a fresh name created with ``O_EXCL | O_NOFOLLOW`` in the resolved directory's descriptor,
which is then renamed over the old name in that same directory. A reader sees the old bundle or
the new one, never a mix; commands that loaded a bundle already keep what they loaded.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import secrets
import stat
from collections.abc import Iterator

from sandpod_lifecycle.network.trust import BUNDLES, EXTRA_PEM, merge_bundle
from sandpod_lifecycle.runtime.jaildirs import start_time
from sandpod_service.jailfile import JailFile
from sandpod_service.openat2 import RESOLVE_IN_ROOT, RESOLVE_NO_MAGICLINKS, openat2

__all__ = ["MAX_BUNDLE", "holder_root", "retrust", "rewrite_trust"]

MAX_BUNDLE = 16 * 1024 * 1024  # a system bundle larger than this is not one: left alone
_IN_ROOT = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS


def retrust(jail: JailFile, pem: str) -> list[str]:
    """:func:`rewrite_trust` in the running jail ``jail`` describes.

    Raises:
        ProcessLookupError: its holder is gone. OSError: a file could not be written.
    """
    if jail.holder_pid is None or jail.holder_start is None:
        raise ProcessLookupError(jail.sandbox_id)
    with holder_root(jail.holder_pid, jail.holder_start) as root:
        return rewrite_trust(root, pem)


@contextlib.contextmanager
def holder_root(pid: int, start: int) -> Iterator[int]:
    """An ``O_PATH`` descriptor of the root of holder ``pid`` (started at ``start`` clock
    ticks: checked after opening, so a recycled pid is never taken for the holder).

    Raises:
        ProcessLookupError: the holder is gone (or the pid is another process now).
    """
    try:
        fd = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise ProcessLookupError(pid) from exc
    try:
        if start_time(pid) != start:
            raise ProcessLookupError(pid)
        yield fd
    finally:
        os.close(fd)


def rewrite_trust(root_fd: int, pem: str) -> list[str]:
    """Put ``pem`` in the jail whose root is ``root_fd``: the Sandpod block of each system
    bundle of :data:`~sandpod_lifecycle.network.trust.BUNDLES` it has replaced (removed when
    ``pem`` is ""), and :data:`~sandpod_lifecycle.network.trust.EXTRA_PEM` rewritten. Returns
    the paths written (inside the jail); a path whose directory is missing is skipped.

    Raises:
        OSError: a file could not be written (what was written before stays).
    """
    written = []
    for inside in (*BUNDLES, EXTRA_PEM):
        parent, name = posixpath.split(inside)
        try:
            dfd = openat2(root_fd, parent.lstrip("/"), os.O_PATH | os.O_DIRECTORY, 0, _IN_ROOT)
        except (FileNotFoundError, NotADirectoryError):
            continue
        try:
            if inside == EXTRA_PEM:
                text = pem
            else:
                current = _read(root_fd, inside)
                if current is None:
                    continue
                text = merge_bundle(current, pem)
                if text == current:
                    continue
            _replace(dfd, name, text.encode())
            written.append(inside)
        finally:
            os.close(dfd)
    return written


def _read(root_fd: int, inside: str) -> str | None:
    """The regular file at ``inside`` (symlinks resolved in the jail), or None."""
    try:
        fd = openat2(root_fd, inside.lstrip("/"), os.O_RDONLY | os.O_NONBLOCK, 0, _IN_ROOT)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None  # a FIFO or a device the sandbox put there: not read
        data = f.read(MAX_BUNDLE + 1)
    return None if len(data) > MAX_BUNDLE else data.decode(errors="replace")


def _replace(dfd: int, name: str, data: bytes) -> None:
    """``name`` in directory ``dfd`` becomes a new 0644 file holding ``data``."""
    fresh = f".{name}.sandpod-{secrets.token_hex(6)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(fresh, flags, 0o644, dir_fd=dfd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            os.fchmod(f.fileno(), 0o644)
        os.rename(fresh, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(fresh, dir_fd=dfd)
        raise
