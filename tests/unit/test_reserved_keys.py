"""The pure pieces of tenant isolation: reserved keys, the tenant's names, tenant subjects and
a tenant credential's permissions (the attacks themselves are in tests/integration)."""

from __future__ import annotations

from typing import Any

import pytest

from sandpod.control import create_object
from sandpod.pools import claim_object
from sandpod_bus.natsauth import (
    MAX_TENANT_SANDBOXES,
    KeyPair,
    creds_jwt,
    decode_jwt,
    tenant_creds,
    tenant_permissions,
)
from sandpod_contract.errors import BadRequest
from sandpod_contract.reserved import is_reserved, keep_reserved, refuse_reserved
from sandpod_contract.subjects import Subjects
from sandpod_contract.tenancy import Scope


@pytest.fixture(scope="session")
def _session_daemons() -> None:
    """Pure functions: no nats-server."""


@pytest.mark.parametrize(
    ("key", "reserved"),
    [
        ("sandpod.dev/pool", True),
        ("x.sandpod.dev/a", True),
        ("SANDPOD.DEV/a", True),
        ("sandpod.dev", False),
        ("team", False),
        ("example.com/sandpod.dev", False),
        ("notsandpod.dev/a", False),
    ],
)
def test_reserved_keys_are_the_sandpod_dev_domain_and_its_subdomains(
    key: str, reserved: bool
) -> None:
    """``sandpod.dev/`` and ``*.sandpod.dev/`` prefixes are reserved, nothing else."""
    assert is_reserved(key) is reserved


def test_refuse_reserved_names_the_field_and_key() -> None:
    """Labels, annotations, a claim's spec.labels and any ownerReferences are refused."""
    cases: list[tuple[dict[str, Any], str]] = [
        ({"metadata": {"labels": {"a": "b", "sandpod.dev/pool": "p"}}}, "sandpod.dev/pool"),
        ({"metadata": {"annotations": {"sandpod.dev/bound-at": "1"}}}, "sandpod.dev/bound-at"),
        ({"metadata": {"ownerReferences": [{"uid": "x"}]}}, "ownerReferences"),
    ]
    for obj, key in cases:
        with pytest.raises(BadRequest) as caught:
            refuse_reserved(obj)
        assert caught.value.details["key"] == key and key in caught.value.message
    claim = {"spec": {"labels": {"sandpod.dev/claim": "c"}}}
    refuse_reserved(claim)  # spec.labels only matter for claims
    with pytest.raises(BadRequest):
        refuse_reserved(claim, spec_labels=True)
    refuse_reserved({"metadata": {"labels": {"example.com/x": "y"}}})
    assert keep_reserved({"a": "1"}, {"sandpod.dev/tenant": "t", "a": "0", "b": "2"}) == {
        "a": "1",
        "sandpod.dev/tenant": "t",
    }


def test_the_sdk_refuses_reserved_labels_before_sending() -> None:
    """create_object and claim_object raise the service's error early."""
    common = {"name": None, "template": None, "timeout": None, "idle_timeout": None, "env": None}
    with pytest.raises(BadRequest):
        create_object(**common, permanent=False, labels={"sandpod.dev/pool": "x"})
    with pytest.raises(BadRequest):
        claim_object(**common, pool="p", labels={"sandpod.dev/tenant": "a"})


def test_a_tenant_names_only_its_own_ids() -> None:
    """own_id maps a bare name to the tenant's id and keeps its ids; another's is None."""
    acme, default = Scope("acme"), Scope("default")
    assert acme.own_id("box") == acme.own_id("acme--box") == "acme--box"
    assert acme.own_id("beta--box") is None and acme.own_id("") is None
    assert default.own_id("box") == "box" and default.own_id("acme--box") is None
    assert acme.owns("acme--box") and not acme.owns("box") and not default.owns("acme--box")


def test_tenant_subjects_round_trip() -> None:
    """A tenant client's api() is its tenant subject; services parse the tenant back."""
    s = Subjects("px")
    assert s.api_tenant("acme", "sandboxes", "list") == "px.api.t.acme.sandboxes.list"
    assert Subjects("px", tenant="acme").api("pools", "get") == "px.api.t.acme.pools.get"
    assert s.parse_api_tenant("px.api.t.acme.claims.create") == ("acme", "claims", "create")
    assert s.parse_api("px.api.t.acme.claims.create") is None
    assert s.parse_api_tenant("px.api.sandboxes.list") is None
    assert s.api_tenant_kind("pools") == "px.api.t.*.pools.*"
    with pytest.raises(ValueError, match="invalid tenant"):
        Subjects("px", tenant="a.b")


def test_a_tenant_credential_carries_exactly_its_sandboxes_and_subjects() -> None:
    """Publish: each sandbox's data plane and the tenant's control subjects; subscribe: its
    inbox prefix; an expiry; too many sandboxes or a bad tenant is a BadRequest."""
    perms = tenant_permissions("px", "acme", ["acme--b", "acme--a", "acme--a"])
    assert perms.pub_allow == ("px.sbx.acme--a.>", "px.sbx.acme--b.>", "px.api.t.acme.>")
    assert perms.sub_allow == ("_INBOX.t-acme.>",)
    account = KeyPair.generate("account")
    cred = tenant_creds(
        account, prefix="px", tenant="acme", sandbox_ids=["acme--a"], now=100, ttl=60
    )
    claims = decode_jwt(creds_jwt(cred.creds))
    assert claims["exp"] == 160 and claims["iss"] == account.public
    assert claims["nats"]["sub"]["allow"] == ["_INBOX.t-acme.>"]
    assert "issuer_account" not in claims["nats"]
    signer = KeyPair.generate("account")
    signed = tenant_creds(
        signer, prefix="px", tenant="acme", sandbox_ids=[], now=1, ttl=5, account=account.public
    )
    assert decode_jwt(creds_jwt(signed.creds))["nats"]["issuer_account"] == account.public
    for bad in (
        lambda: tenant_permissions(
            "px", "acme", [f"s{i}" for i in range(MAX_TENANT_SANDBOXES + 1)]
        ),
        lambda: tenant_permissions("px", "a--b", []),
        lambda: tenant_creds(account, prefix="px", tenant="acme", sandbox_ids=[], now=1, ttl=0),
    ):
        with pytest.raises(BadRequest):
            bad()
