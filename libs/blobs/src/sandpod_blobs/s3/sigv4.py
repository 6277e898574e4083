"""AWS Signature Version 4 for S3 requests, signed header-style (no presigned URLs).

Why our own signer: the S3 calls the blob store needs are seven (HEAD, GET, PUT, DELETE, list,
and the three multipart calls); botocore/aiobotocore would bring ~15 MB and their own HTTP stack
for that, while SigV4 is a short, fully specified algorithm. Payloads are always signed with their
real SHA-256 (bodies are at most one multipart part, held in memory anyway), so the server checks
every body's integrity too; ``UNSIGNED-PAYLOAD`` is never sent.

The canonical request is built from exactly the path and query the caller will send: callers pass
the already-encoded path (:func:`quote_path`) and the query as pairs, and send both verbatim.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from urllib.parse import quote

__all__ = ["EMPTY_SHA256", "canonical_query", "quote_path", "sign"]

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_ALGORITHM = "AWS4-HMAC-SHA256"


def quote_path(path: str) -> str:
    """URI-encode a path the way S3 signs it: every byte but unreserved characters and ``/``."""
    return quote(path, safe="/-_.~")


def canonical_query(params: Sequence[tuple[str, str]]) -> str:
    """The query string, encoded and sorted as SigV4 wants (``/`` encoded too)."""
    encoded = sorted((quote(k, safe="-_.~"), quote(v, safe="-_.~")) for k, v in params)
    return "&".join(f"{k}={v}" for k, v in encoded)


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def sign(
    *,
    method: str,
    host: str,
    path: str,
    query: str,
    headers: Mapping[str, str],
    payload_sha256: str,
    region: str,
    access_key: str,
    secret_key: str,
    now: dt.datetime,
) -> dict[str, str]:
    """The headers to add to a request so S3 accepts it.

    Args:
        path: the encoded path as sent (:func:`quote_path`).
        query: the encoded query as sent (:func:`canonical_query`).
        headers: other headers to sign (lowercase names), e.g. ``content-length``.
        payload_sha256: hex SHA-256 of the body (``EMPTY_SHA256`` for none).
        now: the signing time (UTC).

    Returns:
        ``host``, ``x-amz-date``, ``x-amz-content-sha256`` and ``authorization``.
    """
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    signed = {
        **{k.lower(): " ".join(v.split()) for k, v in headers.items()},
        "host": host,
        "x-amz-date": amz_date,
        "x-amz-content-sha256": payload_sha256,
    }
    names = sorted(signed)
    canonical = "\n".join(
        [
            method,
            path,
            query,
            "".join(f"{n}:{signed[n]}\n" for n in names),
            ";".join(names),
            payload_sha256,
        ]
    )
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(
        [_ALGORITHM, amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = _hmac(f"AWS4{secret_key}".encode(), day)
    for part in (region, "s3", "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    auth = (
        f"{_ALGORITHM} Credential={access_key}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return {
        "host": host,
        "x-amz-date": amz_date,
        "x-amz-content-sha256": payload_sha256,
        "authorization": auth,
    }
