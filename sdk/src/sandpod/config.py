"""Where the SDK connects: explicit arguments first, then the environment, then the default."""

from __future__ import annotations

import os

from sandpod_contract.subjects import DEFAULT_PREFIX

__all__ = [
    "DEFAULT_NATS_URL",
    "resolve_inbox_prefix",
    "resolve_nats_creds",
    "resolve_nats_url",
    "resolve_prefix",
    "resolve_tenant",
]

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"


def resolve_nats_url(explicit: str | None) -> str:
    """``explicit``, else ``$SANDPOD_NATS_URL``, else ``$NATS_URL``, else localhost:4222."""
    return (
        explicit
        or os.environ.get("SANDPOD_NATS_URL")
        or os.environ.get("NATS_URL")
        or DEFAULT_NATS_URL
    )


def resolve_prefix(explicit: str | None) -> str:
    return explicit or os.environ.get("SANDPOD_PREFIX") or DEFAULT_PREFIX


def resolve_nats_creds(explicit: str | None = None) -> str | None:
    """``explicit``, else ``$SANDPOD_NATS_CREDS``: a creds file for a NATS in operator mode
    (None: connect without)."""
    return explicit or os.environ.get("SANDPOD_NATS_CREDS") or None


def resolve_tenant(explicit: str | None = None) -> str | None:
    """``explicit``, else ``$SANDPOD_TENANT``: act as that tenant (control-plane requests on its
    own subjects, ``<prefix>.api.t.<tenant>.…``), as a tenant NATS credential requires."""
    return explicit or os.environ.get("SANDPOD_TENANT") or None


def resolve_inbox_prefix(explicit: str | None = None) -> str | None:
    """``explicit``, else ``$SANDPOD_NATS_INBOX_PREFIX``: the reply-inbox prefix a tenant
    credential allows (``_INBOX.<tenant-token>``; ``sandpod creds nats`` prints it)."""
    return explicit or os.environ.get("SANDPOD_NATS_INBOX_PREFIX") or None
