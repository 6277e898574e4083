"""Is a port on the sandbox's loopback ready? (the ``proc.wait_port`` domain logic, no NATS).

The check sees what the sandbox sees: a server bound to the sandbox's 127.0.0.1 that no client
outside could reach. In the process runtime that is execd's own loopback; in the local runtime
the sandbox has its own network namespace, so each socket is created in it (the loop thread
joins the namespace for the ``socket()`` call only and returns at once; the socket stays
there; rootless, a forked child makes the socket and passes it back). ``tcp``: a connection
succeeds on 127.0.0.1 or ::1. ``http``: additionally
``GET <path>`` answers with a status in 200..399 (HTTP/1.0, so the server closes the
connection; only the status line is read).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import errno
import os
import socket
import time
from collections.abc import Callable

__all__ = ["PortCheck", "check_port", "wait_port"]

HOSTS = ("127.0.0.1", "::1")
ATTEMPT_TIMEOUT = 2.0  # seconds for one connection (and, for http, its status line)
INTERVAL = 0.1  # seconds between attempts
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
_libc = ctypes.CDLL(None, use_errno=True)


@dataclasses.dataclass(frozen=True, slots=True)
class PortCheck:
    ready: bool
    status_code: int | None = None
    reason: str | None = None


async def _http_status(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int, path: str
) -> int:
    writer.write(f"GET {path} HTTP/1.0\r\nHost: localhost:{port}\r\n\r\n".encode())
    await writer.drain()
    line = await reader.readline()
    parts = line.split()
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        raise ValueError(f"not an HTTP response: {line[:60]!r}")
    return int(parts[1])


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def _socket(host: str, netns: str | None) -> socket.socket:
    """A non-blocking TCP socket for ``host``, in the network namespace ``netns`` if given."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if netns is None:
        sock = socket.socket(family, socket.SOCK_STREAM)
    elif os.geteuid() != 0:
        sock = _socket_from_child(family, netns)
    else:
        target = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(target)
            try:
                sock = socket.socket(family, socket.SOCK_STREAM)
            finally:
                _setns(home)
        finally:
            os.close(target)
            os.close(home)
    sock.setblocking(False)
    return sock


def _socket_from_child(family: int, netns: str) -> socket.socket:
    r"""Rootless: a socket made in ``netns`` by a forked child, passed back over a socketpair.

    An unprivileged process may enter a network namespace only from inside the user namespace
    owning it, and a multithreaded process (execd) may not change user namespace; a fresh child
    is single-threaded. It only makes syscalls and ``_exit``\s (nothing that could need a lock
    another thread held at the fork).
    """
    user = netns.rsplit("/", 1)[0] + "/user"
    target_user = os.open(user, os.O_RDONLY | os.O_CLOEXEC)
    target_net = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child (coverage does not follow it)
            code = 1
            try:
                if _libc.setns(target_user, CLONE_NEWUSER) == 0 and _setns_ok(target_net):
                    made = socket.socket(family, socket.SOCK_STREAM)
                    socket.send_fds(theirs, [b"s"], [made.fileno()])
                    code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise OSError(errno.EPERM, f"cannot enter the network namespace {netns}")
        _, fds, _, _ = socket.recv_fds(ours, 16, 1)
        return socket.socket(fileno=fds[0])
    finally:
        ours.close()
        theirs.close()
        os.close(target_user)
        os.close(target_net)


def _setns_ok(fd: int) -> bool:
    return bool(_libc.setns(fd, CLONE_NEWNET) == 0)


async def _attempt(host: str, port: int, kind: str, path: str, netns: str | None) -> PortCheck:
    sock = _socket(host, netns)
    try:
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
    except BaseException:
        sock.close()
        raise
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        if kind == "tcp":
            return PortCheck(ready=True)
        status = await _http_status(reader, writer, port, path)
        if 200 <= status < 400:
            return PortCheck(ready=True, status_code=status)
        return PortCheck(ready=False, status_code=status, reason=f"HTTP status {status}")
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def check_port(
    port: int, kind: str = "tcp", path: str = "/", netns: str | None = None
) -> PortCheck:
    """One check on each loopback address (of ``netns``, if given); ready if either is."""
    last = PortCheck(ready=False, reason="not checked")
    for host in HOSTS:
        try:
            attempt = _attempt(host, port, kind, path, netns)
            result = await asyncio.wait_for(attempt, ATTEMPT_TIMEOUT)
        except TimeoutError:
            result = PortCheck(ready=False, reason="timed out")
        except ConnectionRefusedError:
            result = PortCheck(ready=False, reason="connection refused")
        except (OSError, ValueError) as exc:
            result = PortCheck(ready=False, reason=f"{type(exc).__name__}: {exc}"[:200])
        if result.ready:
            return result
        # Prefer the more informative failure (an HTTP status over a refused connection).
        if last.status_code is None:
            last = result
    return last


async def wait_port(
    port: int, kind: str, path: str, wait: float, *, stop: Callable[[], bool], netns: str | None
) -> PortCheck:
    """Check until ready, ``wait`` seconds passed, or ``stop()`` is true (the process exited)."""
    deadline = time.monotonic() + wait
    while True:
        result = await check_port(port, kind, path, netns)
        if result.ready or stop() or time.monotonic() + INTERVAL > deadline:
            return result
        await asyncio.sleep(INTERVAL)
