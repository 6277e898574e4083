"""The NATS transport behind every Sandpod component.

Wraps nats-py so the rest of the code sees plain bytes, its own :class:`Inbound` message type and
transport errors: no responders become :class:`~sandpod_bus.errors.NoResponders` (nobody serves
that subject; what that means is the caller's to say), timeouts become ``RequestTimeout``, a
closed connection becomes ``ConnectionLost``. Reconnection
is nats-py's (unbounded attempts by default), with the buffered publishes it does while away.
Subscriptions are always bounded by pending message and byte limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import nats
import nats.errors
import nats.js.api
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as NatsSubscription

from sandpod_bus._natspy import websocket_support
from sandpod_bus.capacity import insufficient_storage, out_of_storage
from sandpod_bus.credswatch import CredsWatch
from sandpod_bus.errors import NoResponders
from sandpod_bus.kv import KvBucket, open_bucket
from sandpod_bus.objects import ObjectBucket, open_objects
from sandpod_contract.errors import (
    ConnectionLost,
    PayloadTooLarge,
    RequestTimeout,
    StoreError,
)

__all__ = ["Bus", "BusSettings", "Inbound", "Subscription"]

log = logging.getLogger("sandpod.bus")


@dataclasses.dataclass(frozen=True)
class BusSettings:
    """How to reach NATS.

    Attributes:
        url: one or more comma-separated NATS URLs.
        name: client name shown by the server (``nats server report connections``).
        reconnect_wait: seconds between reconnect attempts.
        max_reconnect_attempts: -1 for unbounded.
        connect_timeout: seconds to wait for the first connection.
        reconnect_buffer_bytes: publishes buffered while disconnected (nats-py pending size).
        creds: a NATS creds file (user JWT + nkey seed; ``SANDPOD_NATS_CREDS``) for servers in
            operator mode. nats-py re-reads it at every (re)connect, so a renewed file is
            picked up at a reconnect, which :class:`CredsWatch` forces when the file changes
            (a server drops an expired JWT's connection and nats-py then closes it for good).
        creds_poll: seconds between checks of the creds file for a renewal.
        inbox_prefix: the prefix of this client's reply inboxes (nats-py ``inbox_prefix``;
            None: ``_INBOX``). A tenant credential may subscribe only under its own
            (``_INBOX.<tenant-token>``), so a client using one must connect with it.
    """

    url: str = "nats://127.0.0.1:4222"
    name: str = "sandpod"
    reconnect_wait: float = 0.25
    max_reconnect_attempts: int = -1
    connect_timeout: float = 5.0
    reconnect_buffer_bytes: int = 8 * 1024 * 1024
    creds: str | None = None
    creds_poll: float = 5.0
    inbox_prefix: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Inbound:
    """A received message, without nats-py types."""

    subject: str
    data: bytes
    reply: str | None


Handler = Callable[[Inbound], Awaitable[None]]


class Subscription:
    """A bounded subscription; ``stop()`` unsubscribes (idempotent)."""

    def __init__(self, sub: NatsSubscription) -> None:
        self._sub = sub
        self._stopped = False

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        with contextlib.suppress(
            nats.errors.ConnectionClosedError, nats.errors.BadSubscriptionError
        ):
            await self._sub.unsubscribe()

    async def drain(self, timeout: float = 5.0) -> None:
        """Stop receiving and wait (up to ``timeout``) until received messages were handled."""
        if self._stopped:
            return
        self._stopped = True
        try:
            await asyncio.wait_for(self._sub.drain(), timeout)  # type: ignore[no-untyped-call]
        except (TimeoutError, nats.errors.ConnectionClosedError, nats.errors.BadSubscriptionError):
            with contextlib.suppress(Exception):  # best effort: the connection may be gone
                await self._sub.unsubscribe()


class Bus:
    """One NATS connection: create with :meth:`connect`, end with :meth:`drain` or :meth:`close`."""

    def __init__(self, nc: NatsClient, settings: BusSettings) -> None:
        self._nc = nc
        self.settings = settings
        self._closing = False
        self._creds_task: asyncio.Task[None] | None = None
        self.creds_watch: CredsWatch | None = None

    def _watch_creds(self, path: str, every: float) -> None:
        """Own a :class:`CredsWatch` task (stopped by drain/close) that reconnects on renewal."""
        self.creds_watch = CredsWatch(path, self._nc.force_reconnect, every)
        self._creds_task = asyncio.get_running_loop().create_task(
            self.creds_watch.run(), name=f"nats-creds-watch:{path}"
        )

    async def _stop_creds_watch(self) -> None:
        task, self._creds_task = self._creds_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @classmethod
    async def connect(cls, settings: BusSettings) -> Bus:
        """Connect to NATS.

        Raises:
            ConnectionLost: no server answered at ``settings.url`` within ``connect_timeout``.
        """

        connected = False

        async def on_error(exc: Exception) -> None:
            # Failed attempts before the first connection are reported once, by the raise below.
            log.log(logging.WARNING if connected else logging.DEBUG, "nats error: %s", exc)

        async def on_disconnect() -> None:
            if not nc.is_closed and not nc.is_draining:  # closing on purpose is not news
                log.info("nats disconnected; reconnecting")

        async def on_reconnect() -> None:
            log.info("nats reconnected")

        async def on_closed() -> None:
            if not bus_closing():  # e.g. the server dropped an expired JWT: nats-py gives up
                log.error(
                    "nats connection closed by the server (%s); not reconnecting", nc.last_error
                )

        def bus_closing() -> bool:
            return bus is not None and bus._closing

        bus: Bus | None = None

        nc = NatsClient()
        servers = [u.strip() for u in settings.url.split(",") if u.strip()]
        websocket_support(servers)  # aiohttp, skipped when nats was imported, for ws:// only
        try:
            # nats-py retries the first connection forever when reconnects are unbounded:
            # bound the whole attempt by connect_timeout.
            connecting = nc.connect(
                servers=servers,
                name=settings.name,
                connect_timeout=settings.connect_timeout,  # type: ignore[arg-type]  # float ok
                reconnect_time_wait=settings.reconnect_wait,  # type: ignore[arg-type]
                max_reconnect_attempts=settings.max_reconnect_attempts,
                allow_reconnect=True,
                pending_size=settings.reconnect_buffer_bytes,
                error_cb=on_error,
                disconnected_cb=on_disconnect,
                reconnected_cb=on_reconnect,
                closed_cb=on_closed,
                user_credentials=settings.creds,
                inbox_prefix=settings.inbox_prefix or "_INBOX",
            )
            await asyncio.wait_for(connecting, settings.connect_timeout)
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            # Do not let nats-py keep trying in the background after we gave up.
            await _close_quietly(nc)
            raise ConnectionLost(
                f"cannot connect to NATS at {settings.url} within {settings.connect_timeout:g}s "
                f"({exc or type(exc).__name__}); is the server running (`sandpod up`) and the "
                "URL right? An authenticated NATS (`sandpod up`'s refuses anonymous clients) "
                "also needs a creds file: SANDPOD_NATS_CREDS, or run as the user of `sandpod up` "
                "(its client.creds is in <state dir>/nats-auth/)",
                url=settings.url,
            ) from exc
        connected = True
        bus = cls(nc, settings)
        if settings.creds:
            bus._watch_creds(settings.creds, settings.creds_poll)
        return bus

    # -- properties ----------------------------------------------------------------------------

    @property
    def max_payload(self) -> int:
        """The server's max payload in bytes (what one message may carry)."""
        return int(self._nc.max_payload)

    @property
    def is_connected(self) -> bool:
        return bool(self._nc.is_connected)

    @property
    def is_closed(self) -> bool:
        return bool(self._nc.is_closed)

    def new_inbox(self) -> str:
        return str(self._nc.new_inbox())

    # -- messaging -----------------------------------------------------------------------------

    async def request(self, subject: str, payload: bytes, timeout: float) -> bytes:
        """Send a request and return the reply payload.

        Raises:
            NoResponders: nobody subscribes to ``subject`` (the caller says what that means).
            RequestTimeout: no reply within ``timeout`` seconds.
            ConnectionLost: the connection is closed.
            PayloadTooLarge: ``payload`` exceeds the server's max payload.
        """
        self._check_size(payload)
        try:
            msg = await self._nc.request(subject, payload, timeout=timeout)
        except nats.errors.NoRespondersError as exc:
            raise NoResponders(f"no responders on {subject}", subject=subject) from exc
        except (TimeoutError, nats.errors.TimeoutError) as exc:
            raise RequestTimeout(
                f"no reply on {subject} within {timeout:g}s", subject=subject
            ) from exc
        except nats.errors.MaxPayloadError as exc:
            raise PayloadTooLarge(str(exc), limit=self.max_payload) from exc
        except (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError) as exc:
            raise ConnectionLost("NATS connection is closed") from exc
        return bytes(msg.data)

    async def publish(self, subject: str, payload: bytes, reply: str = "") -> None:
        """Publish (fire and forget; buffered by nats-py while reconnecting).

        Raises:
            ConnectionLost: the connection is closed.
            PayloadTooLarge: ``payload`` exceeds the server's max payload.
        """
        self._check_size(payload)
        try:
            await self._nc.publish(subject, payload, reply=reply)
        except nats.errors.MaxPayloadError as exc:
            raise PayloadTooLarge(str(exc), limit=self.max_payload) from exc
        except (
            nats.errors.ConnectionClosedError,
            nats.errors.ConnectionDrainingError,
            nats.errors.OutboundBufferLimitError,
        ) as exc:
            raise ConnectionLost(f"cannot publish: {type(exc).__name__}") from exc

    async def subscribe(
        self,
        subject: str,
        handler: Handler,
        *,
        queue: str = "",
        pending_msgs: int = 4096,
        pending_bytes: int = 64 * 1024 * 1024,
    ) -> Subscription:
        """Subscribe with a handler called in order, one message at a time.

        The handler must return quickly (hand long work to its own task owner); nats-py buffers
        at most ``pending_msgs``/``pending_bytes`` behind it and reports a slow consumer beyond.
        """

        async def on_msg(msg: Msg) -> None:
            try:
                await handler(Inbound(msg.subject, bytes(msg.data), msg.reply or None))
            except Exception:  # a handler bug must not kill the subscription
                log.exception("handler for %s failed", subject)

        sub = await self._nc.subscribe(
            subject,
            queue=queue,
            cb=on_msg,
            pending_msgs_limit=pending_msgs,
            pending_bytes_limit=pending_bytes,
        )
        return Subscription(sub)

    async def kv(self, bucket: str, *, history: int = 1) -> KvBucket:
        """The JetStream key-value bucket ``bucket`` (created with ``history`` if missing).

        Raises:
            InsufficientStorage: JetStream has no room left to make it.
            StoreError: JetStream failed otherwise.
        """
        return await open_bucket(self._nc, bucket, history)

    async def objects(self, bucket: str) -> ObjectBucket:
        """The JetStream object-store bucket ``bucket`` (created if missing).

        Raises:
            InsufficientStorage: JetStream has no room left to make it.
            StoreError: JetStream failed otherwise.
        """
        return await open_objects(self._nc, bucket)

    async def ensure_stream(
        self,
        name: str,
        subjects: list[str],
        max_age: float,
        *,
        max_bytes: int = -1,
        max_msgs_per_subject: int = -1,
        size_setting: str | None = None,
    ) -> None:
        """Create (or update) JetStream stream ``name`` capturing ``subjects``, keeping
        messages for ``max_age`` seconds and at most ``max_bytes`` in all and
        ``max_msgs_per_subject`` per subject (-1: unlimited); the oldest go first when full.

        Args:
            size_setting: the caller's setting that chose ``max_bytes``, named as a remedy
                when JetStream has no room for the stream.

        Raises:
            InsufficientStorage: the server (or the account) cannot reserve ``max_bytes``;
                the message says how much is reserved already and what to do.
            StoreError: JetStream failed otherwise.
        """
        js = self._nc.jetstream()
        config = nats.js.api.StreamConfig(
            name=name,
            subjects=subjects,
            max_age=max_age,
            max_bytes=max_bytes,
            max_msgs_per_subject=max_msgs_per_subject,
            discard=nats.js.api.DiscardPolicy.OLD,
        )
        try:
            try:
                await js.add_stream(config)
            except nats.js.errors.BadRequestError:  # exists with another config: update it
                await js.update_stream(config)
        except nats.errors.Error as exc:
            if out_of_storage(exc):
                raise await insufficient_storage(
                    self._nc,
                    what=f"stream {name}",
                    stream=name,
                    reserve=max_bytes,
                    setting=size_setting,
                ) from exc
            raise StoreError(f"cannot create stream {name}: {exc}") from exc

    async def js_publish(self, subject: str, payload: bytes, timeout: float = 5.0) -> int:
        """Publish into JetStream and wait for the ack; the stream sequence.

        Raises:
            StoreError: no stream captures ``subject`` or JetStream did not acknowledge.
        """
        try:
            ack = await self._nc.jetstream().publish(subject, payload, timeout=timeout)
        except nats.errors.Error as exc:
            raise StoreError(f"JetStream publish to {subject} failed: {exc}") from exc
        return int(ack.seq)

    async def flush(self, timeout: float = 5.0) -> None:
        """Round-trip to the server: everything published so far has reached it."""
        try:
            await self._nc.flush(timeout=timeout)  # type: ignore[arg-type]
        except (TimeoutError, nats.errors.TimeoutError) as exc:
            raise RequestTimeout("flush timed out") from exc
        except nats.errors.ConnectionClosedError as exc:
            raise ConnectionLost("NATS connection is closed") from exc

    def _check_size(self, payload: bytes) -> None:
        if self._nc.is_connected and len(payload) > self.max_payload:
            raise PayloadTooLarge(
                f"message of {len(payload)} bytes exceeds the NATS max payload {self.max_payload}",
                size=len(payload),
                limit=self.max_payload,
            )

    # -- shutdown ------------------------------------------------------------------------------

    async def drain(self, timeout: float = 5.0) -> None:
        """Stop subscriptions after in-flight messages, flush publishes, close. Idempotent.

        A connection that is down (reconnecting) cannot drain: it is closed at once, so shutdown
        never waits on a server that is gone.
        """
        if self._closing:
            return
        self._closing = True
        await self._stop_creds_watch()
        if self._nc.is_closed:
            return
        if not self._nc.is_connected:
            await _close_quietly(self._nc)
            return
        try:
            await asyncio.wait_for(self._nc.drain(), timeout)
        except Exception as exc:  # draining a broken connection: closing is all that is left
            log.debug("drain failed (%s); closing", exc)
            await _close_quietly(self._nc)

    async def close(self) -> None:
        """Close immediately. Idempotent."""
        self._closing = True
        await self._stop_creds_watch()
        await _close_quietly(self._nc)


async def _close_quietly(nc: Any) -> None:
    try:
        await nc.close()
    except Exception as exc:  # already closed or never connected
        log.debug("close: %s", exc)
