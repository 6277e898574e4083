"""Preview URLs: who may reach a sandbox's port through the gateway, and the relay to it.

Two URL forms reach port ``P`` of sandbox id ``S`` (``S`` is the global id, ``tenant--name``, or
the bare name for tenant ``default``; with an API key the tenant's own name works too):

    path  /v1/sandboxes/S/ports/P/<path>       the app sees /<path> (X-Forwarded-Prefix says where)
    host  P-S.<SANDPOD_GATEWAY_PREVIEW_DOMAIN>  the app sees the whole path (for apps that need /)

The middleware hands such requests here before its own authentication, because they admit more
than an API key. In order:

1. an API key (``Authorization: Bearer spk_…`` or ``X-API-Key``) of the sandbox's tenant: yes;
2. a signed link (``?token=spl1…`` or the ``sandpod_preview`` cookie a first ``?token=`` hit set,
   scoped to that host or path): yes if genuine, unexpired, for this sandbox and port, and its key
   is not revoked (else 403 ``auth.link_invalid`` / 401 ``auth.link_expired``);
3. a port the owner made public (the Sandbox's reserved annotation): yes, without credentials;
4. otherwise: with another tenant's key 404 (exactly like a missing sandbox), without any 401 —
   a request without credentials never learns whether a sandbox exists. The Sandbox reads such
   requests cause (step 3, when not cached) are rate-limited per client address (429).

A client connection on the fast path (:mod:`sandpod_gateway.front`) keeps its last admission
by key or public port as a :class:`Pass` and reuses it (:meth:`PreviewGate.recall`) only for the
same credential headers, sandbox and port, and only while the key's record and the Sandbox's are
the ones still cached: a key revoked, or a port made private on this replica, ends it at once;
on another replica within the cache's TTL, as for every request. Links are never kept.

Before forwarding, the gateway's own credentials are removed (its key headers, the link token in
the query, its cookie) and ``X-Forwarded-For/-Proto/-Host/-Prefix`` are added. Bytes go straight
from the gateway to the sandbox's address (``status.endpoint.address``) over TCP: see
``bench/preview.py`` for why not over NATS.
"""

from __future__ import annotations

import dataclasses
import re
from http.cookies import CookieError, SimpleCookie

from starlette.types import Receive, Scope, Send

from sandpod_contract.errors import SandboxPaused, SandboxUnavailable
from sandpod_contract.resources import Phase
from sandpod_gateway.context import Context
from sandpod_gateway.errors import (
    LinkInvalid,
    RateLimited,
    Unauthenticated,
    sandbox_not_found,
)
from sandpod_gateway.keys import ApiKey, parse_token
from sandpod_gateway.links import Link, looks_like_link
from sandpod_gateway.proxy import HOP_BY_HOP, UpstreamRequest, relay_http
from sandpod_gateway.targets import SandboxPorts, tenant_of
from sandpod_gateway.tenancy import Scope as TenantScope
from sandpod_gateway.wsrelay import open_upstream_ws, relay_ws

__all__ = [
    "COOKIE",
    "MAX_LABEL",
    "Admitted",
    "Pass",
    "PreviewGate",
    "PreviewRoute",
    "host_label",
    "path_prefix",
]

COOKIE = "sandpod_preview"
_Headers = list[tuple[bytes, bytes]]
_PATH = re.compile(r"/v1/sandboxes/([^/]+)/ports/([0-9]{1,5})(/.*)?", re.DOTALL)
_HOST = re.compile(r"([0-9]{1,5})-([a-z0-9][a-z0-9-]*)")


@dataclasses.dataclass(frozen=True, slots=True)
class PreviewRoute:
    """A request for a preview: which sandbox (as the URL names it), port, and upstream path."""

    segment: str  # the sandbox as named: an id, or (path form, with a key) the tenant's name
    port: int
    path: str  # the path the app sees (with the raw query appended by the relay)
    prefix: str  # path form: "/v1/sandboxes/S/ports/P"; host form: ""
    by_host: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Admitted:
    target: SandboxPorts
    address: str
    tenant: str | None  # the caller's tenant when it used a key or link (log line)
    cookie: str | None  # a Set-Cookie value to add (first hit with ?token=)


@dataclasses.dataclass(frozen=True, slots=True)
class Pass:
    """An admission a client connection keeps (:meth:`PreviewGate.recall`): what it was decided
    on -- the credentials the request carried, the sandbox and port it named, the key record
    read -- and the decision (whose ``target`` is the Sandbox record read)."""

    credentials: tuple[bytes, ...]
    route: tuple[str, int, bool]
    key: ApiKey | None
    admitted: Admitted


