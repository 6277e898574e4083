"""Blob-store parts that need no server: the SigV4 signer on AWS's published examples, the S3
settings from the environment, S3 error mapping, and the verified writer's refusals."""

from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path

import httpx
import pytest

from sandpod_blobs import S3BlobStore, S3Settings, VerifiedFile, check_digest
from sandpod_blobs.s3.settings import MIN_PART_SIZE
from sandpod_blobs.s3.sigv4 import EMPTY_SHA256, canonical_query, quote_path, sign
from sandpod_contract.errors import (
    BadRequest,
    BlobAuthFailed,
    BlobCorrupt,
    BlobInvalidDigest,
    BlobUnavailable,
)

AWS_KEY = "AKIAIOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
AWS_TIME = dt.datetime(2013, 5, 24, tzinfo=dt.UTC)


def _signature(headers: dict[str, str]) -> str:
    return headers["authorization"].rsplit("Signature=", 1)[1]


def test_sigv4_matches_aws_get_object_example() -> None:
    """The signer reproduces AWS's documented signature for GET /test.txt with a Range."""
    headers = sign(
        method="GET",
        host="examplebucket.s3.amazonaws.com",
        path="/test.txt",
        query="",
        headers={"range": "bytes=0-9"},
        payload_sha256=EMPTY_SHA256,
        region="us-east-1",
        access_key=AWS_KEY,
        secret_key=AWS_SECRET,
        now=AWS_TIME,
    )
    assert _signature(headers) == "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    assert "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date," in headers["authorization"]


def test_sigv4_matches_aws_list_objects_example() -> None:
    """The signer reproduces AWS's documented signature for GET /?max-keys=2&prefix=J."""
    headers = sign(
        method="GET",
        host="examplebucket.s3.amazonaws.com",
        path="/",
        query=canonical_query([("prefix", "J"), ("max-keys", "2")]),
        headers={},
        payload_sha256=EMPTY_SHA256,
        region="us-east-1",
        access_key=AWS_KEY,
        secret_key=AWS_SECRET,
        now=AWS_TIME,
    )
    assert _signature(headers) == "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"


def test_paths_and_queries_are_encoded_for_signing() -> None:
    """A digest key's ':' is percent-encoded, '/' kept; query values encode '/' too."""
    assert quote_path("/b/snap/sha256:ab") == "/b/snap/sha256%3Aab"
    assert canonical_query([("prefix", "a/b"), ("list-type", "2")]) == "list-type=2&prefix=a%2Fb"


def test_settings_from_env(tmp_path: Path) -> None:
    """S3Settings reads SANDPOD_SNAPSHOT_S3_*, keys from the env or from a credentials file."""
    env = {
        "SANDPOD_SNAPSHOT_S3_ENDPOINT": "http://127.0.0.1:9000/",
        "SANDPOD_SNAPSHOT_S3_BUCKET": "snaps",
        "SANDPOD_SNAPSHOT_S3_ACCESS_KEY_ID": "id",
        "SANDPOD_SNAPSHOT_S3_SECRET_ACCESS_KEY": "secret",
        "SANDPOD_SNAPSHOT_S3_PREFIX": "cluster-a/",
    }
    s = S3Settings.from_env(env)
    assert (s.endpoint, s.bucket, s.region, s.prefix) == (
        "http://127.0.0.1:9000",
        "snaps",
        "us-east-1",
        "cluster-a/",
    )
    assert "secret" not in repr(s)
    creds = tmp_path / "credentials"
    creds.write_text("[default]\naws_access_key_id = fileid\naws_secret_access_key = filesecret\n")
    env.pop("SANDPOD_SNAPSHOT_S3_SECRET_ACCESS_KEY")
    s = S3Settings.from_env({**env, "SANDPOD_SNAPSHOT_S3_CREDENTIALS_FILE": str(creds)})
    assert (s.access_key_id, s.secret_access_key) == ("fileid", "filesecret")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SANDPOD_SNAPSHOT_S3_ENDPOINT", "127.0.0.1:9000"),
        ("SANDPOD_SNAPSHOT_S3_PART_SIZE", str(MIN_PART_SIZE - 1)),
        ("SANDPOD_SNAPSHOT_S3_PART_SIZE", "lots"),
        ("SANDPOD_SNAPSHOT_S3_BUCKET", "a/b"),
        ("SANDPOD_SNAPSHOT_S3_CREDENTIALS_FILE", "/nonexistent/creds"),
    ],
)
def test_bad_settings_are_refused(name: str, value: str) -> None:
    """A malformed or missing setting is a BadRequest naming it, at start."""
    env = {
        "SANDPOD_SNAPSHOT_S3_ENDPOINT": "http://127.0.0.1:9000",
        "SANDPOD_SNAPSHOT_S3_BUCKET": "snaps",
        "SANDPOD_SNAPSHOT_S3_ACCESS_KEY_ID": "id",
        "SANDPOD_SNAPSHOT_S3_SECRET_ACCESS_KEY": "secret",
        name: value,
    }
    with pytest.raises(BadRequest):
        S3Settings.from_env(env)


