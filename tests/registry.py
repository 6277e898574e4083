"""A real OCI registry for tests: Debian's ``docker-registry`` (CNCF distribution) on loopback.

:class:`TestRegistry` starts the binary on a free 127.0.0.1 port with its storage in a temp dir,
optionally behind htpasswd (bcrypt) basic auth. Its blobs are plain files on disk
(:meth:`TestRegistry.blob_file`), which is how a test tampers with one.

:class:`BearerGate` is a small token-auth front for a registry, written here because
distribution's own token auth needs a PKI: it answers ``/v2/...`` with a Bearer challenge unless
the request carries a token its ``/token`` endpoint issued (to the right basic credentials, or to
anyone when anonymous pulls are allowed), and forwards the authorised requests to the registry.
"""

from __future__ import annotations

import base64
import http.client
import http.server
import secrets
import shutil
import subprocess
import threading
import urllib.parse
from pathlib import Path
from typing import Any

import bcrypt
import pytest

from conftest import SESSION_DAEMON_PIDS, free_port, wait_until

REGISTRY_BIN = shutil.which("docker-registry") or "/usr/bin/docker-registry"

_CONFIG = """\
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {data}
  delete:
    enabled: true
http:
  addr: {bind}:{port}
{auth}"""
_HTPASSWD = """\
auth:
  htpasswd:
    realm: sandpod-test
    path: {path}
"""


