"""Which sandboxes a tenant owns: the contract's map (:mod:`sandpod_contract.tenancy`), which
the services enforce from the tenant-scoped subjects the gateway sends on."""

from __future__ import annotations

from sandpod_contract.tenancy import (
    DEFAULT_TENANT,
    LIFECYCLE_NAMESPACE,
    TENANT_LABEL,
    Scope,
    validate_tenant,
)

__all__ = ["DEFAULT_TENANT", "LIFECYCLE_NAMESPACE", "TENANT_LABEL", "Scope", "validate_tenant"]
