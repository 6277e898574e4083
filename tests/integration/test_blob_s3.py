"""The S3 blob store against a real versitygw: what only S3 has (credentials, accounts,
multipart, a server killed mid-body), beyond the shared contract suite
(test_blob_contract.py)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from test_blob_contract import CountingTransport, blob, leftovers, s3_settings

from s3server import S3Server
from sandpod_blobs import S3BlobStore, VerifiedFile
from sandpod_blobs.s3.client import S3Client
from sandpod_blobs.s3.settings import MIN_PART_SIZE
from sandpod_contract.errors import (
    BlobAuthFailed,
    BlobCorrupt,
    BlobError,
    BlobNotFound,
    BlobUnavailable,
)


@pytest.fixture
def s3_server(tmp_path: Path) -> Iterator[S3Server]:
    server = S3Server(tmp_path / "s3root")
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def owner(s3_server: S3Server) -> AsyncIterator[S3BlobStore]:
    """The store with the bucket owner's (root account's) credentials."""
    async with S3BlobStore(s3_settings(s3_server)) as store:
        await store.ensure_bucket()
        yield store


async def test_wrong_secret_cannot_read_or_write(
    s3_server: S3Server, owner: S3BlobStore, tmp_path: Path
) -> None:
    """A client with the right key id but a wrong secret gets BlobAuthFailed for every call,
    reads nothing and stores nothing."""
    src, digest = blob(tmp_path, b"tenant a's snapshot")
    await owner.put_file(src)
    settings = s3_settings(s3_server, secret_access_key="not-the-secret")
    other, other_digest = blob(tmp_path, b"planted by an attacker")
    async with S3BlobStore(settings) as intruder:
        with pytest.raises(BlobAuthFailed) as err:
            await intruder.get_file(digest, tmp_path / "stolen")
        assert err.value.code == "blob.auth_failed" and not err.value.retryable
        with pytest.raises(BlobAuthFailed):
            await intruder.stat(digest)
        with pytest.raises(BlobAuthFailed):
            await intruder.put_file(other)
        with pytest.raises(BlobAuthFailed):
            await intruder.delete(digest)
        with pytest.raises(BlobAuthFailed):
            await intruder.list()
    assert not (tmp_path / "stolen").exists() and leftovers(tmp_path) == []
    assert await owner.stat(digest) == len(b"tenant a's snapshot")
    assert await owner.stat(other_digest) is None


async def test_unknown_access_key_is_refused(s3_server: S3Server, owner: S3BlobStore) -> None:
    """An access key id the server does not know is BlobAuthFailed."""
    settings = s3_settings(s3_server, access_key_id="nobody", secret_access_key="x")
    async with S3BlobStore(settings) as stranger:
        with pytest.raises(BlobAuthFailed):
            await stranger.stat("sha256:" + "0" * 64)


async def test_another_account_cannot_read_the_bucket(
    s3_server: S3Server, owner: S3BlobStore, tmp_path: Path
) -> None:
    """Another tenant's valid account, with no grant on the bucket, can neither read nor
    overwrite a blob in it."""
    src, digest = blob(tmp_path, b"tenant a's layer")
    await owner.put_file(src)
    s3_server.add_user("tenant-b", "tenant-b-secret-0123456789")
    settings = s3_settings(
        s3_server, access_key_id="tenant-b", secret_access_key="tenant-b-secret-0123456789"
    )
    evil, _ = blob(tmp_path, b"x" * len(b"tenant a's layer"))
    async with S3BlobStore(settings) as tenant_b:
        with pytest.raises(BlobAuthFailed):
            await tenant_b.get_file(digest, tmp_path / "stolen")
        with pytest.raises(BlobAuthFailed):
            await tenant_b.put_file(evil)
    assert not (tmp_path / "stolen").exists()
    out = tmp_path / "mine"
    assert await owner.get_file(digest, out) == len(b"tenant a's layer")


async def test_large_blob_goes_up_in_parts(s3_server: S3Server, tmp_path: Path) -> None:
    """A blob larger than the part size is a multipart upload: one signed PUT per part."""
    counting = CountingTransport()
    data = os.urandom(2 * MIN_PART_SIZE + 10)
    src, digest = blob(tmp_path, data)
    async with S3BlobStore(s3_settings(s3_server), transport=counting) as store:
        await store.ensure_bucket()
        before = counting.sends
        await store.put_file(src)
        assert counting.sends - before == 3
        assert await store.get_file(digest, tmp_path / "back") == len(data)
    assert hashlib.sha256((tmp_path / "back").read_bytes()).hexdigest() == digest[7:]


async def test_missing_bucket_is_not_a_missing_blob(s3_server: S3Server) -> None:
    """A bucket that does not exist is a configuration error (BlobError, not retryable), never
    reported as 'no such blob' (which a snapshot restore would take as final for that blob)."""
    async with S3BlobStore(s3_settings(s3_server, bucket="nope")) as store:
        with pytest.raises(BlobError) as err:
            await store.get_file("sha256:" + "1" * 64, Path("/nonexistent/never"))
    assert not isinstance(err.value, BlobNotFound) and not err.value.retryable
    assert err.value.details["s3_code"] == "NoSuchBucket"


async def test_server_killed_mid_download(
    s3_server: S3Server, owner: S3BlobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that dies while a blob streams gives BlobUnavailable (retryable) and leaves no
    file, whole or partial, at the destination."""
    data = os.urandom(48 * 1024 * 1024)  # well past what socket buffers hold
    src, digest = blob(tmp_path, data)
    await owner.put_file(src)
    real_write = VerifiedFile.write

    def write_then_kill(self: VerifiedFile, chunk: bytes) -> None:
        real_write(self, chunk)
        s3_server.kill()  # after the first chunk has landed in the temp file

    monkeypatch.setattr(VerifiedFile, "write", write_then_kill)
    dest = tmp_path / "restore" / "layer"
    dest.parent.mkdir()
    with pytest.raises(BlobUnavailable) as err:
        await owner.get_file(digest, dest)
    assert err.value.retryable and err.value.code == "blob.unavailable"
    assert list(dest.parent.iterdir()) == []


async def test_server_down_is_unavailable(
    owner: S3BlobStore, s3_server: S3Server, tmp_path: Path
) -> None:
    """No server at the endpoint: every call is BlobUnavailable, never a hang or a raw error."""
    s3_server.kill()
    src, _ = blob(tmp_path, b"data")
    with pytest.raises(BlobUnavailable):
        await owner.put_file(src)
    with pytest.raises(BlobUnavailable):
        await owner.stat("sha256:" + "2" * 64)
    with pytest.raises(BlobUnavailable):
        await owner.get_file("sha256:" + "2" * 64, tmp_path / "x")
    assert not (tmp_path / "x").exists()


async def test_object_overwritten_through_the_api_is_refused(
    s3_server: S3Server, owner: S3BlobStore, tmp_path: Path
) -> None:
    """Someone with write access replaces a blob's object with other bytes through the S3 API
    (the server's own checksums then match the new bytes): get_file still refuses it."""
    data = os.urandom(100_000)
    src, digest = blob(tmp_path, data)
    await owner.put_file(src)
    evil = b"\0" * len(data)
    client = S3Client(s3_settings(s3_server))
    try:
        await client.call(
            "PUT",
            f"blobs/{digest}",
            body=evil,
            payload_sha256=hashlib.sha256(evil).hexdigest(),
        )
    finally:
        await client.aclose()
    dest = tmp_path / "dest"
    with pytest.raises(BlobCorrupt):
        await owner.get_file(digest, dest)
    assert not dest.exists() and leftovers(tmp_path) == []
