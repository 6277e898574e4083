"""Resolving client paths inside a sandbox's root without races: ``openat2`` and descriptors.

In the local runtime execd works on a jailed sandbox's files from the host, as root (or as the
rootless user). Checking a path string and then using it is a race a sandbox process can win:
it swaps a directory for a symlink to ``/`` between the check and the use, and execd writes
the host. So a :class:`Root` never hands out a path to re-resolve. It holds an ``O_PATH``
descriptor of the sandbox's root (``/proc/<holder>/root``, the holder's view, ``/workspace``
bind mount included) and resolves every path with ``openat2(RESOLVE_IN_ROOT |
RESOLVE_NO_MAGICLINKS)``: the kernel resolves ``..`` and every symlink (absolute ones restart
at the sandbox's root) as the sandbox would, atomically, and refuses ``/proc/<pid>/root``-style
magic links (ELOOP). ``RESOLVE_NO_XDEV`` is not used: ``/workspace`` is a mount of its own.

Operations then work on what was resolved: the final object's descriptor (read, ``fstat``,
chmod/chown through ``/proc/self/fd/<fd>``, which names that object and nothing else), or the
parent directory's descriptor plus one name used with ``O_NOFOLLOW``/``*at`` calls (create,
rename, unlink, lstat). Trees are walked descriptor by descriptor, every child directory opened
with ``O_DIRECTORY | O_NOFOLLOW`` (:func:`tree`).

The process runtime has no jail: its root is the host's ``/`` and paths are host paths, resolved
by the kernel as usual (``os.open``), through the same descriptor-based operations. Without
``openat2`` (ENOSYS, kernel < 5.6) a jailed root fails closed: every operation raises
``fs.error`` (errno ENOSYS) rather than fall back to the racy check.

Resolving is only half of it: *who* resolves decides what may be read or changed. A jailed
:class:`Root` carries its sandbox's :class:`~sandpod_execd.files.identity.Identity` and every
caller runs its work in :meth:`Root.acting` (a per-thread switch of the filesystem uid, gid and
groups, see :mod:`~sandpod_execd.files.identity`), so the kernel applies the sandbox user's
permissions: the root descriptor itself is opened with execd's own rights (``/proc/<holder>/root``
needs them), everything reached from it with the user's.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import posixpath
import stat
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING

import structlog

from sandpod_contract.errors import FsError
from sandpod_execd.files.identity import Identity, acting
from sandpod_service.openat2 import (
    RESOLVE_BENEATH,
    RESOLVE_IN_ROOT,
    RESOLVE_NO_MAGICLINKS,
    RESOLVE_NO_SYMLINKS,
    RESOLVE_NO_XDEV,
    openat2,
    openat2_available,
)

if TYPE_CHECKING:
    from sandpod_execd.jail import Jail

__all__ = [
    "MAX_DEPTH",
    "MAX_SYMLINKS",
    "RESOLVE_BENEATH",
    "RESOLVE_IN_ROOT",
    "RESOLVE_NO_MAGICLINKS",
    "RESOLVE_NO_SYMLINKS",
    "RESOLVE_NO_XDEV",
    "Root",
    "chmod_fd",
    "chown_fd",
    "host_root",
    "jail_root",
    "named",
    "naming",
    "open_dir",
    "openat2",
    "openat2_available",
    "split",
    "tree",
]

log = structlog.get_logger("sandpod.execd.fs")

MAX_SYMLINKS = 40  # as the kernel: links followed for one path
MAX_DEPTH = 256  # directory levels a tree walk descends
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def named(exc: OSError, path: str, other: str | None = None) -> OSError:
    """``exc`` naming ``path`` (the client-visible path) instead of a bare ``*at`` name."""
    return OSError(exc.errno, exc.strerror, path, None, other)


@contextlib.contextmanager
def naming(path: str) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise named(exc, path, exc.filename2 if isinstance(exc.filename2, str) else None) from exc


def chmod_fd(fd: int, mode: int) -> None:
    """chmod the object ``fd`` (``O_PATH`` allowed) refers to, never anything a name leads to."""
    os.chmod(f"/proc/self/fd/{fd}", mode)


def chown_fd(fd: int, uid: int, gid: int) -> None:
    """chown the object ``fd`` (``O_PATH`` allowed) refers to (not a symlink it might be)."""
    os.chown(f"/proc/self/fd/{fd}", uid, gid)


def split(path: str) -> tuple[str, str]:
    """``(parent, last name)`` of an absolute path; the root is its own parent, named ``.``."""
    path = path.rstrip("/") or "/"
    if path == "/":
        return "/", "."
    parent, name = posixpath.split(path)
    return parent or "/", name


class Root:
    """Where a sandbox's paths are resolved (see the module docstring). Paths given to it are
    absolute paths as the sandbox sees them; its descriptor lives as long as the sandbox's
    fs state in execd."""

    def __init__(
        self, host: str = "/", *, jailed: bool = False, identity: Identity | None = None
    ) -> None:
        self.jailed = jailed
        self.host = host
        self.identity = identity  # whose rights reach the files (None: execd's own)
        self.fd = os.open(host, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        self.usable = not jailed or openat2_available()

    def acting(self, *, keep: bool = False) -> contextlib.AbstractContextManager[None]:
        """A block in which the calling thread reaches files with the sandbox user's rights
        (see :func:`~sandpod_execd.files.identity.acting`; ``keep``: the thread keeps them
        after, for fs workers). Never spawn threads or processes inside one, nor on a thread
        that keeps an identity: they would inherit it."""
        return acting(self.identity, keep=keep)

    def close(self) -> None:
        """Close the root's descriptor. Only when nothing can use it any more: a request on
        another thread could otherwise resolve against a reused descriptor number."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        # A released sandbox's context is dropped with everything that used its root. No module
        # globals here (contextlib): at interpreter exit they may already be None.
        try:  # noqa: SIM105 - not contextlib.suppress: see above
            self.close()
        except (OSError, AttributeError, TypeError):
            pass

    def open(self, path: str, flags: int, mode: int = 0) -> int:
        """A descriptor of ``path`` (symlinks followed, inside the root). Raises ``OSError``
        naming ``path``, or ``fs.error`` when a jailed root cannot be resolved safely."""
        if not self.jailed:
            with naming(path):
                return os.open(path, flags | os.O_CLOEXEC, mode)
        if not self.usable:
            raise FsError(
                "this kernel has no openat2 (Linux >= 5.6): files of a jailed sandbox cannot be "
                "reached safely from the host; use exec inside the sandbox",
                path=path,
                errno="ENOSYS",
            )
        with naming(path):
            return openat2(
                self.fd,
                path.lstrip("/") or ".",
                flags,
                mode,
                RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS,
            )

    def stat(self, path: str, *, follow: bool = True) -> os.stat_result:
        """``stat`` (``lstat`` unless ``follow``) of ``path``."""
        if follow:
            fd = self.open(path, os.O_PATH)
            try:
                return os.fstat(fd)
            finally:
                os.close(fd)
        with self.parent(path) as (dirfd, name), naming(path):
            return os.stat(name, dir_fd=dirfd, follow_symlinks=False)

    def readlink(self, path: str) -> str:
        with self.parent(path) as (dirfd, name), naming(path):
            return os.readlink(name, dir_fd=dirfd)

    @contextlib.contextmanager
    def parent(self, path: str) -> Iterator[tuple[int, str]]:
        """``(descriptor of path's directory, last name)``, for ``*at`` calls that must not
        follow the last name. A trailing ``/`` is dropped (``link/`` names the link)."""
        directory, name = split(path)
        fd = self.open(directory, os.O_PATH | os.O_DIRECTORY)
        try:
            yield fd, name
        finally:
            os.close(fd)

    def follow_last(self, path: str) -> str:
        """``path`` with its last name's symlinks followed (each hop resolved in the root), for
        writes that go through a link and keep it.

        Raises:
            OSError: ELOOP after MAX_SYMLINKS hops; errors reaching the parent directory.
        """
        for _ in range(MAX_SYMLINKS):
            try:
                st = self.stat(path, follow=False)
            except FileNotFoundError:
                return path
            if not stat.S_ISLNK(st.st_mode):
                return path
            target = self.readlink(path)
            joined = target if target.startswith("/") else f"{split(path)[0]}/{target}"
            # ".." is kept: only the kernel knows what it means after the links before it.
            path = "/" + "/".join(p for p in joined.split("/") if p not in ("", "."))
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)

    def makedirs(
        self, path: str, mode: int = 0o777, owner: tuple[int, int] | None = None
    ) -> list[str]:
        """``mkdir -p path``, each level resolved anew in the root; returns the directories
        created, which belong to ``owner`` if given. A file in the way is ENOTDIR."""
        created: list[str] = []
        parts = [p for p in path.split("/") if p]
        for i in range(len(parts)):
            here = "/" + "/".join(parts[: i + 1])
            try:
                os.close(self.open(here, os.O_PATH | os.O_DIRECTORY))
                continue
            except FileNotFoundError:
                pass
            with self.parent(here) as (dirfd, name), naming(here):
                try:
                    os.mkdir(name, mode, dir_fd=dirfd)
                    created.append(here)
                except FileExistsError:
                    pass  # made meanwhile, or a dangling link: the open below says which
            fd = self.open(here, os.O_PATH | os.O_DIRECTORY)
            try:
                if owner is not None and created and created[-1] == here:
                    with naming(here):
                        chown_fd(fd, *owner)
            finally:
                os.close(fd)
        return created


