"""Move bytes between two TCP sockets inside the kernel (``splice(2)`` through a pipe).

Why splice: an allowed egress connection is the common case and can be a multi-GiB download;
copying it through Python buffers costs two copies and an interpreter round per chunk, while
``socket -> pipe -> socket`` moves page references and the interpreter only wakes once per pipe
load (:data:`PIPE_SIZE`, 1 MiB). ``bench/egress_proxy.py`` measures it against a direct
transfer.

Flow control is the kernel's: a direction reads from its source only after its pipe was fully
written to the destination, so a slow reader stops the writer through TCP's own window, and
the memory per connection is bounded by two pipes. Both sockets are non-blocking and the waits
are asyncio reader/writer callbacks, so thousands of idle connections cost no threads. EOF in
one direction is passed on as ``shutdown(SHUT_WR)`` (half-close, which some protocols use);
an error in either direction ends both.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket

__all__ = ["PIPE_SIZE", "pump", "relay", "send_all", "wait_readable", "wait_writable"]

PIPE_SIZE = 1024 * 1024
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK


async def _wait(fd: int, writable: bool) -> None:
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    if writable:
        loop.add_writer(fd, wake)
    else:
        loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        if writable:
            loop.remove_writer(fd)
        else:
            loop.remove_reader(fd)


async def wait_readable(sock: socket.socket) -> None:
    await _wait(sock.fileno(), writable=False)


async def wait_writable(sock: socket.socket) -> None:
    await _wait(sock.fileno(), writable=True)


async def send_all(sock: socket.socket, data: bytes | memoryview) -> None:
    """Write ``data`` to a non-blocking socket, waiting for room (no loop.sock_sendall: the
    relay registers its own writer callbacks on the same fd)."""
    view = memoryview(data)
    while view:
        try:
            sent = sock.send(view)
        except BlockingIOError:
            await wait_writable(sock)
            continue
        view = view[sent:]


def _pipe() -> tuple[int, int]:
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    with contextlib.suppress(OSError):  # a lower limit (/proc/sys/fs/pipe-max-size) still works
        fcntl.fcntl(w, _F_SETPIPE_SZ, PIPE_SIZE)
    return r, w


async def pump(
    src: socket.socket, dst: socket.socket, counter: list[int], half_close: bool = True
) -> None:
    """Copy ``src -> dst`` until ``src``'s EOF (then half-close ``dst`` if ``half_close``),
    adding the bytes moved to ``counter[0]``. Raises OSError for a reset or broken pipe."""
    r, w = _pipe()
    try:
        while True:
            try:
                n = os.splice(src.fileno(), w, PIPE_SIZE, flags=_FLAGS)
            except BlockingIOError:
                await wait_readable(src)
                continue
            if n == 0:
                if not half_close:
                    return
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                return
            counter[0] += n
            while n:
                try:
                    n -= os.splice(r, dst.fileno(), n, flags=_FLAGS)
                except BlockingIOError:
                    await wait_writable(dst)
    finally:
        os.close(r)
        os.close(w)


async def relay(a: socket.socket, b: socket.socket) -> tuple[int, int]:
    """Copy ``a -> b`` and ``b -> a`` until both directions ended (EOF) or either failed.

    Returns (bytes a->b, bytes b->a). A peer's reset or a broken pipe ends both directions and
    is not raised: the connection is over either way; the caller closes both sockets.
    """
    up, down = [0], [0]
    a.setblocking(False)
    b.setblocking(False)
    tasks: list[asyncio.Task[None]] = []

    async def run(src: socket.socket, dst: socket.socket, counter: list[int]) -> None:
        try:
            await pump(src, dst, counter)
        except OSError:
            for task in tasks:
                if task is not asyncio.current_task():
                    task.cancel()

    async with asyncio.TaskGroup() as tg:
        tasks.append(tg.create_task(run(a, b, up)))
        tasks.append(tg.create_task(run(b, a, down)))
    return up[0], down[0]
