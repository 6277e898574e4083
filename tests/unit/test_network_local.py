"""The local egress pieces that need no kernel: address slices, policy compilation, settings,
the refused-packet watch. The kernel's side (veth, nftables, real jails) is proven in
tests/integration/test_net_local.py; this layer pins the rules' shape and the bookkeeping."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sandpod_contract.network import NetworkMode, NetworkPolicy
from sandpod_lifecycle.network.addressing import AddressPlan, PoolExhausted, claim_slice
from sandpod_lifecycle.network.denials import DenialWatch
from sandpod_lifecycle.network.egress import Egress, EgressSettings
from sandpod_lifecycle.network.firewall import Firewall, FirewallConfig, UnknownRule
from sandpod_lifecycle.network.link import LinkNames
from sandpod_lifecycle.network.metrics import NetworkMetrics
from sandpod_lifecycle.network.nft import Nft
from sandpod_lifecycle.network.rules import set_name
from sandpod_lifecycle.settings import LifecycleSettings
from sandpod_service.env import SettingsError

POOL = ipaddress.IPv4Network("10.240.0.0/12")


class FakeNft(Nft):
    """Records scripts; answers listings with nothing (a fresh table)."""

    def __init__(self) -> None:
        self.scripts: list[str] = []

    def run(self, script: str) -> str:
        self.scripts.append(script)
        return ""

    def json(self, command: str) -> list[dict[str, Any]]:
        return []


def test_slices_are_claimed_once_per_installation_and_skip_host_networks(tmp_path: Path) -> None:
    """The same installation gets its slice back; another gets a different one; a slice that
    overlaps a network the host routes is never taken; a gone state dir frees its slice."""
    reg, pool = tmp_path / "reg.json", ipaddress.IPv4Network("10.240.0.0/19")  # two slices
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    a = claim_slice("00000000aa", a_dir, pool, reg)
    assert claim_slice("00000000aa", a_dir, pool, reg) == a
    b = claim_slice("00000000ab", b_dir, pool, reg)
    assert b.slice != a.slice and json.loads(reg.read_text())["version"] == 1
    with pytest.raises(PoolExhausted):
        claim_slice("00000000ac", tmp_path / "c", pool, reg)
    b_dir.rmdir()  # b's installation is gone: its slice is free again
    assert claim_slice("00000000ac", tmp_path / "c", pool, reg).slice == b.slice
    with pytest.raises(PoolExhausted):  # the host routes the whole pool already
        claim_slice("00000000ad", tmp_path / "d", pool, None, in_use=[pool])


def test_a_plan_numbers_sandboxes_in_pairs_after_the_gateway() -> None:
    """Pair 0 is the gateway's; sandbox n gets slice+2n (host end) and slice+2n+1 (its own);
    the lowest free index is reused; a full slice says so."""
    plan = AddressPlan(ipaddress.IPv4Network("10.240.16.0/20"))
    assert str(plan.gateway) == "10.240.16.1"
    one = plan.sandbox(1)
    assert (str(one.host), str(one.sandbox)) == ("10.240.16.2", "10.240.16.3")
    assert plan.capacity == 2047
    assert plan.free_index([1, 2, 4]) == 3
    with pytest.raises(PoolExhausted):
        plan.free_index(range(1, 2048))
    with pytest.raises(ValueError, match="outside"):
        plan.sandbox(0)


def _firewall(**kw: Any) -> tuple[Firewall, FakeNft]:
    nft = FakeNft()
    plan = AddressPlan(ipaddress.IPv4Network("10.240.16.0/20"))
    return Firewall(nft, FirewallConfig("abcdef0123", plan, **kw)), nft


def test_a_policy_compiles_to_one_batch_in_deny_allow_mode_order() -> None:
    """Spoof check and hard denies first, deny rules before allow rules, name rules as sets,
    the mode last; public drops the special ranges and accepts the rest; deny-all drops all.
    Every drop goes to the sandbox's deny chain: logged (rate-limited) to the installation's
    NFLOG group with the sandbox's prefix, then counted and dropped."""
    fw, nft = _firewall(proxy_port=3128, log_group=30001)
    plan = fw.config.plan
    policy = NetworkPolicy.from_dict(
        {"mode": "allowlist", "allow": ["1.2.3.0/24:443", "api.example.com"], "deny": ["1.2.3.4"]}
    )
    fw.apply("s1", plan.sandbox(1), "spabcdef-1", policy)
    (script,) = nft.scripts
    rules = [
        line.split(" sbx_1 ", 1)[1]
        for line in script.splitlines()
        if " sbx_1 " in line and "add rule" in line
    ]
    s = set_name(1, policy.allow[1])
    gen = fw._generation
    assert rules == [
        "ip saddr != 10.240.16.3 goto deny_1",
        "ip daddr @hard4 goto deny_1",
        f"ct state established,related ct mark {gen} accept",
        "ip daddr 1.2.3.4/32 goto deny_1",
        f"ip daddr 1.2.3.0/24 meta l4proto {{ tcp, udp }} th dport 443 ct mark set {gen} accept",
        f"ip daddr @{s} ct mark set {gen} accept",
        "goto deny_1",
    ]
    deny = [
        line for line in script.splitlines() if line.startswith("add rule") and " deny_1 " in line
    ]
    assert deny == [
        "add rule inet sandpod_abcdef0123 deny_1 limit rate 5/second burst 20 packets "
        'log prefix "sandpod_abcdef0123:1" group 30001 snaplen 128',
        "add rule inet sandpod_abcdef0123 deny_1 counter name denied_1 drop",
    ]
    assert 'add element inet sandpod_abcdef0123 deny { "spabcdef-1" : goto deny_1 }' in script
    assert fw.sandbox_of_log("sandpod_abcdef0123:1") == "s1"
    assert fw.sandbox_of_log("sandpod_abcdef0123:2") is None  # no such sandbox
    assert fw.sandbox_of_log("sandpod_otherinst0:1") is None  # another installation's
    assert f"ip daddr @{s} tcp dport {{ 80, 443 }} dnat ip to 10.240.16.1:3128" in script
    fw.apply("s1", plan.sandbox(1), "spabcdef-1", NetworkPolicy())
    assert script.count("flush chain inet sandpod_abcdef0123 sbx_1") == 1
    public = nft.scripts[-1]
    assert fw._generation == gen + 1  # each policy its own generation: older flows re-judged
    assert [r for r in public.splitlines() if r.startswith("add rule") and " sbx_1 " in r][-2:] == [
        "add rule inet sandpod_abcdef0123 sbx_1 ip daddr @special4 goto deny_1",
        f"add rule inet sandpod_abcdef0123 sbx_1 ct mark set {gen + 1} accept",
    ]
    fw.apply("s1", plan.sandbox(1), "spabcdef-1", NetworkPolicy.from_dict({"mode": "deny-all"}))
    assert "mark set" not in nft.scripts[-1]  # nothing is accepted but current connections


