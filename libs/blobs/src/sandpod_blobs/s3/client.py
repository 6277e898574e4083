"""The S3 REST calls the blob store makes, signed (SigV4) and with S3's errors mapped once.

This is the transport half of the S3 store: it knows S3's wire (path-style URLs, XML bodies,
status codes) and nothing of digests. Every failure leaves it as a contract blob error:

- no connection, a reset, a body cut short, a timeout, 5xx, 429/503 ``SlowDown``:
  ``BlobUnavailable`` (retryable);
- 401/403 (``AccessDenied``, ``InvalidAccessKeyId``, ``SignatureDoesNotMatch``): ``BlobAuthFailed``;
- 404 on an object: ``BlobNotFound``; anything else: ``BlobError`` with the status and S3 code.
"""

from __future__ import annotations

import datetime as dt
import xml.etree.ElementTree as ET
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

import httpx

from sandpod_blobs.s3.settings import S3Settings
from sandpod_blobs.s3.sigv4 import EMPTY_SHA256, canonical_query, quote_path, sign
from sandpod_contract.errors import (
    BlobAuthFailed,
    BlobError,
    BlobNotFound,
    BlobUnavailable,
    SandpodError,
)

__all__ = ["S3Client", "xml_text", "xml_values"]

_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
_AUTH_STATUSES = frozenset({401, 403})
_RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


def _parse(body: bytes) -> ET.Element | None:
    try:
        # The body comes from the configured store. ElementTree fetches no external entities,
        # and the expat it ships (>= 2.4.1) refuses entity-expansion bombs.
        return ET.fromstring(body)  # noqa: S314
    except ET.ParseError:
        return None


def xml_values(body: bytes, path: str) -> list[str]:
    """The text of every element at ``path`` (``/``-separated local names) in an S3 XML body."""
    root = _parse(body)
    if root is None:
        return []
    nodes = [root]
    for name in path.split("/"):
        nodes = [c for n in nodes for c in n if c.tag in (name, _NS + name)]
    return [n.text or "" for n in nodes]


def xml_text(body: bytes, path: str) -> str | None:
    """The first value at ``path``, or None."""
    found = xml_values(body, path)
    return found[0] if found else None


def s3_error(status: int, body: bytes, key: str | None, digest: str | None) -> SandpodError:
    """The blob error for an S3 error response."""
    code = xml_text(body, "Code") if body else None
    what = f"S3 answered {status}" + (f" {code}" if code else "") + (f" for {key}" if key else "")
    if status in _AUTH_STATUSES:
        return BlobAuthFailed(what, status=status)
    if status in _RETRY_STATUSES:
        return BlobUnavailable(what, digest=digest)
    if status == 404 and key is not None and code in (None, "NoSuchKey"):
        return BlobNotFound(what, digest=digest)
    return BlobError(what, digest=digest, status=status, s3_code=code)


class S3Client:
    """Signed requests to one bucket of an S3-compatible endpoint (path-style)."""

    def __init__(
        self,
        settings: S3Settings,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], dt.datetime] | None = None,
    ) -> None:
        self.settings = settings
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.timeout), transport=transport, follow_redirects=False
        )
        self._url = httpx.URL(settings.endpoint)
        self._clock = clock or (lambda: dt.datetime.now(dt.UTC))

    async def aclose(self) -> None:
        await self._http.aclose()

    def _request(
        self,
        method: str,
        key: str | None,
        params: Sequence[tuple[str, str]],
        body: bytes | AsyncIterable[bytes],
        payload_sha256: str,
        *,
        length: int | None = None,
    ) -> httpx.Request:
        """``body``: bytes, or chunks streamed from disk whose total is ``length``."""
        base = self._url.raw_path.decode().rstrip("/")
        path = quote_path(f"{base}/{self.settings.bucket}" + (f"/{key}" if key else ""))
        query = canonical_query(params)
        host = self._url.netloc.decode()
        if length is None:
            length = len(body) if isinstance(body, bytes) else 0
        headers = {"content-length": str(length)} if length or method in ("PUT", "POST") else {}
        headers |= sign(
            method=method,
            host=host,
            path=path,
            query=query,
            headers=headers,
            payload_sha256=payload_sha256,
            region=self.settings.region,
            access_key=self.settings.access_key_id,
            secret_key=self.settings.secret_access_key,
            now=self._clock(),
        )
        url = f"{self._url.scheme}://{host}{path}" + (f"?{query}" if query else "")
        # The explicit content-length also keeps httpx from sending a streamed body chunked.
        return self._http.build_request(method, url, headers=headers, content=body or None)

    async def call(
        self,
        method: str,
        key: str | None,
        params: Sequence[tuple[str, str]] = (),
        *,
        body: bytes | AsyncIterable[bytes] = b"",
        length: int | None = None,
        payload_sha256: str = EMPTY_SHA256,
        digest: str | None = None,
        ok_statuses: frozenset[int] = frozenset(),
    ) -> httpx.Response:
        """Send one signed request and read its whole (small) response body.

        ``body`` is bytes, or an async iterable of chunks totalling ``length`` bytes (streamed,
        never held whole); ``payload_sha256`` is the body's hex SHA-256 either way.

        Returns the response when it is 2xx or in ``ok_statuses``.

        Raises:
            BlobUnavailable, BlobAuthFailed, BlobNotFound, BlobError: see the module docstring.
        """
        request = self._request(method, key, params, body, payload_sha256, length=length)
        try:
            response = await self._http.send(request)
        except httpx.TransportError as exc:
            raise BlobUnavailable(
                f"S3 {method} failed: {type(exc).__name__}", digest=digest
            ) from exc
        if response.is_success or response.status_code in ok_statuses:
            return response
        raise s3_error(response.status_code, response.content, key, digest)

    @asynccontextmanager
    async def stream(self, key: str, *, digest: str | None) -> AsyncIterator[httpx.Response]:
        """GET ``key`` with its body left to stream (``aiter_bytes``); 2xx only.

        Transport errors while the body streams are the caller's to map (see :meth:`chunks`).
        """
        request = self._request("GET", key, (), b"", EMPTY_SHA256)
        try:
            response = await self._http.send(request, stream=True)
        except httpx.TransportError as exc:
            raise BlobUnavailable(f"S3 GET failed: {type(exc).__name__}", digest=digest) from exc
        try:
            if not response.is_success:
                body = await response.aread()
                raise s3_error(response.status_code, body, key, digest)
            yield response
        finally:
            await response.aclose()

    @staticmethod
    async def chunks(
        response: httpx.Response, size: int, *, digest: str | None
    ) -> AsyncGenerator[bytes, None]:
        """The body in chunks of about ``size`` bytes; a cut-short body is BlobUnavailable."""
        try:
            async for chunk in response.aiter_bytes(size):
                yield chunk
        except httpx.TransportError as exc:
            raise BlobUnavailable(
                f"S3 GET broke off mid-body: {type(exc).__name__}", digest=digest
            ) from exc
