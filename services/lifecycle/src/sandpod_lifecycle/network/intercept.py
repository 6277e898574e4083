"""TLS interception for the domains a policy injects a secret into (and only those).

The proxy calls :func:`terminate` for a connection whose SNI matched an ``inject`` entry: the
sandbox's TLS is terminated with the installation's authority for that entry's domain
(``ca.py``) while, at the same moment, a new TLS connection to the real server is opened and
its certificate verified against the host's trust store (or the configured bundle). A new
connection thus waits for the slower of the two handshakes, not their sum. Requests then go
through ``http1.HttpSession`` with :func:`rewriter`'s header, and :func:`copy_back` streams the
responses.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Awaitable, Callable

from sandpod_contract.network import HeaderInjection
from sandpod_lifecycle.network.http1 import Head, refusal_bytes
from sandpod_lifecycle.network.secretstore import SecretError, SecretSource
from sandpod_lifecycle.network.streams import Stream, TlsStream

__all__ = ["InterceptFailed", "answer", "copy_back", "rewriter", "terminate"]


class InterceptFailed(Exception):
    """A handshake failed; ``outcome`` is the metric label, ``detail`` what the client is told
    (None: the client's own TLS failed, there is nobody to tell)."""

    def __init__(self, outcome: str, detail: str | None) -> None:
        super().__init__(outcome)
        self.outcome = outcome
        self.detail = detail


def rewriter(inject: HeaderInjection, secrets: SecretSource | None) -> Callable[[Head], None]:
    """The edit every request gets: ``inject.header`` set to the formatted secret (every
    copy the sandbox sent removed). Raises SecretError when the value cannot be read."""
    if secrets is None:
        raise SecretError("header injection configured but the proxy has no secret store")
    value = inject.format.replace("{secret}", secrets.get(inject.secret))
    header = inject.header

    def rewrite(head: Head) -> None:
        head.replace(header, value)

    return rewrite


async def terminate(
    client: TlsStream,
    connect: Callable[[], Awaitable[socket.socket]],
    upstream_tls: ssl.SSLContext,
    name: str,
    timeout: float,
) -> TlsStream:
    """Complete ``client``'s handshake and open the verified upstream for ``name`` at once.

    Returns the upstream stream. Raises InterceptFailed (client-tls-failed,
    upstream-unreachable, upstream-tls-failed).
    """
    async with asyncio.TaskGroup() as tg:
        opening = tg.create_task(_open_upstream(connect, upstream_tls, name, timeout))
        try:
            async with asyncio.timeout(timeout):
                await client.handshake()
        except (ssl.SSLError, ConnectionError, OSError, TimeoutError):
            opening.cancel()  # e.g. the sandbox does not trust the authority
            raise InterceptFailed("client-tls-failed", None) from None
    upstream = opening.result()
    if isinstance(upstream, InterceptFailed):
        raise upstream
    return upstream


async def _open_upstream(
    connect: Callable[[], Awaitable[socket.socket]],
    upstream_tls: ssl.SSLContext,
    name: str,
    timeout: float,
) -> TlsStream | InterceptFailed:
    try:
        sock = await connect()
    except (OSError, TimeoutError):
        return InterceptFailed("upstream-unreachable", "unreachable")
    upstream = TlsStream(sock, upstream_tls, server_side=False, server_hostname=name)
    try:
        async with asyncio.timeout(timeout):
            await upstream.handshake()
    except (ssl.SSLError, ConnectionError, OSError, TimeoutError) as exc:
        return InterceptFailed("upstream-tls-failed", f"TLS to the server failed: {exc}")
    return upstream


COPY_AHEAD = 4  # decrypted reads waiting to be re-encrypted to the sandbox (x 256 KiB)


async def copy_back(upstream: Stream, client: Stream, counter: list[int]) -> None:
    """Responses, as bytes, until the server's EOF (the session half-closes the client).

    Reading the server and writing the sandbox overlap through a queue of
    :data:`COPY_AHEAD` reads (bounded: a slow sandbox stops the reads, and the server is
    held back by TCP): one waits on its socket while the other works.
    """
    queue: asyncio.Queue[bytes] = asyncio.Queue(COPY_AHEAD)

    async def read() -> None:
        with contextlib.suppress(OSError, ssl.SSLError):  # the server went away: that is EOF
            while data := await upstream.read():
                await queue.put(data)
        await queue.put(b"")

    failure: OSError | ssl.SSLError | None = None
    async with asyncio.TaskGroup() as tg:
        reader = tg.create_task(read())
        try:
            while data := await queue.get():
                await client.write(data)
                counter[0] += len(data)
        except (OSError, ssl.SSLError) as exc:  # raised below, not as a group
            failure = exc
            reader.cancel()
    if failure is not None:
        raise failure


async def answer(client: Stream, status: int, reason: str, detail: str) -> None:
    """Answer the client ourselves (a 502 when the server could not be reached) and end."""
    with contextlib.suppress(OSError, ssl.SSLError):
        await client.write(refusal_bytes(status, reason, detail))
        await client.close_write()
