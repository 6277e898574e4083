"""A client of the distribution API (``/v2/``): manifests and blobs, pulled and pushed, on httpx.

One :class:`Registry` per registry host. Every request goes through :meth:`Registry._send`,
which owns authentication: a request goes out with the header known for its scope; a 401
answers with a ``WWW-Authenticate`` challenge, ``Basic`` (the credentials are sent as they are)
or ``Bearer`` (a token is fetched from the challenge's realm with the credentials, or
anonymously, and cached per repository scope), and the request is sent once more. A second 401
(or a 403) is ``image.auth_failed``; a 404 is ``image.not_found``. Transport errors and the
answers a busy or restarting registry gives (408, 429, 500, 502, 503, 504) are retried here with
exponential backoff (``Retry-After`` honoured, capped) before they become ``image.error``
(retryable): a registry's rate limit or a rolling restart is not a failed pull. A blob whose
download breaks mid-way resumes with a ``Range`` request from the bytes already hashed (a
registry that answers the whole blob again restarts it from zero). Nothing above this module sees
an httpx type.

Integrity is this module's too: a manifest's bytes are hashed and compared with the digest asked
for (or the registry's ``Docker-Content-Digest``), and a blob streams through a
:class:`~sandpod_image.blobs.BlobWriter`, which renames it into place only when it matches.

Plain HTTP is used only for a loopback registry or one the caller marks ``insecure``.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import Final
from urllib.parse import urljoin

import httpx

from sandpod_contract.errors import (
    ImageAuthFailed,
    ImageDigestMismatch,
    ImageError,
    ImageNotFound,
)
from sandpod_image.auth import AuthConfig
from sandpod_image.blobs import CHUNK, BlobWriter, digest_bytes
from sandpod_image.manifest import ACCEPT
from sandpod_image.reference import is_loopback

__all__ = ["MAX_MANIFEST_BYTES", "RETRY_STATUS", "Registry", "RetryPolicy"]

MAX_MANIFEST_BYTES: Final = 4 << 20  # what containerd accepts too
_CHALLENGE_PARAM: Final = re.compile(r'(\w+)="([^"]*)"')
_USER_AGENT: Final = "sandpod-image/0.1"

RETRY_STATUS: Final = frozenset({408, 429, 500, 502, 503, 504})
_CONTENT_RANGE: Final = re.compile(r"bytes (\d+)-\d+/(?:\d+|\*)")

Body = bytes | Callable[[], AsyncIterator[bytes]] | None
Sleep = Callable[[float], Awaitable[None]]


@dataclasses.dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently a request is tried again.

    Attributes:
        attempts: tries in all (1: never again).
        base_delay: seconds before the second try; doubled for each one after.
        max_delay: the cap of any wait, ``Retry-After`` included.
    """

    attempts: int = 4
    base_delay: float = 0.5
    max_delay: float = 10.0

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        """Seconds to wait after failed try number ``attempt`` (0-based)."""
        if retry_after is not None and retry_after.strip().isdigit():
            return min(float(retry_after.strip()), self.max_delay)
        return min(self.base_delay * float(2**attempt), self.max_delay)


