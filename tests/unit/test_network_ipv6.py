"""The IPv6 half of the local egress that needs no kernel: v6 slices in the shared registry, the
numbering, the chain's IPv6 twins, AAAA answers into the v6 sets, the host settings
(forwarding, router advertisements) on a fake ``/proc/sys/net/ipv6/conf``, and the setting.
The kernel's side is proven in tests/integration/test_net_ipv6.py."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Any

import pytest

from sandpod_contract.network import NetworkPolicy
from sandpod_lifecycle.network.addressing import (
    DEFAULT_POOL6,
    AddressPlan,
    PoolExhausted,
    claim_slice,
    claim_slice6,
)
from sandpod_lifecycle.network.firewall import Firewall, FirewallConfig
from sandpod_lifecycle.network.ipv6 import enable_forwarding, host_support
from sandpod_lifecycle.network.nft import Nft
from sandpod_lifecycle.network.rules import compile_chain, set_name, set_name6
from sandpod_lifecycle.settings import LifecycleSettings

T = "sandpod_abcdef0123"


class FakeNft(Nft):
    def __init__(self) -> None:
        self.scripts: list[str] = []

    def run(self, script: str) -> str:
        self.scripts.append(script)
        return ""

    def json(self, command: str) -> list[dict[str, Any]]:
        return []


def _firewall(**kw: Any) -> tuple[Firewall, FakeNft]:
    nft = FakeNft()
    plan = AddressPlan(
        ipaddress.IPv4Network("10.240.16.0/20"),
        slice6=ipaddress.IPv6Network("fd53:616e:6470:7::/64"),
    )
    return Firewall(nft, FirewallConfig("abcdef0123", plan, **kw)), nft


def test_v6_slices_sit_next_to_the_v4_ones_and_never_collide(tmp_path: Path) -> None:
    """Each installation claims a /64 of the v6 pool in the same registry as its v4 /20 (a key
    of its own); the same id gets it back, another a different one, a /64 the host routes is
    skipped, and a gone state dir frees both of its claims."""
    reg = tmp_path / "reg.json"
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    pool6 = ipaddress.IPv6Network("fd53:616e:6470::/63")  # two /64s
    claim_slice("00000000aa", a_dir, registry=reg)
    a6 = claim_slice6("00000000aa", a_dir, pool6, reg)
    assert claim_slice6("00000000aa", a_dir, pool6, reg) == a6
    b6 = claim_slice6("00000000ab", b_dir, pool6, reg)
    assert a6 != b6 and a6.prefixlen == b6.prefixlen == 64
    pools = json.loads(reg.read_text())["pools"]
    assert set(pools) == {"10.240.0.0/12", str(pool6)}
    with pytest.raises(PoolExhausted, match="SANDPOD_NET_POOL6"):
        claim_slice6("00000000ac", tmp_path / "c", pool6, reg)
    b_dir.rmdir()
    assert claim_slice6("00000000ac", tmp_path / "c", pool6, reg) == b6
    host = [ipaddress.IPv6Network(b6)]
    assert claim_slice6("00000000ad", tmp_path / "d", pool6, None, in_use=host) == a6
    assert claim_slice6("abcdef", tmp_path, DEFAULT_POOL6, None).subnet_of(DEFAULT_POOL6)


def test_a_sandbox_gets_a_127_numbered_like_its_31() -> None:
    plan = AddressPlan(
        ipaddress.IPv4Network("10.240.16.0/20"),
        slice6=ipaddress.IPv6Network("fd53:616e:6470:7::/64"),
    )
    s = plan.sandbox(3)
    assert (str(s.host), str(s.sandbox)) == ("10.240.16.6", "10.240.16.7")
    assert (str(s.host6), str(s.sandbox6)) == ("fd53:616e:6470:7::6", "fd53:616e:6470:7::7")
    assert str(plan.gateway6) == "fd53:616e:6470:7::1"
    plain = AddressPlan(ipaddress.IPv4Network("10.240.16.0/20")).sandbox(3)
    assert plain.sandbox6 is None


def test_the_chain_has_an_ipv6_twin_of_every_rule() -> None:
    """Spoofed v6 source and ``hard6`` first, v6 CIDR deny/allow rules, a v6 set per name
    rule, ``special6`` in public mode, both families in one connection count; a policy with
    IPv4 CIDRs only opens no IPv6 but its names' sets. The Pod guard's chain (no ``ipv6``) is
    unchanged: IPv4 only."""
    fw, nft = _firewall(proxy_port=3128)
    policy = NetworkPolicy.from_dict(
        {
            "mode": "allowlist",
            "allow": ["1.2.3.0/24", "[2001:db8::/32]:443", "api.example.com"],
            "deny": ["2001:db8::1"],
            "limits": {"maxConnections": 7},
        }
    )
    fw.apply("s1", fw.config.plan.sandbox(1), "spabcdef-1", policy)
    script = nft.scripts[-1]
    head = f"add rule inet {T} sbx_1"
    six = set_name6(1, policy.allow[2])
    assert f"{head} ip6 saddr != fd53:616e:6470:7::3 goto deny_1" in script
    assert f"{head} ip6 daddr @hard6 goto deny_1" in script
    assert f"{head} ip6 daddr 2001:db8::1/128 goto deny_1" in script
    assert (
        f"{head} ip6 daddr 2001:db8::/32 meta l4proto {{ tcp, udp }} th dport 443 ct mark set"
        in script
    )
    assert f"add set inet {T} {six} {{ type ipv6_addr; flags timeout; }}" in script
    assert f"{head} ip6 daddr @{six} ct mark set" in script
    assert "dnat ip6 to [fd53:616e:6470:7::1]:3128" in script
    assert "add @cl1 { iifname ct count over 7 }" in script and "@cc1" not in script
    v4_only = NetworkPolicy.from_dict({"mode": "allowlist", "allow": ["1.2.3.0/24"]})
    fw.apply("s1", fw.config.plan.sandbox(1), "spabcdef-1", v4_only)
    rules = [line for line in nft.scripts[-1].splitlines() if line.startswith(head)]
    assert [r for r in rules if "ip6" in r and "accept" in r] == []
    assert rules[-1] == f"{head} goto deny_1"  # the allowlist's end: all the rest refused
    public = compile_chain(T, 1, NetworkPolicy(), generation=5, source="10.0.0.1", ipv6=True)
    assert public.index(f"{head} ip6 daddr @special6 goto deny_1") == len(public) - 2
    guard = compile_chain(T, 0, policy, generation=5, source=None)
    assert not any("ip6" in line or "_6" in line for line in guard)


def test_aaaa_answers_go_to_the_rules_v6_set_and_nowhere_without_ipv6() -> None:
    fw, nft = _firewall()
    policy = NetworkPolicy.from_dict({"mode": "allowlist", "allow": ["api.example.com"]})
    fw.apply("s1", fw.config.plan.sandbox(1), "spabcdef-1", policy)
    added = fw.add_resolved("s1", policy.allow[0], [("5.6.7.8", 30), ("2001:db8::5", 30)])
    script = nft.scripts[-1]
    assert added == 2
    assert f"{set_name(1, policy.allow[0])} {{ 5.6.7.8 timeout 30s }}" in script
    assert f"{set_name6(1, policy.allow[0])} {{ 2001:db8::5 timeout 30s }}" in script
    assert fw.sandbox_by_address("fd53:616e:6470:7::3") == ("s1", policy)
    fw.setup()
    base = nft.scripts[-1]
    assert "fd00:ec2::254" in base and "fd53:616e:6470::/48" in base and "fe80::/10" in base
    assert "ip6 saddr fd53:616e:6470:7::/64" in base and "masquerade" in base
    assert "meta nfproto ipv6 iifname vmap @deny" not in base
    nft4 = FakeNft()
    plain = Firewall(nft4, FirewallConfig("abcdef0123", AddressPlan(fw.config.plan.slice)))
    plain.apply("s1", plain.config.plan.sandbox(1), "spabcdef-1", policy)
    assert plain.add_resolved("s1", policy.allow[0], [("2001:db8::5", 30)]) == 0
    plain.setup()
    assert "meta nfproto ipv6 iifname vmap @deny" in nft4.scripts[-1]  # no v6: all refused


def _conf(tmp_path: Path, forwarding: str, ifaces: dict[str, str]) -> Path:
    for name in ("all", "default", *ifaces):
        (tmp_path / name).mkdir()
        (tmp_path / name / "accept_ra").write_text(ifaces.get(name, "1") + "\n")
    (tmp_path / "all" / "forwarding").write_text(forwarding + "\n")
    (tmp_path / "all" / "disable_ipv6").write_text("0\n")
    return tmp_path


def test_forwarding_keeps_router_advertisements_where_they_were_accepted(tmp_path: Path) -> None:
    """Enabling IPv6 forwarding first moves every interface with accept_ra=1 (not Sandpod's
    own links) to 2, so a SLAAC-configured host keeps its routes; each change is a note; a
    host that forwards already is left alone."""
    conf = _conf(tmp_path, "0", {"eth0": "1", "eth1": "0", "spabcdef-1": "1"})
    notes = enable_forwarding(conf)
    assert (conf / "eth0" / "accept_ra").read_text() == "2"
    assert (conf / "eth1" / "accept_ra").read_text().strip() == "0"
    assert (conf / "spabcdef-1" / "accept_ra").read_text().strip() == "1"
    assert (conf / "all" / "forwarding").read_text() == "1"
    assert len(notes) == 2 and "eth0" in notes[0] and "forwarding" in notes[1]
    assert enable_forwarding(conf) == []
    assert host_support(conf) is None
    (conf / "all" / "disable_ipv6").write_text("1\n")
    assert "disabled" in (host_support(conf) or "")
    assert "no IPv6" in (host_support(tmp_path / "missing") or "")


def test_the_ipv6_setting() -> None:
    assert LifecycleSettings.from_env({}).network.ipv6 is None  # auto: when the host has it
    assert LifecycleSettings.from_env({"SANDPOD_NET_IPV6": "off"}).network.ipv6 is False
    assert LifecycleSettings.from_env({"SANDPOD_NET_IPV6": "on"}).network.ipv6 is True
    pool = LifecycleSettings.from_env({"SANDPOD_NET_POOL6": "fd99::/48"}).network.pool6
    assert pool == ipaddress.IPv6Network("fd99::/48")
    for name, value in (
        ("SANDPOD_NET_IPV6", "maybe"),
        ("SANDPOD_NET_POOL6", "2001:4860::/32"),
        ("SANDPOD_NET_POOL6", "10.0.0.0/8"),
    ):
        with pytest.raises(ValueError, match=name):
            LifecycleSettings.from_env({name: value})
