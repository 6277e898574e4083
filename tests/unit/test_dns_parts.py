"""The node resolver's pure parts: answer screening, the bounded memories, wire limits,
settings. (The resolver itself is tested on real sockets in tests/integration/test_dns_*.)"""

from __future__ import annotations

from pathlib import Path

import dns.message
import dns.rcode
import dns.rdata
import dns.rdataclass
import dns.rdatatype
import dns.rrset
import pytest

from sandpod_contract.network import NetworkPolicy
from sandpod_lifecycle.network.dnscache import AnswerCache, ResolvedNames
from sandpod_lifecycle.network.dnspolicy import allowing_rules, screen
from sandpod_lifecycle.network.dnswire import DnsWireError, formerr_from_header, parse_query
from sandpod_lifecycle.network.resolver import ResolverSettings
from sandpod_lifecycle.network.upstream import upstreams_from_resolv_conf


def rrset(name: str, rdtype: str, ttl: int, *values: str) -> dns.rrset.RRset:
    return dns.rrset.from_text(name, ttl, "IN", rdtype, *values)


def pol(raw: dict[str, object]) -> NetworkPolicy:
    return NetworkPolicy.from_dict(raw)


def test_screen_keeps_public_and_cuts_special_addresses() -> None:
    """Public mode: loopback, private and metadata addresses leave the answer, public stay."""
    answer = [rrset("a.test.", "A", 300, "11.22.0.1", "127.0.0.1", "169.254.169.254", "10.0.0.1")]
    out = screen(pol({"mode": "public"}), answer, max_ttl=600, remaining=None)
    assert out.addresses == [("11.22.0.1", 300)]
    assert {a for a, _ in out.removed} == {"127.0.0.1", "169.254.169.254", "10.0.0.1"}
    assert [rd.address for rd in out.answer[0]] == ["11.22.0.1"]


def test_screen_allow_cidr_opens_a_private_range_but_never_metadata() -> None:
    """An allow CIDR lets its private addresses through; metadata stays out whatever the rule."""
    answer = [rrset("a.test.", "A", 60, "10.1.1.1", "169.254.169.254")]
    policy = pol({"mode": "allowlist", "allow": ["a.test", "10.0.0.0/8", "169.254.0.0/16"]})
    out = screen(policy, answer, max_ttl=600, remaining=None)
    assert out.addresses == [("10.1.1.1", 60)]
    assert out.removed == [("169.254.169.254", "metadata")]


def test_screen_port_scoped_deny_cidr_is_left_to_the_firewall() -> None:
    """A deny CIDR with ports does not remove the address from DNS (a lookup has no port)."""
    answer = [rrset("a.test.", "A", 60, "11.22.0.1")]
    out = screen(pol({"deny": ["11.22.0.0/16:22"]}), answer, 600, None)
    assert out.addresses == [("11.22.0.1", 60)]
    out = screen(pol({"deny": ["11.22.0.0/16"]}), answer, 600, None)
    assert out.addresses == []


def test_screen_caps_ttl_and_cuts_to_remaining() -> None:
    """TTLs are capped at max_ttl and at a cached answer's remaining seconds."""
    answer = [rrset("a.test.", "A", 86400, "11.22.0.1")]
    assert screen(pol({}), answer, 600, None).answer[0].ttl == 600
    assert screen(pol({}), answer, 600, 42).addresses == [("11.22.0.1", 42)]


def test_screen_refuses_a_chain_into_a_denied_name() -> None:
    """A CNAME target (or any owner) a deny rule covers refuses the answer whole."""
    answer = [
        rrset("ok.test.", "CNAME", 60, "bad.test."),
        rrset("bad.test.", "A", 60, "11.22.0.1"),
    ]
    out = screen(pol({"deny": ["bad.test"]}), answer, 600, None)
    assert out.denied_by == ("bad.test", "bad.test")
    assert out.answer == [] and out.addresses == []


def test_allowing_rules_lists_every_rule_naming_the_name() -> None:
    """Every allow rule naming the query is reported (each one's ports get opened)."""
    policy = pol({"mode": "allowlist", "allow": ["a.test:443", "*.test:22", "b.test", "1.2.3.4"]})
    assert [r.text for r in allowing_rules(policy, "a.test")] == ["a.test:443", "*.test:22"]


def test_answer_cache_expires_and_stays_bounded() -> None:
    """Entries live for the smallest TTL (capped), the least recently used go past the bound,
    SERVFAIL is never cached."""
    cache = AnswerCache(max_entries=2, max_ttl=100)
    query = dns.message.make_query("a.test", "A")
    response = dns.message.make_response(query)
    response.answer = [rrset("a.test.", "A", 500, "11.22.0.1")]
    entry = cache.put(("a.test", 1, 1), response, now=0.0)
    assert entry.remaining(0.0) == 100
    assert cache.get(("a.test", 1, 1), 99.0) is not None
    assert cache.get(("a.test", 1, 1), 100.0) is None
    for i in range(3):
        cache.put((f"n{i}.test", 1, 1), response, now=0.0)
    assert len(cache) == 2 and cache.get(("n0.test", 1, 1), 1.0) is None
    failed = dns.message.make_response(query)
    failed.set_rcode(dns.rcode.SERVFAIL)
    cache.put(("f.test", 1, 1), failed, now=0.0)
    assert cache.get(("f.test", 1, 1), 0.0) is None


