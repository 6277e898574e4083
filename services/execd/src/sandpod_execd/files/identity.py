"""Acting as the sandbox's user on the host: a per-thread filesystem identity.

execd runs as root (local runtime) but a jailed sandbox's files must be reached with exactly the
rights its user has inside: the jail's root is an overlay whose lower layer is the host's ``/``,
so as root the file API would read ``/etc/shadow`` and replace ``/usr/bin/*``. :func:`acting`
switches the *calling thread's* filesystem credentials to the sandbox's ``uid``/``gid`` (and its
supplementary groups: none, as the jail's commands run, see ``native/jail_exec.c``) for the
duration of a block, and back after.

Linux keeps credentials per thread; the thread-group-wide behaviour of ``setuid``/``setgroups``
is glibc's doing (it signals every thread to repeat the call). So the switch uses the raw system
calls (``syscall(SYS_setgroups/SYS_setfsgid/SYS_setfsuid)``), which change this thread only:
the event loop and the other workers keep execd's own credentials. Changing the fs uid from 0 to
non-zero also clears ``CAP_CHOWN``, ``CAP_DAC_OVERRIDE``, ``CAP_DAC_READ_SEARCH``,
``CAP_FOWNER``, ``CAP_FSETID``, ``CAP_MKNOD``... from the thread's effective set (and setting it
back to 0 restores them), so every permission check the kernel makes for ``openat2``,
``inotify_add_watch``, ``rename``, ``unlink``, ``chmod``, ``chown``, ``utimensat``,
``faccessat(AT_EACCESS)``... is the one the sandbox's user gets, and files created belong to it.
``chown`` is then limited as for the user: a file it owns may only be given to a group it is in
(its own gid), never to another uid.

The switch is checked (``setfsuid``/``setfsgid`` report the value in force) and fails closed:
:class:`IdentityError` (an ``OSError`` with ``EPERM``, so handlers report ``fs.permission_denied``)
instead of running the operation as root. Blocks nest: an inner block for the same identity is a
no-op, one for another identity is refused. The fs workers *keep* the identity between blocks
(``keep=True``): an execd serves one sandbox (or a few), so the hot path usually switches
nothing; the event loop's thread always gets execd's own identity back.

Where execd cannot switch (it is not root: rootless mode, where its uid already is the sandbox's
uid in the user namespace) or need not (the process runtime: the sandbox runs as execd's own uid)
there is no identity: ``acting(None)`` only makes sure the thread has execd's own.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import functools
import os
import platform
import threading
from collections.abc import Iterator

__all__ = ["Identity", "IdentityError", "acting", "current", "switch_supported"]

# (setgroups, setfsuid, setfsgid) system call numbers.
_SYSCALLS = {"x86_64": (116, 122, 123), "aarch64": (159, 151, 152), "arm64": (159, 151, 152)}


@dataclasses.dataclass(frozen=True, slots=True)
class Identity:
    """Who a sandbox's files are reached as: uid, gid and supplementary groups."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()


class IdentityError(PermissionError):
    """The thread could not take (or give back) an identity; nothing was done as root."""


class _State(threading.local):
    current: Identity | None = None  # the credentials this thread has now (None: execd's own)
    depth = 0  # acting() blocks this thread is inside


_state = _State()


@functools.cache
def _calls() -> tuple[ctypes._CFuncPtr, tuple[int, int, int]] | None:  # type: ignore[name-defined]
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        return None
    fn = ctypes.CDLL(None, use_errno=True).syscall
    fn.restype = ctypes.c_long
    return fn, numbers


def switch_supported() -> bool:
    """Whether this process can switch a thread's identity (root, on a wired architecture)."""
    return os.geteuid() == 0 and _calls() is not None


def current() -> Identity | None:
    """The identity the calling thread acts as now (None: execd's own)."""
    return _state.current


def _fail(what: str, err: int | None = None) -> IdentityError:
    code = err if err else errno.EPERM
    return IdentityError(code, f"cannot act as the sandbox's user ({what}: {os.strerror(code)})")


def _setgroups(groups: tuple[int, ...]) -> None:
    calls = _calls()
    if calls is None:
        raise _fail("setgroups", errno.ENOSYS)
    fn, (nr_groups, _, _) = calls
    arr = (ctypes.c_uint * max(len(groups), 1))(*groups)
    if fn(ctypes.c_long(nr_groups), ctypes.c_long(len(groups)), arr) != 0:
        raise _fail("setgroups", ctypes.get_errno())


def _setfs(which: int, value: int) -> None:
    """``setfsuid``/``setfsgid`` (``which``: 1 or 2), checked: neither reports failure itself,
    both return the previous value, so a second call with -1 (never valid) reads the new one."""
    calls = _calls()
    if calls is None:
        raise _fail("setfsuid", errno.ENOSYS)
    fn, numbers = calls
    nr = ctypes.c_long(numbers[which])
    fn(nr, ctypes.c_long(value))
    if fn(nr, ctypes.c_long(-1)) != value:
        raise _fail("setfsuid" if which == 1 else "setfsgid")


# execd's own identity, as every thread starts with it (read at import, before any switch).
_OWN = Identity(os.geteuid(), os.getegid(), tuple(os.getgroups()))


@contextlib.contextmanager
def acting(ident: Identity | None, *, keep: bool = False) -> Iterator[None]:
    """Run the block with this thread's filesystem identity ``ident`` (None: execd's own).

    ``keep``: leave the thread with ``ident`` after the block (for workers that only ever do
    file work for sandboxes: the next block for the same sandbox then costs no system call;
    one for another identity, or for None, switches). Without it a block that switched gives
    the thread execd's own identity back (the event loop's thread, which also spawns processes);
    one that found the thread already acting as ``ident`` leaves it so.

    Raises:
        IdentityError: the switch did not take (the block does not run), or switching back
            failed (the thread keeps the sandbox's identity, never more); or a block for another
            identity is open on this thread (identities never mix).
    """
    switched = _state.current != ident
    if switched:
        if _state.depth:
            raise _fail("already acting as another sandbox's user")
        _switch(ident)
    _state.depth += 1
    try:
        yield
    finally:
        _state.depth -= 1
        if switched and not keep and _state.current is not None:
            _switch(None)


def _switch(ident: Identity | None) -> None:
    """Give this thread ``ident``'s credentials (None: execd's own), from whatever it has."""
    if ident is None:
        # The uid first: setting it back to 0 restores the fs capabilities the others need.
        _setfs(1, _OWN.uid)
        _setfs(2, _OWN.gid)
        _setgroups(_OWN.groups)
        _state.current = None
        return
    if _state.current is not None:
        _switch(None)  # from another sandbox's identity: through execd's own
    try:
        # Groups and gid first, while the fs uid (and so CAP_* of the fs set) is still execd's.
        _setgroups(ident.groups)
        _setfs(2, ident.gid)
        _setfs(1, ident.uid)
    except BaseException:
        _state.current = ident  # partly switched: whatever undoes it must run
        _switch(None)
        raise
    _state.current = ident
