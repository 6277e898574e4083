"""JetStream key-value buckets behind Sandpod's own types: the store's only path to JetStream.

Revisions are JetStream stream sequences, so they only grow and are shared by every key of a
bucket: a watcher can resume "from revision R" after a restart or a reconnect (an ordered
consumer starting at sequence R + 1). Compare-and-set errors become the contract's store errors:
:class:`ResourceExists` on create, :class:`ResourceConflict` on a stale revision,
:class:`ResourceNotFound` for missing or deleted keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.kv import KV_DEL, KV_OP, KV_PURGE, KeyValue

from sandpod_bus.capacity import insufficient_storage, out_of_storage
from sandpod_contract.errors import (
    ConnectionLost,
    ResourceConflict,
    ResourceExists,
    ResourceNotFound,
    StoreError,
)

__all__ = ["KvBucket", "KvEntry", "subject_matches"]

WRONG_LAST_SEQUENCE = 10071  # JetStream API error code of a failed compare-and-set
INACTIVE_THRESHOLD = 5.0  # seconds: see _consume
WATCH_BUFFER = 1024  # entries buffered per watcher before the consumer waits for the reader


@dataclasses.dataclass(frozen=True, slots=True)
class KvEntry:
    key: str
    value: bytes  # empty for deletions
    revision: int
    deleted: bool


class KvBucket:
    """One bucket. Get it with :meth:`sandpod_bus.Bus.kv`."""

    def __init__(self, js: JetStreamContext, kv: KeyValue, name: str) -> None:
        self._js = js
        self._kv = kv
        self.name = name
        self._stream = f"KV_{name}"

    async def get(self, key: str) -> KvEntry:
        """The current value. Raises ResourceNotFound if absent or deleted."""
        try:
            entry = await self._kv.get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError) as exc:
            raise ResourceNotFound(f"{key} not found", key=key) from exc
        except nats.errors.Error as exc:
            raise _store_error(exc) from exc
        if entry.revision is None:  # nats.py types it optional; a stored entry always has one
            raise ResourceNotFound(f"{key} has no revision (not stored yet)", key=key)
        return KvEntry(key, bytes(entry.value or b""), entry.revision, deleted=False)

    async def create(self, key: str, value: bytes) -> int:
        """Create ``key``; its revision. Raises ResourceExists if it exists."""
        try:
            return int(await self._kv.create(key, value))
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise ResourceExists(f"{key} exists", key=key) from exc
        except nats.errors.Error as exc:
            raise _store_error(exc) from exc

    async def update(self, key: str, value: bytes, revision: int) -> int:
        """Replace ``key`` if it is still at ``revision``. Raises ResourceConflict otherwise."""
        try:
            return int(await self._kv.update(key, value, last=revision))
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise ResourceConflict(f"{key} is no longer at revision {revision}", key=key) from exc
        except nats.errors.Error as exc:
            raise _store_error(exc) from exc

    async def delete(self, key: str, revision: int | None = None) -> None:
        """Delete ``key`` (only if still at ``revision`` when given)."""
        await self.get(key)  # NotFound for keys that are absent or already deleted
        try:
            await self._kv.delete(key, last=revision)
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise ResourceConflict(f"{key} is no longer at revision {revision}", key=key) from exc
        except nats.js.errors.APIError as exc:
            if exc.err_code == WRONG_LAST_SEQUENCE:  # nats-py reports delete's CAS failure raw
                raise ResourceConflict(
                    f"{key} is no longer at revision {revision}", key=key
                ) from exc
            raise _store_error(exc) from exc
        except nats.errors.Error as exc:
            raise _store_error(exc) from exc

    async def revision(self) -> int:
        """The bucket's latest revision (0 when empty)."""
        try:
            info = await self._js.stream_info(self._stream)
        except nats.errors.Error as exc:
            raise _store_error(exc) from exc
        return int(info.state.last_seq or 0)

    async def entries(self, pattern: str = ">") -> tuple[list[KvEntry], int]:
        """Every live entry whose key matches ``pattern``, and a revision to watch from.

        The revision is read before the keys, so a watch from it may repeat a change already
        reflected here (consumers compare revisions) but never misses one.
        """
        # The stream's per-subject state is exact, unlike a key watcher's "no more keys" marker
        # (which can fire before the first delivery and report an empty bucket).
        try:
            info = await self._js.stream_info(
                self._stream, subjects_filter=f"$KV.{self.name}.{pattern}"
            )
        except nats.errors.Error as exc:
            raise _store_error(exc) from exc
        revision = int(info.state.last_seq or 0)
        prefix = f"$KV.{self.name}."
        keys = [s[len(prefix) :] for s in (info.state.subjects or {})]
        out: list[KvEntry] = []
        for key in sorted(keys):
            with contextlib.suppress(ResourceNotFound):  # deleted since the key listing
                out.append(await self.get(key))
        return out, revision

    def watch(self, pattern: str = ">", from_revision: int = 0) -> AsyncIterator[KvEntry]:
        """Every change after ``from_revision``, in order, until the iterator is closed."""
        return self._consume(pattern, from_revision + 1)

    async def _consume(self, pattern: str, start: int) -> AsyncIterator[KvEntry]:
        queue: asyncio.Queue[KvEntry] = asyncio.Queue(maxsize=WATCH_BUFFER)
        prefix = f"$KV.{self.name}."

        async def on_msg(msg: Msg) -> None:
            op = (msg.header or {}).get(KV_OP)
            await queue.put(
                KvEntry(
                    key=msg.subject[len(prefix) :],
                    value=bytes(msg.data),
                    revision=int(msg.metadata.sequence.stream),
                    deleted=op in (KV_DEL, KV_PURGE),
                )
            )

        try:
            sub = await self._js.subscribe(
                f"{prefix}{pattern}",
                stream=self._stream,
                cb=on_msg,
                ordered_consumer=True,
                # a closed watch's consumer goes 5 s later (an open one, idle or not, has
                # interest and stays): the server caps a stream's consumers (1000) and every
                # wait on one object is a watch of its own -- at 60 s, 100 creates at once,
                # their waits and deletes' waits reached the cap within a minute
                inactive_threshold=INACTIVE_THRESHOLD,
                deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
                config=api.ConsumerConfig(opt_start_seq=max(start, 1)),
            )
        except nats.errors.Error as exc:
            raise _store_error(exc) from exc
        try:
            while True:
                yield await queue.get()
        finally:
            with contextlib.suppress(Exception):  # the connection may be gone at shutdown
                await sub.unsubscribe()


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcard matching: ``*`` is one token, a final ``>`` is one or more tokens."""
    pat, sub = pattern.split("."), subject.split(".")
    for i, part in enumerate(pat):
        if part == ">":
            return len(sub) > i
        if i >= len(sub) or (part != "*" and part != sub[i]):
            return False
    return len(pat) == len(sub)


def _store_error(exc: BaseException) -> StoreError:
    if isinstance(exc, nats.errors.ConnectionClosedError):
        return StoreError("NATS connection is closed", cause=type(exc).__name__)
    if isinstance(exc, nats.errors.TimeoutError | asyncio.TimeoutError):
        return StoreError("JetStream did not answer in time", cause="timeout")
    return StoreError(f"JetStream error: {exc}", cause=type(exc).__name__)


async def open_bucket(nc: NatsClient, name: str, history: int) -> KvBucket:
    """Open bucket ``name``, creating it if needed.

    Raises:
        InsufficientStorage: JetStream has no room left to create it.
        ConnectionLost, StoreError: the connection or JetStream failed.
    """
    js = nc.jetstream()
    try:
        kv = await js.key_value(name)
    except nats.js.errors.BucketNotFoundError:
        try:
            kv = await js.create_key_value(bucket=name, history=history)
        except nats.errors.Error as exc:
            if out_of_storage(exc):
                raise await insufficient_storage(
                    nc, what=f"KV bucket {name}", stream=f"KV_{name}", reserve=-1
                ) from exc
            raise _store_error(exc) from exc
    except nats.errors.ConnectionClosedError as exc:
        raise ConnectionLost("NATS connection is closed") from exc
    except nats.errors.Error as exc:
        raise _store_error(exc) from exc
    return KvBucket(js, kv, name)