def test_resolved_addresses_go_to_the_rules_set_with_a_clamped_ttl() -> None:
    """add_resolved refreshes each IPv4 address's timeout (add, delete, add in one batch),
    skips IPv6, clamps the TTL to 1..86400 s, and refuses a rule not in force."""
    fw, nft = _firewall()
    policy = NetworkPolicy.from_dict({"mode": "allowlist", "allow": ["*.example.com:443"]})
    fw.apply("s1", fw.config.plan.sandbox(1), "spabcdef-1", policy)
    assert (
        fw.add_resolved("s1", policy.allow[0], [("5.6.7.8", 0), ("::1", 5), ("9.9.9.9", 1e9)]) == 2
    )
    script = nft.scripts[-1]
    name = set_name(1, policy.allow[0])
    assert f"add element inet sandpod_abcdef0123 {name} {{ 5.6.7.8 timeout 1s }}" in script
    assert f"delete element inet sandpod_abcdef0123 {name} {{ 5.6.7.8 }}" in script
    assert "9.9.9.9 timeout 86400s" in script and "::1" not in script
    assert fw.add_resolved("s1", "*.example.com:443", [("5.6.7.9", 30)]) == 1
    with pytest.raises(UnknownRule):
        fw.add_resolved("s1", "other.com", [("5.6.7.8", 30)])
    with pytest.raises(UnknownRule):
        fw.add_resolved("nobody", policy.allow[0], [("5.6.7.8", 30)])
    assert fw.sandbox_by_address("10.240.16.3") == ("s1", policy)
    assert fw.sandbox_by_address("10.240.16.5") is None