def test_resolved_names_expire_and_stay_bounded() -> None:
    """Names are known per sandbox and address until their seconds pass; bounded per sandbox
    and in sandboxes; v4-mapped addresses find the v4 entry."""
    names = ResolvedNames(max_addresses_per_sandbox=2, max_sandboxes=2)
    names.record("s1", {"a.test"}, [("11.22.0.1", 30)], now=0.0)
    assert names.names("s1", "::ffff:11.22.0.1", 29.0) == {"a.test"}
    assert names.names("s1", "11.22.0.1", 30.0) == set()
    assert names.names("s2", "11.22.0.1", 1.0) == set()
    names.record("s1", {"b.test"}, [("11.22.0.2", 30), ("11.22.0.3", 30)], now=0.0)
    assert names.names("s1", "11.22.0.1", 1.0) == set()  # pushed out by the bound
    names.record("s2", {"x"}, [("1.1.1.1", 9)], 0.0)
    names.record("s3", {"x"}, [("1.1.1.1", 9)], 0.0)
    assert names.names("s1", "11.22.0.2", 1.0) == set()  # the oldest sandbox went
    names.forget("s3")
    assert names.names("s3", "1.1.1.1", 1.0) == set()
    assert names.names("s2", "not an address", 1.0) == set()


@pytest.mark.parametrize(
    ("wire", "reason"),
    [
        (b"\x00" * 5, "short"),
        (b"\x00" * 5000, "too_large"),
        (b"\x00\x01\x80\x00" + b"\x00" * 8, "not_a_query"),
        (b"\x00\x01\x20\x00" + b"\x00" * 8, "opcode"),
        (b"\x00\x01\x01\x00\x00\x01" + b"\x00" * 6 + b"\xff", "malformed"),
        (b"\x00\x01\x01\x00" + b"\x00" * 8, "questions"),
    ],
)
def test_parse_query_reasons(wire: bytes, reason: str) -> None:
    """Each kind of bad packet has its stable reason."""
    with pytest.raises(DnsWireError) as caught:
        parse_query(wire, max_bytes=4096)
    assert caught.value.reason == reason


def test_formerr_answers_a_header_and_never_a_response() -> None:
    """FORMERR keeps the id and RD; a response or a headerless packet gets nothing."""
    wire = formerr_from_header(b"\x12\x34\x01\x00" + b"\xff" * 20)
    assert wire is not None
    reply = dns.message.from_wire(wire)
    assert reply.id == 0x1234 and reply.rcode() == dns.rcode.FORMERR
    assert formerr_from_header(b"\x12\x34\x81\x00" + b"\x00" * 8) is None
    assert formerr_from_header(b"\x12") is None


def test_upstreams_from_resolv_conf(tmp_path: Path) -> None:
    """nameserver lines in order, junk skipped, a missing file is no upstream."""
    conf = tmp_path / "resolv.conf"
    conf.write_text("# c\nnameserver 10.0.0.53\nnameserver bogus\nsearch x\nnameserver ::1\n")
    assert upstreams_from_resolv_conf(conf) == (("10.0.0.53", 53), ("::1", 53))
    assert upstreams_from_resolv_conf(tmp_path / "none") == ()


def test_settings_from_env() -> None:
    """SANDPOD_DNS_* are read once; bad values are refused with the variable's name."""
    settings = ResolverSettings.from_env(
        {
            "SANDPOD_DNS_UPSTREAMS": "10.0.0.1, 10.0.0.2:5353, [2001:db8::1]:53",
            "SANDPOD_DNS_DENIED_RCODE": "nxdomain",
            "SANDPOD_DNS_MIN_TTL": "10",
        }
    )
    assert settings.upstreams == (("10.0.0.1", 53), ("10.0.0.2", 5353), ("2001:db8::1", 53))
    assert settings.denied_rcode == dns.rcode.NXDOMAIN and settings.min_ttl == 10
    with pytest.raises(ValueError, match="SANDPOD_DNS_DENIED_RCODE"):
        ResolverSettings.from_env({"SANDPOD_DNS_DENIED_RCODE": "drop"})
    with pytest.raises(ValueError, match="SANDPOD_DNS_UPSTREAMS"):
        ResolverSettings.from_env({"SANDPOD_DNS_UPSTREAMS": "10.0.0.1:http"})
    with pytest.raises(ValueError, match="min_ttl"):
        ResolverSettings(upstreams=(("10.0.0.1", 53),), min_ttl=700, max_ttl=600)


def test_rdata_types_used_exist() -> None:
    """The HTTPS/SVCB types the screening strips are dnspython's (guards a library upgrade)."""
    rd = dns.rdata.from_text(
        dns.rdataclass.IN, dns.rdatatype.HTTPS, '1 . alpn="h2" ipv4hint=1.2.3.4'
    )
    out = screen(pol({}), [dns.rrset.from_rdata_list("s.test.", 60, [rd])], 600, None)
    assert "ipv4hint" not in out.answer[0][0].to_text()