class TestRegistry:
    """A docker-registry process (``users``: name -> password for htpasswd auth, else open;
    ``bind``: the address it listens on, loopback unless a real node's Pods must reach it)."""

    __test__ = False  # not a test class, whatever pytest thinks of its name

    def __init__(
        self, root: Path, users: dict[str, str] | None = None, bind: str = "127.0.0.1"
    ) -> None:
        if not Path(REGISTRY_BIN).exists():
            pytest.fail("docker-registry missing: apt-get install docker-registry (Debian)")
        self.root = root
        self.port = free_port()
        self.users = users
        self.bind = bind
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return f"{self.bind}:{self.port}"

    def start(self) -> None:
        data = self.root / "data"
        data.mkdir(parents=True, exist_ok=True)
        auth = ""
        if self.users is not None:
            htpasswd = self.root / "htpasswd"
            htpasswd.write_text(
                "".join(
                    f"{user}:{bcrypt.hashpw(pw.encode(), bcrypt.gensalt(rounds=4)).decode()}\n"
                    for user, pw in self.users.items()
                )
            )
            auth = _HTPASSWD.format(path=htpasswd)
        config = self.root / "config.yml"
        config.write_text(_CONFIG.format(data=data, bind=self.bind, port=self.port, auth=auth))
        log = (self.root / "registry.log").open("wb")
        self.proc = subprocess.Popen(
            [REGISTRY_BIN, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        SESSION_DAEMON_PIDS.add(self.proc.pid)
        wait_until(self._answers, 15, f"docker-registry on {self.host}")

    def _answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            log = (self.root / "registry.log").read_text()
            pytest.fail(f"docker-registry exited with {self.proc.returncode}: {log[-2000:]}")
        try:
            conn = http.client.HTTPConnection(self.bind, self.port, timeout=1)
            conn.request("GET", "/v2/")
            status = conn.getresponse().status
            conn.close()
        except OSError:
            return False
        return status in (200, 401)

    def blob_file(self, digest: str) -> Path:
        """Where distribution keeps a blob's bytes (edit it to tamper with the blob)."""
        hexpart = digest.removeprefix("sha256:")
        return self.root / "data/docker/registry/v2/blobs/sha256" / hexpart[:2] / hexpart / "data"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        if self.proc is not None:
            SESSION_DAEMON_PIDS.discard(self.proc.pid)
        self.proc = None


class _Front:
    """An HTTP server on loopback in front of ``upstream``: subclasses decide per request
    (:meth:`handle`) and forward what they let through (:meth:`_forward`)."""

    def __init__(self, upstream: TestRegistry) -> None:
        self.upstream = upstream
        self.port = free_port()
        gate = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def do_GET(self) -> None:
                gate.handle(self)

            def do_HEAD(self) -> None:
                gate.handle(self)

            def do_POST(self) -> None:
                gate.handle(self)

            def do_PUT(self) -> None:
                gate.handle(self)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)

    def handle(self, req: http.server.BaseHTTPRequestHandler) -> None:
        self._forward(req)

    def _forward(self, req: http.server.BaseHTTPRequestHandler, *, cut: int | None = None) -> None:
        """Send ``req`` on to the registry and its answer back; ``cut``: stop after that many
        body bytes and drop the connection (a download broken mid-way)."""
        length = int(req.headers.get("Content-Length") or 0)
        body = req.rfile.read(length) if length else None
        conn = http.client.HTTPConnection("127.0.0.1", self.upstream.port, timeout=30)
        headers = {k: v for k, v in req.headers.items() if k.lower() not in ("authorization",)}
        conn.request(req.command, req.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        req.send_response(resp.status)
        for key, value in resp.getheaders():
            if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                req.send_header(key, value)
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        if req.command != "HEAD":
            req.wfile.write(data if cut is None else data[:cut])
        if cut is not None:
            req.close_connection = True
        conn.close()

    @staticmethod
    def _reply(
        req: http.server.BaseHTTPRequestHandler,
        status: int,
        body: bytes,
        challenge: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        req.send_response(status)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(body)))
        if challenge:
            req.send_header("WWW-Authenticate", challenge)
        for key, value in (headers or {}).items():
            req.send_header(key, value)
        req.end_headers()
        req.wfile.write(body)


class FlakyFront(_Front):
    """A registry that is busy or breaks downloads, as planned by the test: the next ``busy``
    requests get 503 (``Retry-After: 0``), and the next blob GET asked from byte 0 is cut after
    ``cut_blob_after`` bytes. ``seen`` records (method, path, Range header) of every request."""

    def __init__(self, upstream: TestRegistry) -> None:
        super().__init__(upstream)
        self.busy = 0
        self.cut_blob_after: int | None = None
        self.seen: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()

    def handle(self, req: http.server.BaseHTTPRequestHandler) -> None:
        rng = req.headers.get("Range", "")
        with self._lock:
            self.seen.append((req.command, req.path, rng))
            busy = self.busy > 0
            self.busy -= busy
            cut = None
            if self.cut_blob_after is not None and "/blobs/sha256:" in req.path and not rng:
                cut, self.cut_blob_after = self.cut_blob_after, None
        if busy:
            self._reply(
                req, 503, b'{"errors":[{"code":"UNAVAILABLE"}]}', headers={"Retry-After": "0"}
            )
            return
        self._forward(req, cut=None if req.command != "GET" else cut)


class BearerGate(_Front):
    """Token auth in front of ``upstream`` (see the module docstring)."""

    def __init__(
        self, upstream: TestRegistry, users: dict[str, str], *, anonymous: bool = False
    ) -> None:
        super().__init__(upstream)
        self.users = users
        self.anonymous = anonymous
        self.tokens: set[str] = set()
        self.refresh_tokens = {"refresh-me"}  # identitytoken values the token endpoint honours
        self.token_requests: list[dict[str, str]] = []

    def handle(self, req: http.server.BaseHTTPRequestHandler) -> None:
        if req.path.startswith("/token"):
            self._token(req)
            return
        authz = req.headers.get("Authorization", "")
        if authz.removeprefix("Bearer ") not in self.tokens:
            realm = f"http://{self.host}/token"
            challenge = f'Bearer realm="{realm}",service="gate"'
            self._reply(req, 401, b'{"errors":[{"code":"UNAUTHORIZED"}]}', challenge)
            return
        self._forward(req)

    def _token(self, req: http.server.BaseHTTPRequestHandler) -> None:
        query = urllib.parse.urlparse(req.path).query
        if req.command == "POST":  # the OAuth2 form: an identity (refresh) token
            length = int(req.headers.get("Content-Length") or 0)
            query = req.rfile.read(length).decode()
        form = dict(urllib.parse.parse_qsl(query))
        self.token_requests.append(form)
        authz = req.headers.get("Authorization", "")
        allowed = self.anonymous and not authz
        if form.get("grant_type") == "refresh_token":
            allowed = form.get("refresh_token") in self.refresh_tokens
        if authz.startswith("Basic "):
            user, _, pw = base64.b64decode(authz[6:]).decode().partition(":")
            allowed = self.users.get(user) == pw
        if not allowed:
            self._reply(req, 401, b'{"errors":[{"code":"UNAUTHORIZED"}]}')
            return
        token = secrets.token_hex(16)
        self.tokens.add(token)
        self._reply(req, 200, f'{{"token":"{token}"}}'.encode())
