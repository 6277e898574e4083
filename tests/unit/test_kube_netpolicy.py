"""The NetworkPolicy model rendered as a Kubernetes NetworkPolicy (sandpod_kube.netpolicy):
what each mode opens, what deny rules and the metadata service take out, what is reported as
not enforceable. The same manifests are applied to a real API server in tests/k8s."""

from __future__ import annotations

from typing import Any

import pytest

from sandpod_contract.network import SPECIAL_RANGES, NetworkPolicy
from sandpod_kube.netpolicy import egress_policy
from sandpod_kube.podspec import PodSettings

PINNED = PodSettings(nats_cidrs=("10.96.0.10/32",))
NATS = {
    "to": [{"ipBlock": {"cidr": "10.96.0.10/32"}}],
    "ports": [{"protocol": "TCP", "port": 4222}],
}
DNS = {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}


@pytest.fixture(scope="session")
def _session_daemons() -> None:
    """Pure: no nats-server or execd (overrides the root conftest's autouse one)."""


def _render(wire: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    manifest, notes = egress_policy("ns", "t", NetworkPolicy.from_dict(wire), PINNED)
    assert manifest["spec"]["ingress"] == [] and manifest["spec"]["policyTypes"] == [
        "Ingress",
        "Egress",
    ]
    return manifest["spec"]["egress"], notes


def test_deny_all_is_nats_only() -> None:
    """deny-all: NATS and nothing else, not even DNS; nothing to report."""
    assert _render({"mode": "deny-all", "allow": ["a.test"]}) == ([NATS], [])


def test_public_is_the_internet_without_the_special_ranges() -> None:
    """public: DNS, 0.0.0.0/0 and ::/0 each except every special range of its family (the
    metadata service's 169.254.0.0/16 and fd00::/7 among them)."""
    rules, notes = _render({"mode": "public"})
    assert notes == [] and rules[:2] == [NATS, DNS]
    v4, v6 = rules[2]["to"]
    assert v4["ipBlock"]["cidr"] == "0.0.0.0/0" and v6["ipBlock"]["cidr"] == "::/0"
    special_v4 = {str(n) for n in SPECIAL_RANGES if n.version == 4} - {"0.0.0.0/0"}
    assert set(v4["ipBlock"]["except"]) == special_v4
    assert "169.254.0.0/16" in v4["ipBlock"]["except"] and "fc00::/7" in v6["ipBlock"]["except"]
    assert len(rules) == 3


def test_public_deny_cidrs_are_taken_out_and_allow_cidrs_open_special_ranges() -> None:
    """A deny CIDR joins the excepts; an allow CIDR in a private range is its own block, minus
    the metadata address and the deny CIDRs inside it; a wholly denied allow is dropped."""
    rules, notes = _render(
        {
            "mode": "public",
            "allow": ["10.20.0.0/16:5432", "169.254.0.0/16", "11.0.0.0/24"],
            "deny": ["11.0.0.0/8", "10.20.5.0/24", "8.8.8.8:53"],
        }
    )
    v4 = rules[2]["to"][0]["ipBlock"]
    assert {"11.0.0.0/8", "10.20.5.0/24"} <= set(v4["except"])
    assert rules[3] == {
        "to": [{"ipBlock": {"cidr": "10.20.0.0/16", "except": ["10.20.5.0/24"]}}],
        "ports": [{"protocol": "TCP", "port": 5432}],
    }
    assert rules[4] == {
        "to": [{"ipBlock": {"cidr": "169.254.0.0/16", "except": ["169.254.169.254/32"]}}]
    }
    assert len(rules) == 5  # 11.0.0.0/24 is inside a deny: no block
    assert notes == ["deny rule '8.8.8.8:53' has ports (a NetworkPolicy cannot deny one port)"]


def test_allowlist_is_its_cidrs_with_ports_and_names_are_reported() -> None:
    """allowlist: each allow CIDR with its ports (a range as port/endPort), DNS only because a
    name rule needs it; names, limits and injections are reported as not enforceable."""
    rules, notes = _render(
        {
            "mode": "allowlist",
            "allow": ["1.2.3.4:8000-8100", "[2001:db8::1]:443", "api.test:443"],
            "deny": ["*.bad.test"],
            "limits": {"maxConnections": 10},
        }
    )
    assert rules == [
        NATS,
        DNS,
        {
            "to": [{"ipBlock": {"cidr": "1.2.3.4/32"}}],
            "ports": [{"protocol": "TCP", "port": 8000, "endPort": 8100}],
        },
        {
            "to": [{"ipBlock": {"cidr": "2001:db8::1/128"}}],
            "ports": [{"protocol": "TCP", "port": 443}],
        },
    ]
    assert len(notes) == 3 and "'api.test:443' is a DNS name" in notes[0]
    assert "'*.bad.test'" in notes[1] and "limits" in notes[2]
    cidrs_only, _ = _render({"mode": "allowlist", "allow": ["10.0.0.0/8"]})
    assert DNS not in cidrs_only  # no name: no DNS
