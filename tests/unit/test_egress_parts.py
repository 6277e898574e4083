"""The egress proxy's pure parts: what the first bytes name (sniff), what the policy says of a
connection (verdict), and the request grammar that keeps one request from being read two ways
(http1). Real ClientHellos come from OpenSSL through memory BIOs; hostile ones are built here."""

from __future__ import annotations

import ipaddress
import ssl
import struct
from pathlib import Path

import pytest

from sandpod_contract.network import NetworkPolicy
from sandpod_lifecycle.network.ca import InterceptionCA
from sandpod_lifecycle.network.http1 import HttpRefusal, body_length, check_host, parse_head
from sandpod_lifecycle.network.proxyconfig import ProxySettings, SandboxDirectory
from sandpod_lifecycle.network.sandboxnet import SandboxNet
from sandpod_lifecycle.network.sniff import Incomplete, Malformed, Sniffed, sniff
from sandpod_lifecycle.network.trust import SandboxTrust, merge_bundle, sandbox_trust
from sandpod_lifecycle.network.verdict import HardDenies, decide
from sandpod_service.env import SettingsError


def openssl_hello(server_hostname: str | None) -> bytes:
    context = ssl.create_default_context()
    if server_hostname is None:
        context.check_hostname = False
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = context.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


def crafted_hello(extensions: list[tuple[int, bytes]]) -> bytes:
    exts = b"".join(struct.pack("!HH", t, len(d)) + d for t, d in extensions)
    body = b"\x03\x03" + bytes(32) + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00"
    body += struct.pack("!H", len(exts)) + exts
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + struct.pack("!H", len(handshake)) + handshake


def sni_ext(*names: bytes) -> tuple[int, bytes]:
    entries = b"".join(b"\x00" + struct.pack("!H", len(n)) + n for n in names)
    return 0, struct.pack("!H", len(entries)) + entries


def test_sni_of_a_real_client_hello_and_every_prefix_asks_for_more() -> None:
    """OpenSSL's ClientHello gives its SNI; each shorter prefix is Incomplete, not an error."""
    hello = openssl_hello("API.Example.COM")
    assert sniff(hello) == Sniffed("tls", "api.example.com")
    for cut in range(len(hello)):
        with pytest.raises(Incomplete):
            sniff(hello[:cut])


def test_a_client_hello_without_sni_names_nothing() -> None:
    assert sniff(openssl_hello(None)) == Sniffed("tls", None)


def test_a_client_hello_split_over_two_records_is_reassembled() -> None:
    hello = openssl_hello("a.test")
    payload = hello[5:]
    split = b"".join(
        b"\x16\x03\x01" + struct.pack("!H", len(part)) + part
        for part in (payload[:40], payload[40:])
    )
    assert sniff(split).name == "a.test"


def test_encrypted_client_hello_is_reported() -> None:
    """ECH's outer SNI is only the front's public name: flagged so the verdict ignores it."""
    seen = sniff(crafted_hello([sni_ext(b"public.front"), (0xFE0D, b"\x00" * 8)]))
    assert seen == Sniffed("tls", "public.front", ech=True)


@pytest.mark.parametrize(
    "extensions",
    [
        [sni_ext(b"a.test"), sni_ext(b"b.test")],  # the extension twice
        [sni_ext(b"a.test", b"b.test")],  # two host names
        [sni_ext(b"1.2.3.4")],  # an IP literal, forbidden in SNI
        [sni_ext(b"bad name")],
        [(0, b"\x00\x10\x00")],  # truncated list
    ],
)
def test_hostile_client_hellos_are_malformed(extensions: list[tuple[int, bytes]]) -> None:
    with pytest.raises(Malformed):
        sniff(crafted_hello(extensions))


def test_http_host_is_the_name_without_its_port() -> None:
    assert sniff(b"GET / HTTP/1.1\r\nHost: A.test:8080\r\n\r\n") == Sniffed("http", "a.test")
    assert sniff(b"GET / HTTP/1.1\r\nHost: 11.22.0.1\r\n\r\n") == Sniffed("http", None)
    assert sniff(b"GET / HTTP/1.0\r\n\r\n") == Sniffed("http", None)
    with pytest.raises(Incomplete):
        sniff(b"GET / HTTP/1.1\r\nHost: a.te")
    assert sniff(b"SSH-2.0-OpenSSH\r\n") == Sniffed("other")


@pytest.mark.parametrize(
    "head",
    [
        b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n",
        b"GET http://b.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a test\r\n\r\n",
        b"GET /\r\n\r\n",
    ],
)
def test_http_heads_that_name_two_hosts_are_malformed(head: bytes) -> None:
    with pytest.raises(Malformed):
        sniff(head)