def path_prefix(sandbox_id: str, port: int) -> str:
    return f"/v1/sandboxes/{sandbox_id}/ports/{port}"


MAX_LABEL = 63  # characters in one DNS label (RFC 1035): a longer host form cannot resolve


def host_label(sandbox_id: str, port: int) -> str:
    return f"{port}-{sandbox_id}"


class PreviewGate:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.domain = ctx.settings.preview_domain

    def match(self, scope: Scope) -> PreviewRoute | None:
        """The preview this request is for, or None (an API request)."""
        if self.domain:
            host = _header(scope, b"host").split(":", 1)[0].lower().rstrip(".")
            if host.endswith("." + self.domain):
                m = _HOST.fullmatch(host[: -len(self.domain) - 1])
                if m is not None and 0 < int(m.group(1)) < 65536:
                    return PreviewRoute(m.group(2), int(m.group(1)), _raw_path(scope), "", True)
        m = _PATH.fullmatch(scope["path"])
        if m is None or not 0 < int(m.group(2)) < 65536:
            return None
        prefix = path_prefix(m.group(1), int(m.group(2)))
        raw = _raw_path(scope)
        # the app's path as the client encoded it (after the prefix, which is plain ASCII)
        rest = raw[len(prefix) :] if raw.startswith(prefix) else m.group(3) or ""
        return PreviewRoute(m.group(1), int(m.group(2)), rest, prefix, False)

    async def admit(self, scope: Scope, route: PreviewRoute) -> Admitted:
        """Decide (see the module docstring). Raises the typed refusal."""
        return (await self.admit_for(scope, route))[0]

    async def admit_for(self, scope: Scope, route: PreviewRoute) -> tuple[Admitted, Pass | None]:
        """:meth:`admit`, and the pass a client connection may keep for its next requests
        (None for a signed link: it expires on its own clock)."""
        key = await self._key(scope)
        global_id = route.segment if tenant_of(route.segment) else None
        if key is not None:
            own = TenantScope(key.tenant)
            if route.by_host:  # the host names the global id, never a tenant's bare name
                sid = route.segment if own.owns(route.segment) else None
            else:
                sid = own.own_id(route.segment)
            if sid:
                ok = await self._target(sid, route, key.tenant, None)
                return ok, self._pass(scope, route, key, ok)
        token, from_query = _token(scope)
        if token is not None:
            link = await self._link(token, global_id, route.port)
            cookie = self._cookie(scope, route, token, link) if from_query else None
            return await self._target(link.sandbox_id, route, link.tenant, cookie), None
        if global_id is not None:
            self._limit_lookups(scope, global_id)
            found = await self.ctx.targets.get(global_id)
            if found is not None and route.port in found.public:
                ok = self._ready(found, route, None, None)
                return ok, self._pass(scope, route, key, ok)
        if key is not None:
            raise sandbox_not_found(route.segment)
        raise Unauthenticated(
            "this preview needs an API key (Authorization: Bearer), a signed link "
            "(?token= from POST /v1/sandboxes/{name}/previews), or a public port"
        )

    def recall(self, kept: Pass | None, scope: Scope, route: PreviewRoute) -> Admitted | None:
        """The decision ``kept`` holds if this request would get the same one now: the same
        credential headers, byte for byte (the key in them was verified), for the same sandbox
        and port, while the key's record and the Sandbox's are the very ones it was decided on
        in the gateway's caches (a revoked or changed key, or a Sandbox record changed or older
        than the cache's TTL, leaves the cache, so the request is decided afresh). None: decide
        with :meth:`admit_for`."""
        if kept is None or kept.route != (route.segment, route.port, route.by_host):
            return None
        if kept.credentials != _credentials(scope):
            return None
        if kept.key is not None and not self.ctx.keys.still_cached(kept.key):
            return None
        found = kept.admitted.target
        if self.ctx.targets.cached(found.sandbox_id) is not found:
            return None
        return kept.admitted

    @staticmethod
    def _pass(scope: Scope, route: PreviewRoute, key: ApiKey | None, ok: Admitted) -> Pass:
        return Pass(_credentials(scope), (route.segment, route.port, route.by_host), key, ok)

    async def serve(
        self, scope: Scope, receive: Receive, send: Send, route: PreviewRoute, ok: Admitted
    ) -> None:
        """Relay the admitted request (HTTP or WebSocket) to the sandbox's port."""
        headers = self.upstream_headers(scope, route, ok.address)
        target = self.target(scope, route).decode("latin-1")
        if scope["type"] == "websocket":
            url = f"ws://{_netloc(ok.address, route.port)}{target}"
            await self._serve_ws(scope, receive, send, url, headers)
            return
        framing = "none"
        if _header(scope, b"content-length"):
            framing = "length"
            headers.append((b"content-length", _header(scope, b"content-length").encode()))
        elif _header(scope, b"transfer-encoding"):
            framing = "chunked"
        req = UpstreamRequest(ok.address, route.port, scope["method"], target, headers, framing)
        extra = [(b"set-cookie", ok.cookie.encode("latin-1"))] if ok.cookie else []
        await relay_http(self.ctx.preview_pool, req, receive, send, extra)

    async def _serve_ws(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        url: str,
        headers: list[tuple[bytes, bytes]],
    ) -> None:
        skip = {b"sec-websocket-key", b"sec-websocket-version", b"sec-websocket-protocol"}
        skip |= {b"sec-websocket-extensions", b"host"}
        forward = [(k.decode(), v.decode("latin-1")) for k, v in headers if k not in skip]
        s = self.ctx.settings
        upstream = await open_upstream_ws(
            url,
            forward,
            list(scope.get("subprotocols", ())),
            s.preview_connect_timeout,
            s.keepalive,
        )
        await relay_ws(upstream, receive, send)

    # -- admission -------------------------------------------------------------------------------

    async def _key(self, scope: Scope) -> ApiKey | None:
        """The request's API key when it carries one of ours (other bearer tokens are the
        app's own). Raises Unauthenticated for one of ours that is unknown or revoked."""
        token = _our_key(scope)
        return None if token is None else await self.ctx.keys.verify(token)

    def _limit_lookups(self, scope: Scope, sandbox_id: str) -> None:
        """Requests without credentials may make the gateway read a Sandbox (is the port
        public?): those reads are rate-limited per client address like a key's requests, so
        made-up ids cannot flood the control plane (answers from the cache are free).

        Raises:
            RateLimited: too many uncached lookups from this address.
        """
        if self.ctx.targets.known(sandbox_id):
            return
        client = scope.get("client")
        wait = self.ctx.limiter.take(f"preview-lookup:{client[0] if client else ''}")
        if wait > 0:
            raise RateLimited(retry_after=max(1, int(wait + 0.999)))

    async def _link(self, token: str, sandbox_id: str | None, port: int) -> Link:
        if sandbox_id is None:
            raise LinkInvalid("this preview link opens another sandbox or port")
        link = self.ctx.signer.verify(token, sandbox_id, port)
        try:
            key = await self.ctx.keys.by_id(link.key_id)
        except Unauthenticated:
            raise LinkInvalid("the key that signed this preview link was revoked") from None
        if key.tenant != link.tenant or tenant_of(link.sandbox_id) != link.tenant:
            raise LinkInvalid("this preview link does not belong to the sandbox's tenant")
        return link

    async def _target(
        self, sandbox_id: str, route: PreviewRoute, tenant: str, cookie: str | None
    ) -> Admitted:
        found = await self.ctx.targets.get(sandbox_id)
        if found is None:
            raise sandbox_not_found(route.segment)
        return self._ready(found, route, tenant, cookie)

    @staticmethod
    def _ready(
        found: SandboxPorts, route: PreviewRoute, tenant: str | None, cookie: str | None
    ) -> Admitted:
        if found.phase == Phase.PAUSED:
            raise SandboxPaused(f"sandbox {route.segment!r} is paused: resume it first")
        if found.address is None:
            raise SandboxUnavailable(
                f"sandbox {route.segment!r} has no network address (phase {found.phase or '?'};"
                " its runtime publishes none yet): its ports cannot be reached"
            )
        return Admitted(found, found.address, tenant, cookie)

    def _cookie(self, scope: Scope, route: PreviewRoute, token: str, link: Link) -> str:
        """Remember a link for the page's own sub-requests: this host (host form) or this
        sandbox port's path (path form) only, HttpOnly, until the link expires."""
        age = max(0, int(link.expires - self.ctx.signer.clock()))
        path = "/" if route.by_host else route.prefix + "/"
        secure = "; Secure" if _scheme(scope) == "https" else ""
        return f"{COOKIE}={token}; Path={path}; Max-Age={age}; HttpOnly; SameSite=Lax{secure}"

    # -- headers ---------------------------------------------------------------------------------

    @staticmethod
    def target(scope: Scope, route: PreviewRoute) -> bytes:
        """The request target on the upstream: the app's path and the query without our token."""
        raw = scope.get("query_string", b"")
        query = _strip_token(raw) if raw else ""
        return ((route.path or "/") + ("?" + query if query else "")).encode("latin-1")

    def upstream_headers(
        self, scope: Scope, route: PreviewRoute, address: str
    ) -> list[tuple[bytes, bytes]]:
        """The request's headers as the app gets them: hop-by-hop ones, the gateway's
        credentials and the client's X-Forwarded-* dropped, ours added."""
        listed = _header(scope, b"connection")  # more hop-by-hop names (rarely any)
        connection = {t.strip().encode("latin-1") for t in listed.lower().split(",")} - {b""}
        out: list[tuple[bytes, bytes]] = []
        forwarded_for = b""
        for k, v in scope["headers"]:
            if k in HOP_BY_HOP or k == b"content-length" or (connection and k in connection):
                continue
            if k in (b"authorization", b"x-api-key") and _is_our_key(k, v):
                continue
            if k == b"cookie" and not (v := _strip_cookie(v)):
                continue
            if k == b"x-forwarded-for":
                forwarded_for = v + b", "
                continue
            if k.startswith((b"x-forwarded-", b"x-sandpod-front-")):
                continue  # ours are authoritative; the native front's are for the gateway
            out.append((k, v))
        client = scope.get("client")
        out += [
            (b"host", _netloc(address, route.port).encode()),
            (b"x-forwarded-for", forwarded_for + (client[0] if client else "").encode()),
            (b"x-forwarded-proto", _scheme(scope).encode()),
            (b"x-forwarded-host", _header(scope, b"host").encode("latin-1")),
        ]
        if route.prefix:
            out.append((b"x-forwarded-prefix", route.prefix.encode()))
        return out


