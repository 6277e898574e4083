"""Gateway pieces without a server: the tenant map, HTTP statuses of wire codes, Range parsing."""

from __future__ import annotations

import itertools

import pytest

from sandpod_gateway.errors import RangeNotSatisfiable, http_status
from sandpod_gateway.tenancy import Scope, validate_tenant
from sandpod_gateway.transfer import parse_range


def test_tenant_map_is_injective_and_reversible() -> None:
    """No two (tenant, name) pairs share a sandbox id, and each id maps back to its owner only."""
    tenants = ["default", "a", "a-b", "ab", "b"]
    names = ["x", "b-x", "a-b", "x1", "b--x", "-x", "x-"]
    owners: dict[str, tuple[str, str]] = {}
    for tenant, name in itertools.product(tenants, names):
        sid = Scope(tenant).sandbox_id(name)
        if sid is None:
            continue
        assert sid not in owners, (tenant, name, owners.get(sid))
        owners[sid] = (tenant, name)
    for sid, (tenant, name) in owners.items():
        for other in tenants:
            assert Scope(other).name_of(sid) == (name if other == tenant else None)


def test_tenant_ids_are_validated() -> None:
    """Tenant ids are short DNS labels without '--'."""
    for bad in ("", "A", "a--b", "-a", "a" * 31, "a.b"):
        with pytest.raises(ValueError, match="invalid tenant"):
            validate_tenant(bad)
    assert validate_tenant("acme-1") == "acme-1"


def test_outbound_hides_other_tenants_objects() -> None:
    """A lifecycle object is shown to its tenant under its own name and namespace only."""
    obj = {"metadata": {"name": "acme--box", "namespace": "default"}}
    assert Scope("acme").outbound(obj) == {"metadata": {"name": "box", "namespace": "acme"}}
    assert Scope("other").outbound(obj) is None
    assert Scope("default").outbound(obj) is None


def test_http_status_by_code_family() -> None:
    """Wire codes map to statuses by their most specific known prefix."""
    assert http_status("sandbox.not_found") == 404
    assert http_status("exec.command_not_found") == 422
    assert http_status("fs.not_found") == 404
    assert http_status("bad_request.too_large") == 413
    assert http_status("bad_request.whatever_new") == 400
    assert http_status("busy") == 503 and http_status("busy.rate_limited") == 429
    assert http_status("proc.not_found") == 404 and http_status("proc.error") == 422
    assert http_status("internal") == 500 and http_status("timeout") == 504


def test_range_parsing() -> None:
    """Single byte ranges: explicit, open-ended, suffix; outside the file is 416."""
    assert parse_range(None, 100) is None
    assert parse_range("bytes=0-9", 100) == (0, 10)
    assert parse_range("bytes=90-", 100) == (90, 10)
    assert parse_range("bytes=-5", 100) == (95, 5)
    assert parse_range("bytes=50-500", 100) == (50, 50)
    for bad in ("bytes=100-", "bytes=5-1", "items=0-1", "bytes=-0", "bytes=0-1,3-4"):
        with pytest.raises(RangeNotSatisfiable):
            parse_range(bad, 100)