# ---------------------------------------------------------------- verdict

A = ipaddress.ip_address("11.22.0.10")
ALLOW = NetworkPolicy.from_dict(
    {
        "mode": "allowlist",
        "allow": ["a.test", "11.22.9.0/24"],
        "deny": ["11.22.0.99"],
        "inject": [{"domain": "a.test", "secret": "k"}],
    }
)


@pytest.mark.parametrize(
    ("policy", "address", "seen", "resolved", "allowed", "rule"),
    [
        (ALLOW, A, Sniffed("tls", "a.test"), {"a.test"}, True, "a.test"),
        (ALLOW, A, Sniffed("tls", "b.test"), {"a.test"}, False, "mode:allowlist"),
        (ALLOW, A, Sniffed("tls", "a.test"), set(), False, "not-resolved"),
        (ALLOW, A, Sniffed("tls", None), {"a.test"}, False, "no-name:tls"),
        (ALLOW, A, Sniffed("tls", "a.test", ech=True), {"a.test"}, False, "ech"),
        (ALLOW, A, Sniffed("other"), {"a.test"}, False, "no-name:other"),
        (
            ALLOW,
            ipaddress.ip_address("11.22.9.5"),
            Sniffed("tls", None),
            set(),
            True,
            "11.22.9.0/24",
        ),
        (
            ALLOW,
            ipaddress.ip_address("11.22.0.99"),
            Sniffed("tls", "a.test"),
            {"a.test"},
            False,
            "11.22.0.99",
        ),
        (NetworkPolicy(), A, Sniffed("tls", "any.test"), set(), True, "mode:public"),
        (
            NetworkPolicy(),
            ipaddress.ip_address("10.0.0.1"),
            Sniffed("tls", "x.test"),
            set(),
            False,
            "not-resolved",
        ),
        (
            NetworkPolicy(),
            ipaddress.ip_address("169.254.169.254"),
            Sniffed("http", "x.test"),
            {"x.test"},
            False,
            "metadata",
        ),
    ],
)
def test_verdicts(
    policy: NetworkPolicy,
    address: ipaddress.IPv4Address,
    seen: Sniffed,
    resolved: set[str],
    *,
    allowed: bool,
    rule: str,
) -> None:
    """Each rule of verdict.py's docstring, by the case it exists for."""
    decision = decide(policy, address, 443, seen, resolved)
    assert (decision.allowed, decision.rule) == (allowed, rule)


def test_an_allowed_inject_domain_is_intercepted_and_only_it() -> None:
    assert decide(ALLOW, A, 443, Sniffed("tls", "a.test"), {"a.test"}).inject is not None
    assert (
        decide(
            ALLOW, ipaddress.ip_address("11.22.9.5"), 443, Sniffed("tls", "b.test"), set()
        ).inject
        is None
    )


def test_public_mode_injects_only_a_name_the_resolver_answered_with_that_address() -> None:
    """Public mode allows any public address on its own, yet a name with an ``inject`` entry
    is intercepted only where the resolver sent this sandbox (a pinned address is refused:
    the secret goes nowhere else); other names there pass untouched (no interception)."""
    public = NetworkPolicy.from_dict(
        {"mode": "public", "inject": [{"domain": "api.test", "secret": "tok"}]}
    )
    hit = decide(public, A, 443, Sniffed("tls", "api.test"), {"api.test"})
    assert hit.allowed and hit.inject is not None
    pinned = decide(public, A, 443, Sniffed("http", "api.test"), {"other.test"})
    assert (pinned.allowed, pinned.rule, pinned.inject) == (False, "not-resolved", None)
    other = decide(public, A, 443, Sniffed("tls", "other.test"), {"api.test"})
    assert (other.allowed, other.rule, other.inject) == (True, "mode:public", None)
    bare = decide(public, A, 443, Sniffed("tls", None), {"api.test"})
    assert (bare.allowed, bare.inject) == (True, None)


def test_connect_to_the_allowed_name_itself_passes() -> None:
    """A CONNECT whose target is the connection's own name is no tunnel elsewhere."""
    check_host(parse_head(b"CONNECT a.test:443 HTTP/1.1\r\nHost: a.test\r\n\r\n"), "a.test")


