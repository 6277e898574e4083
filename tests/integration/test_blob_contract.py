"""The blob-store contract suite: every BlobStore (in-memory fake, JetStream object store on a
real nats-server, S3 on a real versitygw) passes the same tests, so the snapshot code can rely on
one set of semantics: byte-exact round trips, idempotent puts, typed errors, and a corrupted
object refused without a byte of it landing at the destination."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import pytest

from conftest import NatsServer
from s3server import S3Server
from sandpod_blobs import (
    BlobRef,
    BlobStore,
    JetStreamBlobStore,
    MemoryBlobStore,
    S3BlobStore,
    S3Settings,
)
from sandpod_blobs.s3.settings import MIN_PART_SIZE
from sandpod_bus import Bus, BusSettings
from sandpod_contract.errors import BlobCorrupt, BlobInvalidDigest, BlobNotFound

BIG = 2 * MIN_PART_SIZE + 1234  # several multipart parts on S3, ~100 chunks on JetStream


@dataclasses.dataclass
class Harness:
    """One store under test, and what the tests need to reach behind its back."""

    store: BlobStore
    tamper: Callable[[str, bytes], Awaitable[None]]  # overwrite the stored bytes of a digest
    uploads: Callable[[], int]  # how many uploads actually sent bytes so far


class CountingTransport(httpx.AsyncBaseTransport):
    """A real httpx transport that counts the requests that send an object's bytes."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.sends = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "PUT":
            self.sends += 1
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.fixture
def s3_server(tmp_path: Path) -> Iterator[S3Server]:
    server = S3Server(tmp_path / "s3root")
    server.start()
    yield server
    server.stop()


def s3_settings(server: S3Server, **over: str) -> S3Settings:
    base = {
        "endpoint": server.endpoint,
        "bucket": "snapshots",
        "access_key_id": server.access_key,
        "secret_access_key": server.secret_key,
        "prefix": "blobs/",
        "part_size": MIN_PART_SIZE,
        **over,
    }
    return S3Settings(**base)  # type: ignore[arg-type]


@pytest.fixture(params=["memory", "jetstream", "s3"])
async def harness(request: pytest.FixtureRequest, nats: NatsServer) -> AsyncIterator[Harness]:
    if request.param == "memory":
        mem = MemoryBlobStore()

        async def tamper_mem(digest: str, data: bytes) -> None:
            mem.tamper(digest, data)

        yield Harness(mem, tamper_mem, lambda: mem.puts)
        return
    if request.param == "s3":
        server: S3Server = request.getfixturevalue("s3_server")
        counting = CountingTransport()
        s3 = S3BlobStore(s3_settings(server), transport=counting)
        await s3.ensure_bucket()
        sends_after_setup = counting.sends

        async def tamper_s3(digest: str, data: bytes) -> None:
            # Behind the server's back, on its backing file system.
            server.object_path("snapshots", f"blobs/{digest}").write_bytes(data)

        yield Harness(s3, tamper_s3, lambda: counting.sends - sends_after_setup)
        await s3.aclose()
        return
    bus = await Bus.connect(BusSettings(url=nats.url))
    bucket = await bus.objects(f"blobs-{uuid.uuid4().hex[:12]}")
    puts = 0
    real_put = bucket.put_file

    async def counting_put(key: str, path: Path) -> None:
        nonlocal puts
        puts += 1
        await real_put(key, path)

    bucket.put_file = counting_put  # type: ignore[method-assign]

    async def tamper_js(digest: str, data: bytes) -> None:
        # Through the raw object-store API: the bucket's own digest then matches the new bytes,
        # so only the blob store's check against the key can catch it.
        await bucket.put_stream(digest, io.BytesIO(data))

    yield Harness(JetStreamBlobStore(bucket), tamper_js, lambda: puts)
    await bus.close()


def blob(tmp_path: Path, data: bytes, name: str | None = None) -> tuple[Path, str]:
    path = tmp_path / (name or f"src-{uuid.uuid4().hex[:8]}")
    path.write_bytes(data)
    return path, f"sha256:{hashlib.sha256(data).hexdigest()}"


def leftovers(directory: Path) -> list[str]:
    """Temporary files a get left behind (VerifiedFile's .part files)."""
    return [p.name for p in directory.iterdir() if p.name.endswith(".part")]