def test_missing_credentials_are_refused() -> None:
    """No key id or secret at all is a BadRequest."""
    with pytest.raises(BadRequest):
        S3Settings.from_env(
            {"SANDPOD_SNAPSHOT_S3_ENDPOINT": "http://h", "SANDPOD_SNAPSHOT_S3_BUCKET": "b"}
        )


def _settings() -> S3Settings:
    return S3Settings(
        endpoint="http://s3.test",
        bucket="b",
        access_key_id="k",
        secret_access_key="s",
        part_size=MIN_PART_SIZE,
    )


@pytest.mark.parametrize(
    ("status", "code", "error"),
    [
        (503, "SlowDown", BlobUnavailable),
        (500, "InternalError", BlobUnavailable),
        (403, "SignatureDoesNotMatch", BlobAuthFailed),
        (403, "AccessDenied", BlobAuthFailed),
    ],
)
async def test_s3_statuses_map_to_blob_errors(
    tmp_path: Path, status: int, code: str, error: type[Exception]
) -> None:
    """S3 error answers become the contract's blob errors (retryable ones for 5xx)."""

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=f"<Error><Code>{code}</Code></Error>".encode())

    async with S3BlobStore(_settings(), transport=httpx.MockTransport(answer)) as store:
        with pytest.raises(error):
            await store.get_file("sha256:" + "a" * 64, tmp_path / "x")
    assert list(tmp_path.iterdir()) == []


async def test_failed_multipart_completion_aborts_the_upload(tmp_path: Path) -> None:
    """A CompleteMultipartUpload answered 200 with an error body is a failure, and the upload
    is aborted (no orphaned parts)."""
    seen: list[tuple[str, str]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.query.decode()))
        if request.method == "HEAD":
            return httpx.Response(404)
        if request.method == "POST" and b"uploads" in request.url.query:
            return httpx.Response(200, content=b"<R><UploadId>u1</UploadId></R>")
        if request.method == "PUT":
            return httpx.Response(200, headers={"etag": '"e"'})
        if request.method == "POST":
            return httpx.Response(200, content=b"<Error><Code>InternalError</Code></Error>")
        return httpx.Response(204)

    src = tmp_path / "big"
    src.write_bytes(b"z" * (MIN_PART_SIZE + 1))
    async with S3BlobStore(_settings(), transport=httpx.MockTransport(answer)) as store:
        with pytest.raises(BlobUnavailable):
            await store.put_file(src)
    assert seen[-1] == ("DELETE", "uploadId=u1")
    assert [m for m, _ in seen].count("PUT") == 2


def test_verified_file_refuses_more_bytes_than_announced(tmp_path: Path) -> None:
    """A store that sends more than the size it announced is refused at once, nothing kept."""
    data = b"abc"
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    with VerifiedFile(tmp_path / "d", digest, 2) as out, pytest.raises(BlobCorrupt):
        out.write(data)
    assert list(tmp_path.iterdir()) == []


def test_verified_file_removes_its_temp_on_error(tmp_path: Path) -> None:
    """An exception inside the block (a transfer that broke) removes the temp file."""
    with pytest.raises(RuntimeError), VerifiedFile(tmp_path / "d", "sha256:" + "0" * 64, None):
        raise RuntimeError("broken transfer")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bad", [None, 5, b"sha256:" + b"a" * 64, "SHA256:" + "a" * 64])
def test_check_digest_refuses_non_digests(bad: object) -> None:
    """check_digest refuses non-strings and wrong spellings with BlobInvalidDigest."""
    with pytest.raises(BlobInvalidDigest) as err:
        check_digest(bad)
    assert err.value.code == "blob.invalid_digest"


async def test_s3_list_follows_continuation_tokens() -> None:
    """list pages through ListObjectsV2 with the continuation token, and keeps only digest
    keys under the prefix."""
    d1, d2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    pages = {
        "": f"<ListBucketResult><IsTruncated>true</IsTruncated>"
        f"<Contents><Key>{d1}</Key><Size>1</Size></Contents>"
        f"<Contents><Key>notes.txt</Key><Size>5</Size></Contents>"
        f"<NextContinuationToken>tok/1</NextContinuationToken></ListBucketResult>",
        "tok/1": f"<ListBucketResult><IsTruncated>false</IsTruncated>"
        f"<Contents><Key>{d2}</Key><Size>2</Size></Contents></ListBucketResult>",
    }
    tokens: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        token = request.url.params.get("continuation-token", "")
        tokens.append(token)
        assert request.url.params["list-type"] == "2"
        return httpx.Response(200, content=pages[token].encode())

    async with S3BlobStore(_settings(), transport=httpx.MockTransport(answer)) as store:
        refs = await store.list()
    assert [(r.digest, r.size) for r in refs] == [(d1, 1), (d2, 2)]
    assert tokens == ["", "tok/1"]