# ---------------------------------------------------------------- http1


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"GET / HTTP/1.1\r\nHost: a.test\r\n folded: x\r\n\r\n", 400),
        (
            b"POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Length: 3\r\n\r\n",
            400,
        ),
        (b"POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501),
        (b"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: -1\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\nHost: a.test\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: b.test\r\n\r\n", 403),
        (b"GET / HTTP/1.1\r\n\r\n", 400),
        (b"GET http://b.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", 403),
        (b"CONNECT b.test:443 HTTP/1.1\r\nHost: a.test\r\n\r\n", 403),
        (b"CONNECT 11.22.0.9:443 HTTP/1.1\r\nHost: a.test\r\n\r\n", 403),
        (b"connect [::1]:443 HTTP/1.1\r\nHost: a.test\r\n\r\n", 403),
    ],
)
def test_ambiguous_or_foreign_requests_are_refused(head: bytes, status: int) -> None:
    with pytest.raises(HttpRefusal) as refused:
        _read_request(head)
    assert refused.value.status == status


def _read_request(head: bytes) -> None:
    parsed = parse_head(head)
    check_host(parsed, "a.test")
    body_length(parsed)


def test_header_replacement_keeps_one_value() -> None:
    head = parse_head(
        b"GET / HTTP/1.1\r\nHost: a.test\r\nauthorization: x\r\nAuthorization: y\r\n\r\n"
    )
    head.replace("Authorization", "Bearer s")
    assert head.values("authorization") == ["Bearer s"]
    assert head.encode().endswith(b"Authorization: Bearer s\r\n\r\n")


# ---------------------------------------------------------------- sandbox trust


def test_sandbox_trust_only_with_injections_and_the_bundle_block_is_rewritten(
    tmp_path: Path,
) -> None:
    """No inject entry: no authority, no variables. With one: its PEM, placeholders, and the
    image's bundle gets one managed block that an update replaces and an empty PEM removes."""
    ca = InterceptionCA(tmp_path / "ca", "inst")
    assert sandbox_trust(ca, NetworkPolicy()) == SandboxTrust("", {})
    trust = sandbox_trust(ca, ALLOW)
    assert trust.pem.count("BEGIN CERTIFICATE") == 1
    assert trust.env["SANDPOD_SECRET_K"] == "sandpod-placeholder-k"
    image = "-----BEGIN CERTIFICATE-----\nroot\n-----END CERTIFICATE-----"
    once = merge_bundle(image, trust.pem)
    assert merge_bundle(once, trust.pem) == once
    assert merge_bundle(once, "") == image + "\n"
    assert once.startswith(image)


def test_proxy_settings_from_the_environment() -> None:
    """Documented variables are read; a bad one is a clear error, not a default."""
    settings = ProxySettings.from_env(
        {"SANDPOD_EGRESS_SNIFF_TIMEOUT": "2.5", "SANDPOD_EGRESS_UPSTREAM_CA_FILE": "/x/ca.pem"}
    )
    assert settings.sniff_timeout == 2.5
    assert settings.upstream_ca_file == Path("/x/ca.pem")
    assert ProxySettings.from_env({}) == ProxySettings()
    with pytest.raises(SettingsError, match="SANDPOD_EGRESS_MAX_SNIFFING"):
        ProxySettings.from_env({"SANDPOD_EGRESS_MAX_SNIFFING": "0"})


def test_hard_denies_refuse_the_host_and_the_metadata_service_whatever_the_policy() -> None:
    """A DNAT'ed connection becomes the proxy's own: it must not reach loopback, the metadata
    service or the networks the lifecycle adds (host addresses, the sandbox pool)."""
    deny = HardDenies([ipaddress.ip_network("10.240.0.0/12"), ipaddress.ip_network("192.0.2.7/32")])
    ip = ipaddress.ip_address
    assert deny(ip("127.0.0.1"), 443) == "hard-deny:127.0.0.0/8"
    assert deny(ip("169.254.169.254"), 80) == "metadata"
    assert deny(ip("fd00:ec2::254"), 80) == "metadata"
    assert deny(ip("::1"), 443) == "hard-deny:::1/128"
    assert deny(ip("10.241.0.3"), 443) == "hard-deny:10.240.0.0/12"
    assert deny(ip("192.0.2.7"), 443) == "hard-deny:192.0.2.7/32"
    assert deny(ip("11.22.0.10"), 443) is None


def test_sandbox_directory_updates_replace_whole_mappings() -> None:
    """A lookup by source text; an IPv4-mapped IPv6 source finds the IPv4 entry."""
    directory = SandboxDirectory()
    directory.set("10.240.0.2", SandboxNet("s1", NetworkPolicy()))
    assert directory("10.240.0.2") == SandboxNet("s1", NetworkPolicy())
    directory.set("::ffff:10.240.0.2", SandboxNet("s1", ALLOW))
    assert directory("10.240.0.2") == SandboxNet("s1", ALLOW)
    directory.remove("10.240.0.2")
    assert directory("10.240.0.2") is None