def _header(scope: Scope, name: bytes) -> str:
    for k, v in scope["headers"]:
        if k == name:
            return str(v.decode("latin-1"))
    return ""


def _raw_path(scope: Scope) -> str:
    raw = scope.get("raw_path")
    return raw.decode("latin-1") if raw else str(scope["path"])


_HTTP_SCHEME = {"ws": "http", "wss": "https"}


def _scheme(scope: Scope) -> str:
    scheme = str(scope.get("scheme", "http"))
    return _HTTP_SCHEME.get(scheme, scheme)


def _netloc(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _our_key(scope: Scope) -> str | None:
    for k, v in scope["headers"]:
        if k in (b"authorization", b"x-api-key") and _is_our_key(k, v):
            value = str(v.decode("latin-1")).strip()
            return value.partition(" ")[2].strip() if k == b"authorization" else value
    return None


_CREDENTIALS = frozenset({b"authorization", b"x-api-key", b"cookie"})


def _credentials(scope: Scope) -> tuple[bytes, ...]:
    """Every header admission reads credentials from (names and values, in order); the query
    is not among them: a request with ``?token=`` never reuses a pass (see front)."""
    return tuple(k + b":" + v for k, v in scope["headers"] if k in _CREDENTIALS)


def _is_our_key(name: bytes, value: bytes) -> bool:
    text = value.decode("latin-1").strip()
    if name == b"authorization":
        scheme, _, text = text.partition(" ")
        if scheme.lower() != "bearer":
            return False
    return text.strip().startswith("spk_") and parse_token(text.strip()) is not None


def _token(scope: Scope) -> tuple[str | None, bool]:
    """The link token: (token, came from the query) — the query's wins over the cookie's."""
    for part in scope.get("query_string", b"").split(b"&"):
        name, _, value = part.partition(b"=")
        if name == b"token" and looks_like_link(value.decode("latin-1")):
            return value.decode("latin-1"), True
    raw = _header(scope, b"cookie")
    if COOKIE in raw:
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(raw)
        except CookieError:
            return None, False
        value = str(jar[COOKIE].value) if COOKIE in jar else ""
        if looks_like_link(value):
            return value, False
    return None, False


def _strip_token(query: bytes) -> str:
    """The query without our ``token=spl1…`` (the app's own ``token`` parameters stay)."""
    parts = [p for p in query.split(b"&") if p and not p.startswith(b"token=spl1.")]
    return b"&".join(parts).decode("latin-1")


def _strip_cookie(value: bytes) -> bytes:
    """The Cookie header without ours."""
    parts = [p.strip() for p in value.split(b";")]
    return b"; ".join(p for p in parts if p and not p.startswith(COOKIE.encode() + b"="))
