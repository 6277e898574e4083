"""Signed, expiring preview links: a URL that opens one port of one sandbox without an API key.

A browser cannot send ``Authorization`` on a link someone clicks, so ``POST
/v1/sandboxes/{name}/previews`` hands out a token that carries its own proof:

    spl1.<tenant>.<key_id>.<sandbox_id>.<port>.<expires>.<mac>

``mac`` is HMAC-SHA256 over every other field with the installation's preview secret (made once,
kept in the gateway's key bucket, the same on every replica: see :meth:`KeyStore.secret`). So a
token opens exactly the port of the sandbox it names, of its tenant, until ``expires`` (Unix
seconds), and not at all once the key that asked for it is revoked (``key_id``). Nothing is stored
per link: any replica verifies any token, and a restart loses nothing.

Verification order: shape and MAC first (a forged or altered token is ``auth.link_invalid``,
403, whatever its expiry says), then what it is bound to (another sandbox or port: 403 too), then
the time (``auth.link_expired``, 401). The clock is injected (tests move it instead of sleeping).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import re
import time
from collections.abc import Callable

from sandpod_gateway.errors import LinkExpired, LinkInvalid

__all__ = ["LINK_PREFIX", "Link", "LinkSigner", "looks_like_link"]

LINK_PREFIX = "spl1."
_SHAPE = re.compile(
    r"spl1\.([a-z0-9-]{1,30})\.([0-9a-f]{12})\.([a-z0-9-]{1,63})\.([0-9]{1,5})\.([0-9]{1,12})"
    r"\.([A-Za-z0-9_-]{43})"
)


@dataclasses.dataclass(frozen=True, slots=True)
class Link:
    """What a verified token grants."""

    tenant: str
    key_id: str
    sandbox_id: str
    port: int
    expires: int


def looks_like_link(value: str) -> bool:
    """Whether ``value`` is shaped like one of our tokens (so it is ours to strip)."""
    return value.startswith(LINK_PREFIX)


class LinkSigner:
    def __init__(self, secret: bytes, clock: Callable[[], float] = time.time) -> None:
        if len(secret) < 16:
            raise ValueError("the preview secret must have at least 16 bytes")
        self._secret = secret
        self.clock = clock

    def sign(self, tenant: str, key_id: str, sandbox_id: str, port: int, ttl: float) -> Link:
        """A link valid for ``ttl`` seconds from now (whole seconds, rounded up)."""
        expires = int(self.clock() + ttl + 0.999)
        return Link(tenant, key_id, sandbox_id, port, expires)

    def token(self, link: Link) -> str:
        body = self._body(link)
        return f"{body}.{self._mac(body)}"

    def verify(self, token: str, sandbox_id: str, port: int) -> Link:
        """The link ``token`` grants for ``sandbox_id``'s ``port``.

        Raises:
            LinkInvalid: malformed, forged, altered, or for another sandbox or port.
            LinkExpired: genuine, but past its expiry.
        """
        m = _SHAPE.fullmatch(token)
        if m is None:
            raise LinkInvalid("not a preview link token")
        tenant, key_id, sid, port_text, expires_text, mac = m.groups()
        link = Link(tenant, key_id, sid, int(port_text), int(expires_text))
        if not hmac.compare_digest(self._mac(self._body(link)), mac):
            raise LinkInvalid("the preview link's signature does not match (forged or altered)")
        if (link.sandbox_id, link.port) != (sandbox_id, port):
            raise LinkInvalid("this preview link opens another sandbox or port")
        if link.expires <= self.clock():
            raise LinkExpired("the preview link has expired: ask for a fresh one")
        return link

    @staticmethod
    def _body(link: Link) -> str:
        return (
            f"{LINK_PREFIX}{link.tenant}.{link.key_id}.{link.sandbox_id}.{link.port}.{link.expires}"
        )

    def _mac(self, body: str) -> str:
        digest = hmac.new(self._secret, body.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")