def test_an_injecting_policy_gets_an_injection_set_sent_to_the_proxy() -> None:
    """With a proxy, a policy with ``inject`` entries (public or allowlist) has the set
    ``j<n>`` whose 80/443 traffic is DNAT'ed to the proxy, filled by add_injected; none
    without a proxy, for deny-all, or once the injection is gone (its set deleted)."""
    fw, nft = _firewall(proxy_port=3128)
    plan = fw.config.plan
    inject = [{"domain": "api.example.com", "secret": "tok"}]
    public = NetworkPolicy.from_dict({"mode": "public", "inject": inject})
    fw.apply("s1", plan.sandbox(1), "spabcdef-1", public)
    script = nft.scripts[-1]
    assert "add set inet sandpod_abcdef0123 j1 { type ipv4_addr; flags timeout; }" in script
    assert "add rule inet sandpod_abcdef0123 nat_1 ip daddr @j1 tcp dport { 80, 443 } " in script
    assert fw.add_injected("s1", [("5.6.7.8", 30), ("::1", 30)]) == 1
    assert "add element inet sandpod_abcdef0123 j1 { 5.6.7.8 timeout 30s }" in nft.scripts[-1]
    fw.apply("s1", plan.sandbox(1), "spabcdef-1", NetworkPolicy())
    assert "delete set inet sandpod_abcdef0123 j1" in nft.scripts[-1]
    with pytest.raises(UnknownRule):
        fw.add_injected("s1", [("5.6.7.8", 30)])
    fw.apply(
        "s1", plan.sandbox(1), "spabcdef-1", dataclasses.replace(public, mode=NetworkMode.DENY_ALL)
    )
    assert " j1 " not in nft.scripts[-1]
    fw, nft = _firewall()  # no proxy: nothing would add the header, nothing is redirected
    fw.apply("s1", fw.config.plan.sandbox(1), "spabcdef-1", public)
    assert " j1 " not in nft.scripts[-1] and "dnat" not in nft.scripts[-1]
    with pytest.raises(UnknownRule):
        fw.add_injected("s1", [("5.6.7.8", 30)])


def test_inbound_is_the_gateway_uids_only() -> None:
    """The output chain lets only the configured uid open connections into sandboxes; with
    none configured, nobody."""
    fw, nft = _firewall(gateway_uid=1234)
    fw.setup()
    assert 'oifname "spabcdef-*" meta skuid 1234 accept' in nft.scripts[-1]
    fw, nft = _firewall()
    fw.setup()
    assert "skuid" not in nft.scripts[-1]


def test_egress_settings_come_from_the_environment() -> None:
    """SANDPOD_NET_* set the pool, registry, gateway uid, ports and NFLOG group; bad values
    name the variable."""
    s = LifecycleSettings.from_env(
        {
            "SANDPOD_NET_POOL": "10.100.0.0/16",
            "SANDPOD_NET_GATEWAY_UID": "1001",
            "SANDPOD_NET_PROXY_PORT": "3128",
            "SANDPOD_NET": "false",
        }
    )
    assert s.network.pool == ipaddress.IPv4Network("10.100.0.0/16")
    assert (s.network.gateway_uid, s.network.proxy_port, s.network.enabled) == (1001, 3128, False)
    assert LifecycleSettings.from_env({}).network.enabled
    with pytest.raises(ValueError, match="SANDPOD_NET_POOL"):
        LifecycleSettings.from_env({"SANDPOD_NET_POOL": "8.8.0.0/16"})
    with pytest.raises(ValueError, match="SANDPOD_NET_GATEWAY_UID"):
        LifecycleSettings.from_env({"SANDPOD_NET_GATEWAY_UID": "root"})
    default = LifecycleSettings.from_env({}).network
    assert (default.log_denials, default.log_group) == (True, None)  # derived from the id
    logged = LifecycleSettings.from_env({"SANDPOD_NET_LOG_GROUP": "31000"}).network
    assert (logged.log_denials, logged.log_group) == (True, 31000)
    assert not LifecycleSettings.from_env({"SANDPOD_NET_LOG_GROUP": "off"}).network.log_denials
    with pytest.raises(ValueError, match="SANDPOD_NET_LOG_GROUP"):
        LifecycleSettings.from_env({"SANDPOD_NET_LOG_GROUP": "70000"})