@functools.cache
def host_root() -> Root:
    """The host's ``/`` as a :class:`Root` (process runtime), opened once."""
    return Root("/")


def jail_root(jail: Jail) -> Root:
    """The :class:`Root` of a jailed sandbox: its holder's root, opened from the host, then
    checked to still be the holder's (so a recycled pid cannot hand us another process's root).

    Raises:
        SandboxUnavailable: the jail is gone.
    """
    root = Root(jail.root, jailed=True, identity=jail.identity)
    try:
        jail.check()
    except BaseException:
        root.close()
        raise
    if not root.usable:
        log.error(
            "fs_unavailable",
            reason="openat2_missing",
            sandbox_id=jail.sandbox_id,
            hint="Linux >= 5.6 is needed to reach a jailed sandbox's files safely",
        )
    return root


def tree(
    dirfd: int, depth: int | None = None, *, on_cut: Callable[[], None] | None = None
) -> Generator[tuple[int, str, os.stat_result], None, None]:
    """Every object below the readable directory ``dirfd``: ``(its directory's fd, name,
    lstat)``, depth first, a directory before its content. Links are reported, never followed;
    a child directory is opened with ``O_NOFOLLOW``, so swapping it for a link ends that
    branch. At most ``depth`` levels (default :data:`MAX_DEPTH`) are descended: ``on_cut`` is
    called for each non-empty directory the bound leaves unread, so a caller that sums the tree
    can say its sum is incomplete."""
    levels = MAX_DEPTH if depth is None else depth  # read at call time (tests lower it)
    if levels <= 0:
        if on_cut is not None:
            with os.scandir(dirfd) as it:
                if next(it, None) is not None:
                    on_cut()
        return
    with os.scandir(dirfd) as it:
        names = [e.name for e in it]
    for name in names:
        try:
            st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        except OSError:
            continue  # gone meanwhile
        yield dirfd, name, st
        if stat.S_ISDIR(st.st_mode):
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=dirfd)
            except OSError:
                continue
            try:
                yield from tree(child, levels - 1, on_cut=on_cut)
            finally:
                os.close(child)


def open_dir(name: str, dirfd: int) -> int:
    """A readable descriptor of directory ``name`` in ``dirfd``, never through a link."""
    return os.open(name, _DIR_FLAGS, dir_fd=dirfd)
