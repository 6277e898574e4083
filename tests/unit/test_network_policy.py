"""The egress policy model: parsing with typed errors, and the verdicts every enforcer shares."""

from __future__ import annotations

from typing import Any

import pytest

from sandpod_contract.errors import ResourceInvalid
from sandpod_contract.network import (
    NetworkMode,
    NetworkPolicy,
    Rule,
    effective_policy,
)
from sandpod_contract.resources import SandboxSpec, SandboxTemplateSpec


def test_a_template_without_network_is_public() -> None:
    """No ``network`` on a template means the public internet (the issue's default)."""
    spec = SandboxTemplateSpec.from_dict({})
    assert spec.network.mode is NetworkMode.PUBLIC
    assert spec.network.address_verdict("93.184.216.34", 443).allowed


@pytest.mark.parametrize(
    "address",
    [
        "10.1.2.3",
        "192.168.0.1",
        "172.16.9.9",
        "127.0.0.1",
        "169.254.169.254",
        "100.64.0.1",
        "::1",
        "fe80::1",
        "fd00:ec2::254",
        "::ffff:10.0.0.1",
        "224.0.0.1",
    ],
)
def test_public_refuses_special_ranges(address: str) -> None:
    """``public`` refuses private, loopback, link-local, metadata, CGNAT, mapped and multicast."""
    verdict = NetworkPolicy().address_verdict(address, 80)
    assert not verdict.allowed


def test_an_allow_cidr_opens_a_private_range_but_never_the_metadata_service() -> None:
    """An explicit allow CIDR re-opens a private range; the metadata address stays closed."""
    policy = NetworkPolicy.from_dict({"allow": ["10.1.0.0/16", "169.254.0.0/16"]})
    assert policy.address_verdict("10.1.2.3", 5432).allowed
    assert not policy.address_verdict("10.2.0.1", 5432).allowed
    assert not policy.address_verdict("169.254.169.254", 80).allowed


def test_deny_beats_allow_and_ports_narrow_a_rule() -> None:
    """A deny rule wins over an allow rule; a rule with ports covers only those ports."""
    policy = NetworkPolicy.from_dict(
        {
            "mode": "allowlist",
            "allow": ["*.example.com:443", "1.2.3.0/24:8000-8100"],
            "deny": ["bad.example.com"],
        }
    )
    assert policy.name_verdict("api.example.com", 443).allowed
    assert not policy.name_verdict("api.example.com", 80).allowed
    assert policy.name_verdict("API.Example.COM.", None).allowed  # a DNS lookup: any port
    assert not policy.name_verdict("example.com", 443).allowed  # a wildcard is not the apex
    assert not policy.name_verdict("bad.example.com", 443).allowed
    assert policy.name_verdict("bad.example.com", 443).reason == "bad.example.com"
    assert policy.address_verdict("1.2.3.4", 8050).allowed
    assert not policy.address_verdict("1.2.3.4", 22).allowed
    assert not policy.address_verdict("8.8.8.8", 443).allowed  # allowlist: nothing else


def test_deny_all_refuses_names_and_addresses() -> None:
    """``deny-all`` refuses every lookup and every address, whatever else the policy says."""
    policy = NetworkPolicy.from_dict({"mode": "deny-all", "allow": ["example.com"]})
    assert not policy.name_verdict("example.com").allowed
    assert not policy.address_verdict("93.184.216.34").allowed


def test_the_older_egress_list_is_an_allowlist_and_empty_is_deny_all() -> None:
    """``{"egress": [...]}`` (the form before modes) keeps its meaning."""
    legacy = NetworkPolicy.from_dict({"egress": ["10.0.0.0/8", "pypi.example:443"]})
    assert legacy.mode is NetworkMode.ALLOWLIST
    assert [r.text for r in legacy.allow] == ["10.0.0.0/8", "pypi.example:443"]
    assert NetworkPolicy.from_dict({"egress": []}).mode is NetworkMode.DENY_ALL
    spec = SandboxTemplateSpec.from_dict({"network": {"egress": ["10.0.0.0/8"]}})
    assert spec.egress == ("10.0.0.0/8",)


def test_rules_parse_names_wildcards_addresses_and_ports() -> None:
    """Every rule form parses into a name or a network with its ports."""
    assert Rule.parse("f", "[2001:db8::1]:443").network is not None
    v6 = Rule.parse("f", "2001:db8::/32")
    assert v6.network is not None and v6.ports is None
    named = Rule.parse("f", "Example.COM:8000-8100")
    assert named.name == "example.com" and named.ports is not None and 8050 in named.ports


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"mode": "open"}, "spec.network.mode"),
        ({"allow": "example.com"}, "spec.network.allow"),
        ({"allow": ["exa mple.com"]}, "spec.network.allow[0]"),
        ({"allow": ["example.com:0"]}, "spec.network.allow[0]"),
        ({"allow": ["example.com:9-1"]}, "spec.network.allow[0]"),
        ({"deny": [42]}, "spec.network.deny[0]"),
        ({"allow": ["x"] * 513}, "spec.network.allow"),
        ({"limits": {"maxConnections": 0}}, "spec.network.limits.maxConnections"),
        ({"inject": [{"domain": "10.0.0.0/8", "secret": "s"}]}, "spec.network.inject[0].domain"),
        ({"inject": [{"domain": "a.example", "secret": "S!"}]}, "spec.network.inject[0].secret"),
        (
            {"inject": [{"domain": "a.example", "secret": "s", "format": "x\r\nEvil: 1{secret}"}]},
            "spec.network.inject[0].format",
        ),
        ("public", "spec.network"),
    ],
)
def test_bad_policies_are_typed_errors_naming_the_field(raw: Any, field: str) -> None:
    """A malformed policy is a ResourceInvalid whose field names the culprit."""
    with pytest.raises(ResourceInvalid) as err:
        SandboxSpec.from_dict({"network": raw})
    assert err.value.details["field"] == field


def test_a_sandbox_policy_replaces_its_templates_and_round_trips() -> None:
    """A sandbox's own ``spec.network`` (a runtime update) wins; the wire form round-trips."""
    template = NetworkPolicy.from_dict({"mode": "allowlist", "allow": ["a.example"]})
    own = SandboxSpec.from_dict({"network": {"mode": "deny-all"}})
    assert own.network is not None
    assert effective_policy(template, own.network).mode is NetworkMode.DENY_ALL
    assert effective_policy(template, None) is template
    again = SandboxSpec.from_dict(own.to_dict())
    assert again.network == own.network
    platform = (Rule.parse("always", "10.99.0.1:53"),)
    merged = effective_policy(template, None, platform)
    assert merged.address_verdict("10.99.0.1", 53).allowed
    assert effective_policy(merged, None, platform) == merged  # set again: no second copy
    full = NetworkPolicy.from_dict(
        {
            "mode": "public",
            "deny": ["*.bad.example"],
            "limits": {"bandwidthBytesPerSecond": 1000, "maxConnections": 5},
            "inject": [{"domain": "api.example", "secret": "tok"}],
        }
    )
    assert NetworkPolicy.from_dict(full.to_dict()) == full