class Registry:
    """A connection to one registry host.

    Args:
        host: ``host[:port]`` serving ``/v2/`` (Docker Hub: see ``endpoints``).
        auth: credentials, or None for anonymous access.
        insecure: allow plain HTTP to a non-loopback host (loopback always uses HTTP).
        transport: an httpx transport (tests, proxies); default: httpx's own.
        timeout: seconds for connect, each read and each write.
        retry: how transport errors and busy answers are tried again.
        sleep: how a retry waits (tests pass one that records the delays).
    """

    def __init__(
        self,
        host: str,
        *,
        auth: AuthConfig | None = None,
        insecure: bool = False,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: float = 60.0,
        retry: RetryPolicy = RetryPolicy(),
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._retry = retry
        self._sleep = sleep
        scheme = "http" if insecure or is_loopback(host) else "https"
        self.host = host
        self.base = f"{scheme}://{host}"
        self._auth = auth
        self._headers: dict[str, str] = {}  # scope -> Authorization header
        self._client = httpx.AsyncClient(
            transport=transport,
            timeout=httpx.Timeout(timeout),
            headers={"User-Agent": _USER_AGENT},
            follow_redirects=True,
        )

    async def __aenter__(self) -> Registry:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()

    # -- pull ------------------------------------------------------------------------------

    async def get_manifest(self, repo: str, target: str) -> tuple[bytes, str, str]:
        """Fetch a manifest or index by tag or digest, verified.

        Returns:
            ``(body, content type, digest)``; the digest is the sha256 of the body.

        Raises:
            ImageNotFound, ImageAuthFailed, ImageError; ImageDigestMismatch when the body
            does not hash to the digest asked for (or the one the registry names).
        """
        resp = await self._send(
            "GET", repo, f"manifests/{target}", headers={"Accept": ACCEPT}, stream=True
        )
        try:
            body = bytearray()
            async for chunk in resp.aiter_bytes():
                body += chunk
                if len(body) > MAX_MANIFEST_BYTES:
                    raise ImageError(
                        f"{self.host}/{repo}:{target}: manifest over {MAX_MANIFEST_BYTES} bytes"
                    )
        except httpx.HTTPError as exc:
            raise ImageError(f"{self.host}: manifest download failed: {exc}") from exc
        finally:
            await resp.aclose()
        actual = digest_bytes(bytes(body))
        expected = (
            target
            if target.startswith("sha256:")
            else resp.headers.get("Docker-Content-Digest", actual)
        )
        if actual != expected:
            raise ImageDigestMismatch(
                f"manifest {self.host}/{repo}@{expected} arrived as {actual}",
                expected=expected,
                actual=actual,
            )
        return bytes(body), resp.headers.get("Content-Type", ""), actual

    async def fetch_blob(
        self,
        repo: str,
        digest: str,
        dest: Path,
        *,
        tmp_dir: Path,
        size: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        """Download a blob into ``dest``, verified (see :class:`BlobWriter`).

        Args:
            progress: called with the bytes received so far, after each chunk.
        """
        with BlobWriter(tmp_dir, digest, size) as out:
            for attempt in range(self._retry.attempts):
                done = await self._receive_blob(repo, digest, out, progress)
                if done is None:
                    out.commit(dest)
                    return
                if attempt + 1 == self._retry.attempts:
                    raise ImageError(
                        f"{self.host}: blob {digest} download failed after "
                        f"{self._retry.attempts} tries: {done}"
                    ) from done
                await self._sleep(self._retry.delay(attempt))

    async def _receive_blob(
        self,
        repo: str,
        digest: str,
        out: BlobWriter,
        progress: Callable[[int], None] | None,
    ) -> httpx.TransportError | None:
        """Stream (the rest of) a blob into ``out``: from byte ``out.count`` on when the registry
        honours the ``Range`` (206 from there), else from zero again. Returns the transport
        error that broke the stream (the caller tries again), or None when it ended."""
        headers = {"Range": f"bytes={out.count}-"} if out.count else None
        resp = await self._send("GET", repo, f"blobs/{digest}", headers=headers, stream=True)
        try:
            match = _CONTENT_RANGE.match(resp.headers.get("Content-Range", ""))
            if out.count and not (resp.status_code == 206 and match and int(match[1]) == out.count):
                out.restart()
            async for chunk in resp.aiter_raw(CHUNK):
                out.write(chunk)
                if progress is not None:
                    progress(out.count)
        except httpx.TransportError as exc:
            return exc
        except httpx.HTTPError as exc:
            raise ImageError(f"{self.host}: blob {digest} download failed: {exc}") from exc
        finally:
            await resp.aclose()
        return None

    # -- push ------------------------------------------------------------------------------

    async def blob_exists(self, repo: str, digest: str) -> bool:
        """Whether the repository has the blob already (a HEAD; pushes skip it then)."""
        try:
            resp = await self._send("HEAD", repo, f"blobs/{digest}", actions=("pull", "push"))
        except ImageNotFound:
            return False
        return resp.status_code == 200

    async def push_blob(self, repo: str, digest: str, path: Path) -> bool:
        """Upload a file as a blob (one monolithic PUT), unless the registry has it.

        Returns:
            True when it was uploaded, False when it was there already.
        """
        if await self.blob_exists(repo, digest):
            return False
        start = await self._send("POST", repo, "blobs/uploads/", actions=("pull", "push"))
        location = start.headers.get("Location")
        if not location:
            raise ImageError(f"{self.host}: the upload of {digest} got no Location")
        url = urljoin(self.base + "/", location)
        url += ("&" if "?" in url else "?") + f"digest={digest}"
        size = os.stat(path).st_size  # a stat: not worth a thread

        async def body() -> AsyncIterator[bytes]:
            with path.open("rb") as f:
                while chunk := f.read(CHUNK):
                    yield chunk

        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        await self._send("PUT", repo, url, actions=("pull", "push"), headers=headers, body=body)
        return True

    async def put_manifest(self, repo: str, target: str, body: bytes, media_type: str) -> str:
        """Upload a manifest (or index) under a tag or its digest; returns its digest."""
        await self._send(
            "PUT",
            repo,
            f"manifests/{target}",
            actions=("pull", "push"),
            headers={"Content-Type": media_type},
            body=body,
        )
        return digest_bytes(body)

    # -- the one request path ------------------------------------------------------------

    async def _send(
        self,
        method: str,
        repo: str,
        path: str,
        *,
        actions: tuple[str, ...] = ("pull",),
        headers: dict[str, str] | None = None,
        body: Body = None,
        stream: bool = False,
    ) -> httpx.Response:
        url = path if "://" in path else f"{self.base}/v2/{repo}/{path}"
        scope = f"repository:{repo}:{','.join(actions)}"
        last = self._retry.attempts - 1
        for attempt in range(self._retry.attempts):
            try:
                resp = await self._authorized(
                    method, url=url, scope=scope, headers=headers, body=body, stream=stream
                )
            except httpx.TransportError as exc:
                if attempt == last:
                    raise ImageError(f"registry {self.host} unreachable: {exc}") from exc
                await self._sleep(self._retry.delay(attempt))
                continue
            if resp.status_code not in RETRY_STATUS or attempt == last:
                break
            await resp.aclose()
            await self._sleep(self._retry.delay(attempt, resp.headers.get("Retry-After")))
        if resp.status_code >= 400:
            await self._raise_for(resp, repo, path)
        return resp

    async def _authorized(
        self,
        method: str,
        *,
        url: str,
        scope: str,
        headers: dict[str, str] | None,
        body: Body,
        stream: bool,
    ) -> httpx.Response:
        """One try: sent with the scope's credentials, and once more after a 401's challenge
        is answered. Transport errors are the caller's (it retries them)."""
        for answered in (False, True):
            send_headers = dict(headers or {})
            if authz := self._headers.get(scope) or self._headers.get("*"):
                send_headers["Authorization"] = authz
            content = body() if callable(body) else body
            request = self._client.build_request(method, url, headers=send_headers, content=content)
            try:
                resp = await self._client.send(request, stream=stream)
            except httpx.TransportError:
                raise  # _send retries these
            except httpx.HTTPError as exc:
                raise ImageError(f"registry {self.host}: {method} failed: {exc}") from exc
            if resp.status_code != 401 or answered:
                return resp
            challenge = resp.headers.get("WWW-Authenticate", "")
            await resp.aclose()
            await self._answer(challenge, scope)
        raise ImageError(f"registry {self.host}: {method} {url} got no answer")  # not reached

    async def _answer(self, challenge: str, scope: str) -> None:
        """Learn the Authorization header for ``scope`` from a 401's challenge."""
        kind, _, params_text = challenge.partition(" ")
        params = dict(_CHALLENGE_PARAM.findall(params_text))
        auth = self._auth
        if kind.lower() == "basic":
            if auth is None or not auth.has_basic:
                raise ImageAuthFailed(
                    f"{self.host} needs credentials and none were given; log in to it in "
                    "the auth file (--auth-file, $REGISTRY_AUTH_FILE, $DOCKER_CONFIG)",
                    registry=self.host,
                    status=401,
                )
            pair = f"{auth.username}:{auth.password}".encode()
            self._headers["*"] = "Basic " + base64.b64encode(pair).decode()
            return
        if kind.lower() != "bearer" or "realm" not in params:
            raise ImageAuthFailed(
                f"{self.host} answered 401 without a usable challenge ({kind or 'none'})",
                registry=self.host,
                status=401,
            )
        realm = params["realm"]
        if realm.startswith("http://") and self.base.startswith("https://"):
            # Credentials go to the realm: never in clear text for a registry reached over TLS.
            raise ImageAuthFailed(
                f"{self.host}'s token endpoint {realm} is plain HTTP; refusing to send "
                "credentials there",
                registry=self.host,
                status=401,
            )
        token = await self._token(realm, params.get("service"), params.get("scope", scope))
        self._headers[scope] = f"Bearer {token}"

    async def _token(self, realm: str, service: str | None, scope: str) -> str:
        auth = self._auth
        if auth is not None and auth.registry_token:
            return auth.registry_token
        query = {k: v for k, v in (("service", service), ("scope", scope)) if v}
        try:
            if auth is not None and auth.identity_token:
                form = {**query, "grant_type": "refresh_token", "client_id": "sandpod"}
                form["refresh_token"] = auth.identity_token
                resp = await self._client.post(realm, data=form)
            else:
                basic = (
                    httpx.BasicAuth(auth.username or "", auth.password or "")
                    if (auth is not None and auth.has_basic)
                    else None
                )
                resp = await self._client.get(realm, params=query, auth=basic)
        except httpx.HTTPError as exc:
            raise ImageError(f"token endpoint {realm} unreachable: {exc}") from exc
        if resp.status_code in (401, 403):
            raise ImageAuthFailed(
                f"{self.host}'s token endpoint refused the credentials ({resp.status_code})",
                registry=self.host,
                status=resp.status_code,
            )
        try:
            doc = resp.json() if resp.status_code == 200 else {}
        except ValueError:
            doc = {}
        token = doc.get("token") or doc.get("access_token") if isinstance(doc, dict) else None
        if not isinstance(token, str) or not token:
            raise ImageError(f"token endpoint {realm} answered {resp.status_code} without a token")
        return token

    async def _raise_for(self, resp: httpx.Response, repo: str, path: str) -> None:
        try:
            await resp.aread()
            text = resp.text[:300]
        except httpx.HTTPError:
            text = ""
        finally:
            await resp.aclose()
        where = f"{self.host}/{repo} {path.rsplit('/', 1)[-1] if '://' in path else path}"
        status = resp.status_code
        if status == 404:
            raise ImageNotFound(f"{where}: not found ({text.strip() or 404})", reference=where)
        if status in (401, 403):
            raise ImageAuthFailed(
                f"{self.host} refused access to {repo} ({status}); check the credentials in "
                "the auth file, and that the repository exists",
                registry=self.host,
                status=status,
            )
        raise ImageError(f"{where}: the registry answered {status}: {text}", status=status)
