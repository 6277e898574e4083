"""API keys: issued once, stored hashed in a JetStream KV bucket, mapped to a tenant.

A key is ``spk_<key_id>_<secret>``. The bucket ``<prefix>-gateway-keys`` holds, under
``<key_id>``, a JSON record with the tenant, the SHA-256 of the whole key (the secret has 192
random bits, so a fast hash is enough: nothing to brute-force) and whether it is revoked; the key
itself is printed once at creation and never stored. Every replica keeps a bounded cache of
records it verified and drops an entry as soon as the bucket's watch reports a change to it, so a
revocation reaches all replicas within one watch delivery.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import hashlib
import hmac
import json
import re
import secrets
import time
from collections.abc import Callable

import structlog

from sandpod_bus import Bus, KvBucket
from sandpod_contract.errors import ResourceExists, ResourceNotFound, SandpodError
from sandpod_gateway.errors import Unauthenticated
from sandpod_gateway.tenancy import validate_tenant

__all__ = ["ApiKey", "KeyStore", "bucket_name", "parse_token"]

log = structlog.get_logger("sandpod.gateway.keys")

_TOKEN = re.compile(r"spk_([0-9a-f]{12})_([0-9a-f]{48})")
_KEY_ID = re.compile(r"[0-9a-f]{12}")
SECRET_PREFIX = "secret-"  # noqa: S105 (a name, not a secret): bucket entries that hold the installation's secrets, not keys


def bucket_name(base: str) -> str:
    return f"{base}-gateway-keys"


def parse_token(token: str) -> str | None:
    """The key id of a well-formed key, else None."""
    m = _TOKEN.fullmatch(token)
    return m.group(1) if m else None


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclasses.dataclass(frozen=True, slots=True)
class ApiKey:
    key_id: str
    tenant: str
    digest: str
    created: float
    revoked: bool = False
    name: str = ""
    admin: bool = False  # may read /metrics (operators' and scrapers' keys)
    permanent: bool = False  # may create sandboxes that never expire

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self)).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ApiKey:
        raw = json.loads(data)
        return cls(
            key_id=str(raw["key_id"]),
            tenant=str(raw["tenant"]),
            digest=str(raw["digest"]),
            created=float(raw["created"]),
            revoked=bool(raw.get("revoked", False)),
            name=str(raw.get("name", "")),
            admin=bool(raw.get("admin", False)),
            permanent=bool(raw.get("permanent", False)),
        )


class KeyStore:
    """Issue, revoke and verify keys; verification is cached per replica (bounded)."""

    def __init__(self, bucket: KvBucket, cache_size: int = 4096) -> None:
        self._bucket = bucket
        self._cache: collections.OrderedDict[str, ApiKey] = collections.OrderedDict()
        self._cache_size = cache_size
        # called when a cached record changes or leaves (the native front's epoch)
        self.on_change: Callable[[], None] = _nothing

    @classmethod
    async def open(cls, bus: Bus, base: str, cache_size: int = 4096) -> KeyStore:
        return cls(await bus.kv(bucket_name(base)), cache_size)

    async def create(
        self, tenant: str, name: str = "", *, admin: bool = False, permanent: bool = False
    ) -> tuple[str, ApiKey]:
        """A new key for ``tenant``: (the key, shown once; its record). ``admin`` lets it read
        ``/metrics``; ``permanent`` lets it create sandboxes that never expire."""
        validate_tenant(tenant)
        key_id = secrets.token_hex(6)
        token = f"spk_{key_id}_{secrets.token_hex(24)}"
        record = ApiKey(
            key_id, tenant, _digest(token), time.time(), name=name, admin=admin, permanent=permanent
        )
        await self._bucket.create(key_id, record.to_json())
        return token, record

    async def revoke(self, key_id: str) -> ApiKey:
        """Mark ``key_id`` revoked (kept for audit). Raises ResourceNotFound if unknown."""
        entry = await self._bucket.get(key_id)
        record = dataclasses.replace(ApiKey.from_json(entry.value), revoked=True)
        await self._bucket.update(key_id, record.to_json(), entry.revision)
        self._cache.pop(key_id, None)
        return record

    async def list(self) -> list[ApiKey]:
        entries, _ = await self._bucket.entries()
        return [ApiKey.from_json(e.value) for e in entries if _KEY_ID.fullmatch(e.key)]

    async def by_id(self, key_id: str) -> ApiKey:
        """The live record of ``key_id`` (a preview link's issuing key).

        Raises:
            Unauthenticated: unknown or revoked.
        """
        record = self._cache.get(key_id)
        if record is None:
            if not _KEY_ID.fullmatch(key_id):
                raise Unauthenticated()
            try:
                record = ApiKey.from_json((await self._bucket.get(key_id)).value)
            except ResourceNotFound:
                raise Unauthenticated() from None
            self._remember(record)
        if record.revoked:
            raise Unauthenticated()
        return record

    async def secret(self, name: str) -> bytes:
        """The installation's secret ``name`` (32 random bytes), made by the first replica that
        asks and shared by all through the bucket (only the gateway's NATS user reads it).
        Its entry name is not a key id, so it is never taken for a key."""
        entry_name = f"{SECRET_PREFIX}{name}"
        try:
            return bytes.fromhex((await self._bucket.get(entry_name)).value.decode())
        except ResourceNotFound:
            pass
        with contextlib.suppress(ResourceExists):  # another replica made it first: use theirs
            await self._bucket.create(entry_name, secrets.token_hex(32).encode())
        return bytes.fromhex((await self._bucket.get(entry_name)).value.decode())

    async def verify(self, token: str) -> ApiKey:
        """The live record of ``token``.

        Raises:
            Unauthenticated: malformed, unknown, wrong secret or revoked.
        """
        key_id = parse_token(token)
        if key_id is None:
            raise Unauthenticated()
        record = self._cache.get(key_id)
        if record is None:
            try:
                record = ApiKey.from_json((await self._bucket.get(key_id)).value)
            except ResourceNotFound:
                raise Unauthenticated() from None
            self._remember(record)
        else:
            self._cache.move_to_end(key_id)
        if record.revoked or not hmac.compare_digest(record.digest, _digest(token)):
            raise Unauthenticated()
        return record

    def still_cached(self, record: ApiKey) -> bool:
        """Whether ``record`` is still the cached record of its key and not revoked (the watch
        drops a record the moment the bucket changes it)."""
        return self._cache.get(record.key_id) is record and not record.revoked

    async def still_valid(self, record: ApiKey) -> ApiKey:
        """The live record of a key verified earlier (a WebSocket ticket's).

        Raises:
            Unauthenticated: revoked (or replaced) since.
        """
        live = self._cache.get(record.key_id)
        if live is None:
            try:
                live = ApiKey.from_json((await self._bucket.get(record.key_id)).value)
            except ResourceNotFound:
                raise Unauthenticated() from None
            self._remember(live)
        if live.revoked or live.digest != record.digest:
            raise Unauthenticated()
        return live

    def _remember(self, record: ApiKey) -> None:
        self._cache[record.key_id] = record
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
            self.on_change()

    async def follow(self, stopping: asyncio.Event) -> None:
        """Drop cached records the moment the bucket changes them, until ``stopping`` is set."""
        watcher = asyncio.ensure_future(self._follow())
        stopper = asyncio.ensure_future(stopping.wait())
        try:
            await asyncio.wait({watcher, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (watcher, stopper):
                task.cancel()
            await asyncio.gather(watcher, stopper, return_exceptions=True)

    async def _follow(self) -> None:
        backoff = 0.1
        while True:
            try:
                start = await self._bucket.revision()
                async for entry in self._bucket.watch(">", start):
                    self._cache.pop(entry.key, None)
                    self.on_change()
                    backoff = 0.1
            except SandpodError as exc:
                log.warning("key_watch_failed", error=exc.message)
                self._cache.clear()  # we may have missed changes meanwhile
                self.on_change()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)


def _nothing() -> None:
    pass
