"""What a new egress connection says it is going to: the TLS ClientHello's SNI or the HTTP Host.

The egress proxy reads the first bytes a sandbox sends (bounded in size and time, see
``proxy.py``) and hands them here until :func:`sniff` stops raising :class:`Incomplete`. Pure
functions over bytes, no I/O, so every malformed or hostile input is a unit test away:

* TLS: the handshake records are reassembled (a ClientHello may span records) up to
  :data:`MAX_HELLO` bytes, then the ``server_name`` extension is read. A ClientHello carrying
  Encrypted Client Hello (extension 0xfe0d) is reported as such: its outer SNI is only the
  client-facing server's public name, the real destination is encrypted, so a name rule cannot
  be checked and the proxy refuses it.
* HTTP/1.x: the request head (up to :data:`MAX_HEAD`) must carry exactly one ``Host``; an
  absolute-form request target must name the same host (a server prefers the target's host,
  so a mismatch would smuggle another name past the check).

Anything else (no name, an IP literal, another protocol) is :class:`Sniffed` with ``name`` None
and the caller decides from the policy; bytes that claim to be TLS or HTTP but break the grammar
raise :class:`Malformed`.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from typing import Literal

__all__ = [
    "MAX_HEAD",
    "MAX_HELLO",
    "Incomplete",
    "Malformed",
    "Sniffed",
    "host_name",
    "sniff",
]

MAX_HELLO = 32 * 1024  # a ClientHello with post-quantum key shares is ~2 KiB; 16 KiB is common max
MAX_HEAD = 16 * 1024  # an HTTP request head (request line + headers)
_HANDSHAKE = 22
_CLIENT_HELLO = 1
_EXT_SNI = 0x0000
_EXT_ECH = 0xFE0D
_METHOD = re.compile(rb"[A-Z]{3,10} ")
_HOSTNAME = re.compile(r"[a-z0-9_-]{1,63}(\.[a-z0-9_-]{1,63})*")

Kind = Literal["tls", "http", "other"]


class Incomplete(Exception):
    """More bytes are needed before anything can be said."""


class Malformed(Exception):
    """The bytes claim a protocol (TLS, HTTP) but break its grammar."""

    def __init__(self, kind: Kind, why: str) -> None:
        super().__init__(f"malformed {kind}: {why}")
        self.kind = kind
        self.why = why


@dataclasses.dataclass(frozen=True, slots=True)
class Sniffed:
    """The protocol seen and the destination name it carries (lower case, no trailing dot;
    None when it carries none, or an IP literal)."""

    kind: Kind
    name: str | None = None
    ech: bool = False


def sniff(data: bytes) -> Sniffed:
    """Classify the first bytes of a connection.

    Raises:
        Incomplete: the bytes so far are a valid prefix; read more (up to the caps).
        Malformed: TLS or HTTP that breaks the grammar or exceeds the caps.
    """
    if not data:
        raise Incomplete
    if data[0] == _HANDSHAKE:
        return _sniff_tls(data)
    if _METHOD.match(data[:11]) or (len(data) < 11 and _could_be_method(data)):
        return _sniff_http(data)
    return Sniffed("other")


def _could_be_method(data: bytes) -> bool:
    head = data.split(b" ", 1)[0]
    return head.isalpha() and head.isupper() and (b" " in data or len(data) < 10)


# ---------------------------------------------------------------- TLS


def _handshake_bytes(data: bytes) -> bytes:
    """The concatenated handshake-record payloads at the start of ``data``, as far as they go
    and at least as far as the ClientHello's declared length."""
    out = bytearray()
    pos = 0
    while True:
        if len(out) >= 4 and len(out) >= 4 + int.from_bytes(out[1:4], "big"):
            return bytes(out)
        if len(data) < pos + 5:
            raise Incomplete
        ctype, major, length = data[pos], data[pos + 1], int.from_bytes(data[pos + 3 : pos + 5])
        if ctype != _HANDSHAKE or major != 3 or not 0 < length <= 16384 + 2048:
            raise Malformed("tls", "not a TLS handshake record")
        if pos + 5 + length > MAX_HELLO:
            raise Malformed("tls", f"ClientHello larger than {MAX_HELLO} bytes")
        if len(data) < pos + 5 + length:
            raise Incomplete
        out += data[pos + 5 : pos + 5 + length]
        pos += 5 + length
        if out[0] != _CLIENT_HELLO:
            raise Malformed("tls", "first handshake message is not a ClientHello")


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise Malformed("tls", "ClientHello truncated inside a field")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def number(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")

    def vector(self, length_bytes: int) -> bytes:
        return self.take(self.number(length_bytes))


def _sniff_tls(data: bytes) -> Sniffed:
    hs = _handshake_bytes(data)
    body = _Cursor(hs[4 : 4 + int.from_bytes(hs[1:4], "big")])
    body.take(2 + 32)  # legacy_version, random
    body.vector(1)  # legacy_session_id
    body.vector(2)  # cipher_suites
    body.vector(1)  # legacy_compression_methods
    if body.pos == len(body.data):
        return Sniffed("tls")  # no extensions at all: no SNI
    extensions = _Cursor(body.vector(2))
    name: str | None = None
    ech = False
    seen: set[int] = set()
    while extensions.pos < len(extensions.data):
        ext_type = extensions.number(2)
        ext = extensions.vector(2)
        if ext_type in seen:
            raise Malformed("tls", f"extension {ext_type} repeated")
        seen.add(ext_type)
        if ext_type == _EXT_ECH:
            ech = True
        elif ext_type == _EXT_SNI:
            name = _server_name(ext)
    return Sniffed("tls", name, ech)


def _server_name(ext: bytes) -> str | None:
    names = _Cursor(_Cursor(ext).vector(2))
    found: str | None = None
    while names.pos < len(names.data):
        name_type = names.number(1)
        raw = names.vector(2)
        if name_type != 0:
            continue  # only host_name(0) is defined
        if found is not None:
            raise Malformed("tls", "more than one host_name in server_name")
        try:
            found = raw.decode("ascii")
        except UnicodeDecodeError:
            raise Malformed("tls", "server_name is not ASCII") from None
    if found is None:
        return None
    name = host_name(found)
    if name is None:
        raise Malformed("tls", "server_name is not a DNS name")
    return name


# ---------------------------------------------------------------- HTTP


def _sniff_http(data: bytes) -> Sniffed:
    end = data.find(b"\r\n\r\n")
    if end < 0:
        if len(data) >= MAX_HEAD:
            raise Malformed("http", f"request head larger than {MAX_HEAD} bytes")
        raise Incomplete
    if end + 4 > MAX_HEAD:
        raise Malformed("http", f"request head larger than {MAX_HEAD} bytes")
    try:
        head = data[:end].decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes any byte
        raise Malformed("http", "undecodable head") from None
    lines = head.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise Malformed("http", "bad request line")
    hosts = [
        v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:]) if k.lower() == "host"
    ]
    if len(hosts) > 1:
        raise Malformed("http", "more than one Host header")
    target_host = _absolute_target_host(parts[1])
    if not hosts:
        return Sniffed("http", host_name(target_host) if target_host else None)
    name = host_name(_strip_port(hosts[0]))
    if hosts[0] and name is None and not _is_ip(_strip_port(hosts[0])):
        raise Malformed("http", "Host is not a DNS name")
    if target_host is not None and host_name(target_host) != name:
        raise Malformed("http", "absolute request target names another host than Host")
    return Sniffed("http", name)


def _absolute_target_host(target: str) -> str | None:
    lowered = target.lower()
    for scheme in ("http://", "https://"):
        if lowered.startswith(scheme):
            authority = lowered[len(scheme) :].split("/", 1)[0].rsplit("@", 1)[-1]
            return _strip_port(authority)
    return None


def _strip_port(authority: str) -> str:
    if authority.startswith("["):
        return authority[1:].split("]", 1)[0]
    host, sep, port = authority.rpartition(":")
    return host if sep and port.isdigit() else authority


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def host_name(text: str) -> str | None:
    """``text`` as a policy name (lower case, no trailing dot), or None for an IP literal, an
    empty string or anything that is not a DNS name."""
    name = text.strip().lower().rstrip(".")
    if not name or len(name) > 253 or _is_ip(name) or not _HOSTNAME.fullmatch(name):
        return None
    return name