@pytest.mark.parametrize("size", [0, 1, 1000, BIG], ids=["empty", "1B", "1KB", "multi-MiB"])
async def test_round_trip_is_byte_exact(harness: Harness, tmp_path: Path, size: int) -> None:
    """put_file then get_file gives back the same bytes, digest and size (empty and multi-MiB)."""
    data = os.urandom(size)
    src, digest = blob(tmp_path, data)
    ref = await harness.store.put_file(src)
    assert ref == BlobRef(digest, size)
    out = tmp_path / "out" / "restored"
    out.parent.mkdir()
    assert await harness.store.get_file(digest, out) == size
    assert out.read_bytes() == data
    assert leftovers(out.parent) == []


async def test_put_is_idempotent(harness: Harness, tmp_path: Path) -> None:
    """Putting the same content twice (even from another file) uploads it once."""
    data = os.urandom(70_000)
    first, digest = blob(tmp_path, data)
    second, _ = blob(tmp_path, data)
    assert (await harness.store.put_file(first)).digest == digest
    assert harness.uploads() == 1
    assert (await harness.store.put_file(second)).digest == digest
    assert harness.uploads() == 1
    assert await harness.store.stat(digest) == len(data)


async def test_stat_list_delete(harness: Harness, tmp_path: Path) -> None:
    """stat and list see a stored blob; delete removes it and is idempotent."""
    a, da = blob(tmp_path, b"alpha")
    b, db = blob(tmp_path, b"beta!!")
    assert await harness.store.list() == []
    assert await harness.store.stat(da) is None
    await harness.store.put_file(a)
    await harness.store.put_file(b)
    assert await harness.store.stat(da) == 5
    assert sorted(await harness.store.list(), key=lambda r: r.size) == [
        BlobRef(da, 5),
        BlobRef(db, 6),
    ]
    await harness.store.delete(da)
    assert await harness.store.stat(da) is None
    assert await harness.store.list() == [BlobRef(db, 6)]
    await harness.store.delete(da)  # already gone: not an error (GC retries)
    with pytest.raises(BlobNotFound):
        await harness.store.get_file(da, tmp_path / "gone")


async def test_missing_blob_is_not_found(harness: Harness, tmp_path: Path) -> None:
    """Getting a digest the store never had is BlobNotFound and writes nothing."""
    digest = "sha256:" + "ab" * 32
    dest = tmp_path / "dest"
    with pytest.raises(BlobNotFound) as err:
        await harness.store.get_file(digest, dest)
    assert err.value.code == "blob.not_found" and not err.value.retryable
    assert not dest.exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize("same_size", [True, False], ids=["same-size", "other-size"])
async def test_corrupted_object_is_refused(
    harness: Harness, tmp_path: Path, same_size: bool
) -> None:
    """A stored object whose bytes no longer match its digest is refused with BlobCorrupt; the
    destination keeps its old content and no partial file is left."""
    data = os.urandom(300_000)
    src, digest = blob(tmp_path, data)
    await harness.store.put_file(src)
    evil = bytearray(data)
    evil[150_000] ^= 0xFF
    await harness.tamper(digest, bytes(evil) if same_size else bytes(evil) + b"more")
    dest = tmp_path / "restore" / "layer.tar"
    dest.parent.mkdir()
    dest.write_bytes(b"previous content")
    with pytest.raises(BlobCorrupt) as err:
        await harness.store.get_file(digest, dest)
    assert err.value.code == "blob.corrupt" and err.value.details["digest"] == digest
    assert dest.read_bytes() == b"previous content"
    assert leftovers(dest.parent) == []


BAD_DIGESTS = [
    "",
    "sha256:",
    "sha256:" + "a" * 63,
    "sha256:" + "a" * 65,
    "sha256:" + "A" * 64,
    "sha512:" + "a" * 64,
    "sha256:" + "a" * 64 + "/../x",
    "../../etc/passwd",
    "sha256:../../" + "a" * 58,
    "a" * 64,
]


@pytest.mark.parametrize("bad", BAD_DIGESTS)
async def test_bad_digest_is_refused(harness: Harness, tmp_path: Path, bad: str) -> None:
    """Anything but sha256:<64 lowercase hex> is BlobInvalidDigest before any I/O."""
    with pytest.raises(BlobInvalidDigest):
        await harness.store.get_file(bad, tmp_path / "dest")
    with pytest.raises(BlobInvalidDigest):
        await harness.store.stat(bad)
    with pytest.raises(BlobInvalidDigest):
        await harness.store.delete(bad)
    assert not (tmp_path / "dest").exists() and leftovers(tmp_path) == []


async def test_list_ignores_foreign_objects(harness: Harness, tmp_path: Path) -> None:
    """list returns only digest-named blobs, even when the store holds others."""
    src, digest = blob(tmp_path, b"mine")
    await harness.store.put_file(src)
    refs = await harness.store.list()
    assert refs == [BlobRef(digest, 4)]
