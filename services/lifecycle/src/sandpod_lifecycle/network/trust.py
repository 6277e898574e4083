"""What a sandbox with header injections must carry: the interception authorities in its CA
bundle, and placeholders for the secrets in its environment.

The holder wiring, at sandbox creation only, writes :attr:`SandboxTrust.pem` into the
sandbox's *writable layer*: :func:`merge_bundle` adds it to the image's system bundle between
marker lines (replacing an earlier block, so a rewrite never accumulates), and the same PEM goes
to :data:`EXTRA_PEM` for runtimes that ship their own roots (Node's ``NODE_EXTRA_CA_CERTS``,
Python requests' certifi through ``REQUESTS_CA_BUNDLE``). A policy update that adds a domain to
``inject`` reaches the proxy at once, but not this trust (not yet: the bundle is not rewritten
in a running sandbox): the sandbox's TLS to that domain fails closed -- it never goes out
without the check -- until the sandbox is recreated.

A sandbox without injections gets nothing: it trusts no Sandpod authority at all.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from sandpod_contract.network import NetworkPolicy
from sandpod_lifecycle.network.ca import InterceptionCA
from sandpod_lifecycle.network.secretstore import placeholder_env

__all__ = [
    "BUNDLES",
    "EXTRA_PEM",
    "SandboxTrust",
    "merge_bundle",
    "sandbox_trust",
    "write_trust",
]

# Where images keep their system bundle (Debian/Ubuntu/Alpine, Fedora/RHEL, others).
BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
)
EXTRA_PEM = "/etc/ssl/certs/sandpod-egress.pem"
_BEGIN = "# --- sandpod egress authorities (managed; rewritten on policy updates) ---\n"
_END = "# --- end sandpod egress authorities ---\n"


@dataclasses.dataclass(frozen=True, slots=True)
class SandboxTrust:
    pem: str  # "" when the policy injects nothing
    env: dict[str, str]  # placeholders, and the bundle variables when pem is set


def sandbox_trust(ca: InterceptionCA, policy: NetworkPolicy) -> SandboxTrust:
    """The trust and environment a sandbox under ``policy`` needs (see the module)."""
    domains = [i.domain.name for i in policy.inject if i.domain.name is not None]
    if not domains:
        return SandboxTrust("", {})
    env = placeholder_env(policy)
    env["NODE_EXTRA_CA_CERTS"] = EXTRA_PEM
    env["REQUESTS_CA_BUNDLE"] = BUNDLES[0]
    return SandboxTrust(ca.trust_pem(domains), env)


def merge_bundle(bundle: str, pem: str) -> str:
    """``bundle`` with the Sandpod block replaced by ``pem`` (removed when ``pem`` is "")."""
    start = bundle.find(_BEGIN)
    end = bundle.find(_END, start)
    if start >= 0 and end >= 0:
        bundle = bundle[:start] + bundle[end + len(_END) :]
    if not pem:
        return bundle
    if bundle and not bundle.endswith("\n"):
        bundle += "\n"
    return bundle + _BEGIN + pem + _END


def write_trust(base: Path, upper: Path, pem: str) -> list[str]:
    """Put ``pem`` in a new sandbox's writable layer ``upper`` over its root ``base``: merged
    into each system bundle of :data:`BUNDLES` the base has, and alone in :data:`EXTRA_PEM`.
    Returns the paths written (inside the sandbox). Nothing is written when ``pem`` is "".

    Raises:
        OSError: the writable layer cannot be written (the create fails).
    """
    if not pem:
        return []
    written = []
    for inside in (*BUNDLES, EXTRA_PEM):
        rel = inside.lstrip("/")
        source = base / rel
        if inside != EXTRA_PEM and not source.is_file():
            continue
        text = merge_bundle(source.read_text(errors="replace"), pem) if inside != EXTRA_PEM else pem
        target = upper / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        for parent in (p for p in target.relative_to(upper).parents if str(p) != "."):
            # /etc, /etc/ssl...: overlayfs shows the upper dir's mode, so as a base has them
            os.chmod(upper / parent, 0o755)  # noqa: S103 -- world-readable system dirs
        target.write_text(text)
        target.chmod(0o644)
        written.append(inside)
    return written
