"""The network guard's pure parts: the NetworkPolicy as its outer bound, its settings, the
policy it reads from a Sandbox, NATS kept open, and the chain compiled by the local runtime's
compiler (the guard and the local runtime share ``rules.compile_chain``)."""

from __future__ import annotations

import ipaddress

import pytest

from sandpod_contract.network import NetworkMode, NetworkPolicy
from sandpod_kube.netpolicy import egress_policy
from sandpod_kube.podspec import PodSettings
from sandpod_lifecycle.network.addressing import SandboxAddresses
from sandpod_lifecycle.network.podguard.guard import DENY_ALL, policy_of, with_nats
from sandpod_lifecycle.network.rules import compile_chain, compile_sandbox

GUARDED = PodSettings(
    netguard=True,
    guard_dns=("10.96.0.10", "10.96.0.11:5353"),
    guard_api_cidrs=("10.0.0.1/32",),
    nats_cidrs=("10.96.0.20/32",),
)
NATS_NET = ipaddress.IPv4Network("10.96.0.20/32")


@pytest.fixture(scope="session")
def _session_daemons() -> None:
    """Pure: no nats-server or execd (overrides the root conftest's autouse one)."""


def test_with_the_guard_names_open_the_public_internet_on_their_ports_only() -> None:
    """An allow name rule becomes 0.0.0.0/0 minus special ranges and metadata on its ports
    (the guard narrows it to what it resolved); the guard's DNS and API server are allowed;
    names and deny ports are no longer reported, a bandwidth limit still is."""
    policy = NetworkPolicy.from_dict(
        {
            "mode": "allowlist",
            "allow": ["mirror.example.com:443"],
            "deny": ["8.8.8.8:53"],
            "limits": {"maxConnections": 10, "bandwidthBytesPerSecond": 1000},
        }
    )
    manifest, notes = egress_policy("ns", "t", policy, GUARDED)
    egress = manifest["spec"]["egress"]
    assert {"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}]} in egress
    dns = next(
        r for r in egress if r.get("to", [{}])[0].get("ipBlock", {}).get("cidr") == "10.96.0.10/32"
    )
    assert [p["port"] for p in dns["ports"]] == [53, 53]
    assert {"ipBlock": {"cidr": "10.96.0.11/32"}} in dns["to"]
    (public,) = [r for r in egress if r.get("ports") == [{"protocol": "TCP", "port": 443}]]
    block = public["to"][0]["ipBlock"]
    assert block["cidr"] == "0.0.0.0/0"
    assert {"169.254.0.0/16", "10.0.0.0/8"} <= set(block["except"])
    assert notes == ["a bandwidth limit is not enforced in a Pod"]


def test_without_the_guard_nothing_changes() -> None:
    """Guard off: names are reported and open nothing (the old rendering)."""
    policy = NetworkPolicy.from_dict({"mode": "allowlist", "allow": ["mirror.example.com:443"]})
    manifest, notes = egress_policy("ns", "t", policy, PodSettings(nats_cidrs=("10.96.0.20/32",)))
    assert all("0.0.0.0/0" not in str(r) for r in manifest["spec"]["egress"])
    assert any("DNS name" in n for n in notes)


def test_guard_settings_are_read_and_checked() -> None:
    """SANDPOD_POD_NETGUARD turns it on, and then the cluster DNS is required."""
    env = {
        "SANDPOD_POD_NETGUARD": "true",
        "SANDPOD_POD_GUARD_DNS": "10.96.0.10",
        "SANDPOD_POD_GUARD_API_CIDRS": "10.0.0.1/32",
    }
    settings = PodSettings.from_env(env)
    assert settings.netguard and settings.guard_dns == ("10.96.0.10",)
    assert not PodSettings.from_env({}).netguard
    with pytest.raises(ValueError, match="GUARD_DNS"):
        PodSettings.from_env({"SANDPOD_POD_NETGUARD": "true"})
    with pytest.raises(ValueError, match="GUARD_DNS"):
        PodSettings.from_env({**env, "SANDPOD_POD_GUARD_DNS": "kube-dns"})
    with pytest.raises(ValueError, match="GUARD_API_CIDRS"):
        PodSettings.from_env({**env, "SANDPOD_POD_GUARD_API_CIDRS": "nope"})


def test_the_guard_reads_the_applied_policy_and_fails_closed() -> None:
    """status.network.policy is the policy; no status (or no Sandbox) is deny-all."""
    assert policy_of(None) == DENY_ALL
    assert policy_of({"status": {}}) == DENY_ALL
    wire = {"status": {"network": {"policy": {"mode": "allowlist", "allow": ["a.test"]}}}}
    assert policy_of(wire).mode is NetworkMode.ALLOWLIST


def test_nats_stays_open_under_every_mode() -> None:
    """deny-all becomes an allowlist of NATS alone; other modes gain NATS's host and range."""
    only = with_nats(DENY_ALL, "nats.sandpod.svc.cluster.local", [NATS_NET], 4222)
    assert only.mode is NetworkMode.ALLOWLIST
    assert {r.text for r in only.allow} == {
        "10.96.0.20/32:4222",
        "nats.sandpod.svc.cluster.local:4222",
    }
    public = with_nats(NetworkPolicy(), "10.96.0.20", [NATS_NET], 4222)
    assert [r.text for r in public.allow] == ["10.96.0.20/32:4222"]  # an address: no name rule


def test_one_compiler_for_the_local_runtime_and_the_pod() -> None:
    """The Pod's chain is the local sandbox's chain without the source check."""
    policy = NetworkPolicy.from_dict({"mode": "allowlist", "allow": ["a.test", "1.2.3.0/24"]})
    addrs = SandboxAddresses(
        index=0,
        host=ipaddress.IPv4Address("10.240.0.0"),
        sandbox=ipaddress.IPv4Address("10.240.0.1"),
    )
    local = compile_sandbox("t", addrs, "sp-0", policy, generation=7).splitlines()
    pod = compile_chain("t", 0, policy, generation=7, source=None)
    assert [line for line in local if line in pod] == pod
    assert [line for line in local if "saddr != 10.240.0.1" in line]
    assert not [line for line in pod if "saddr" in line]