def test_the_always_allowed_list_is_a_setting_checked_at_start() -> None:
    """SANDPOD_NET_ALWAYS_ALLOW: comma-separated allow rules (spaces and empty entries
    ignored); a bad entry is a SettingsError naming the variable and the entry."""
    s = LifecycleSettings.from_env(
        {"SANDPOD_NET_ALWAYS_ALLOW": " mirror.example.com:443, *.mirror.test,,10.0.0.5/32:3128 "}
    )
    assert [r.text for r in s.always_allow] == [
        "mirror.example.com:443",
        "*.mirror.test",
        "10.0.0.5/32:3128",
    ]
    assert LifecycleSettings.from_env({}).always_allow == ()
    for bad in ("mirror.example.com:https", "exa mple.com", "10.0.0.0/33", "a.test:0"):
        with pytest.raises(SettingsError, match=rf"SANDPOD_NET_ALWAYS_ALLOW: entry '{bad}'"):
            LifecycleSettings.from_env({"SANDPOD_NET_ALWAYS_ALLOW": f"ok.test,{bad}"})


async def test_the_denial_watch_reports_growth_once() -> None:
    """Each poll reports only what grew since the last (a new chain's counter starts over),
    adds it to the metric, and forgets sandboxes that are gone."""
    counts: list[Mapping[str, int]] = [{"a": 0}, {"a": 3, "b": 1}, {"a": 3}, {"a": 5, "b": 2}]
    reports: list[tuple[str, str, int]] = []

    async def report(sandbox_id: str, kind: str, count: int) -> None:
        reports.append((sandbox_id, kind, count))

    registry = CollectorRegistry()
    watch = DenialWatch(lambda: counts.pop(0), report, NetworkMetrics(registry))
    assert await watch.step() == {}
    assert await watch.step() == {"a": 3, "b": 1}
    assert await watch.step() == {}
    assert await watch.step() == {"a": 2, "b": 2}
    assert reports == [
        ("a", "connect", 3),
        ("b", "connect", 1),
        ("a", "connect", 2),
        ("b", "connect", 2),
    ]
    total = registry.get_sample_value("sandpod_lifecycle_network_denied_total", {"kind": "connect"})
    assert total == 8


class ListingNft(FakeNft):
    def __init__(self, listing: list[dict[str, Any]]) -> None:
        super().__init__()
        self.listing = listing

    def json(self, command: str) -> list[dict[str, Any]]:
        return self.listing if command == "list chains" else []


def test_host_tables_that_drop_forwarded_packets_are_reported_never_changed(
    tmp_path: Path,
) -> None:
    """Another table's forward chain with policy drop would silently eat sandbox traffic: it
    is named in the start-up notes; our own table and accepting chains are not; nothing is
    written to the other table."""
    listing = [
        {
            "chain": {
                "family": "ip",
                "table": "filter",
                "name": "FORWARD",
                "hook": "forward",
                "policy": "drop",
            }
        },
        {
            "chain": {
                "family": "inet",
                "table": "fw",
                "name": "fwd",
                "hook": "forward",
                "policy": "accept",
            }
        },
        {
            "chain": {
                "family": "inet",
                "table": "sandpod_abcdef0123",
                "name": "forward",
                "hook": "forward",
                "policy": "drop",
            }
        },
    ]
    nft = ListingNft(listing)
    egress = Egress(EgressSettings(registry=None), "abcdef0123", tmp_path, tmp_path / "net", nft)
    notes = egress._host_filters()
    assert len(notes) == 1 and "ip filter chain FORWARD" in notes[0]
    assert "spabcdef-*" in notes[0] and nft.scripts == []


def test_link_names_fit_the_kernels_15_characters() -> None:
    """Host ends, the gateway link and its peer are at most 15 characters, and distinct."""
    names = LinkNames.of("abcdef0123")
    every = [names.sandbox(2047), names.gateway, names.gateway_peer]
    assert all(len(n) <= 15 for n in every) and len(set(every)) == 3
    assert names.sandbox(7).startswith(names.sandbox_prefix)
    assert not names.gateway.startswith(names.sandbox_prefix)
