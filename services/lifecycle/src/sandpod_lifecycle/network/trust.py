"""What a sandbox with header injections must carry: the interception authorities in its CA
bundle, and placeholders for the secrets in its environment.

At creation, :func:`write_trust` puts :attr:`SandboxTrust.pem` into the sandbox's *writable
layer*: :func:`merge_bundle` adds it to the image's system bundle between marker lines
(replacing an earlier block, so a rewrite never accumulates), and the same PEM goes to
:data:`EXTRA_PEM` for runtimes that ship their own roots (Node's ``NODE_EXTRA_CA_CERTS``, Python
requests' certifi through ``REQUESTS_CA_BUNDLE``). Every sandbox of a node that runs the egress
proxy gets those two variables and the file (empty without injections), so that a policy update
adding a domain to ``inject`` is trusted at once: the local runtime rewrites the running
sandbox's files (:mod:`sandpod_lifecycle.runtime.jailtrust`), and new processes -- a ``curl``,
``git``, ``pip``, ``node`` started after the update -- trust the new authority. A process that
loaded its bundle before keeps the old one: its TLS to the new domain fails closed (it never goes
out unchecked) until it is restarted. A secret added later gets its placeholder variable in
new commands through the lifecycle's ``sys.configure`` (``steps.py``).

A sandbox without injections trusts no Sandpod authority at all: no block in its bundle, an
empty :data:`EXTRA_PEM`.
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


def write_trust(base: Path, upper: Path, trust: SandboxTrust) -> dict[str, str]:
    """Put ``trust`` in a new sandbox's writable layer ``upper`` over its root ``base``: its PEM
    merged into each system bundle of :data:`BUNDLES` the base has (none when it is ""), and
    alone in :data:`EXTRA_PEM` (written even when empty). Returns the environment the
    sandbox's commands get: the placeholders, ``NODE_EXTRA_CA_CERTS``, and
    ``REQUESTS_CA_BUNDLE`` when the base has the system bundle it names.

    Raises:
        OSError: the writable layer cannot be written (the create fails).
    """
    pem = trust.pem
    env = {**trust.env, "NODE_EXTRA_CA_CERTS": EXTRA_PEM}
    if (base / BUNDLES[0].lstrip("/")).is_file():
        env["REQUESTS_CA_BUNDLE"] = BUNDLES[0]
    for inside in (*BUNDLES, EXTRA_PEM):
        rel = inside.lstrip("/")
        source = base / rel
        if inside != EXTRA_PEM and (not pem or not source.is_file()):
            continue
        text = merge_bundle(source.read_text(errors="replace"), pem) if inside != EXTRA_PEM else pem
        target = upper / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        for parent in (p for p in target.relative_to(upper).parents if str(p) != "."):
            # /etc, /etc/ssl...: overlayfs shows the upper dir's mode, so as a base has them
            os.chmod(upper / parent, 0o755)  # noqa: S103 -- world-readable system dirs
        target.write_text(text)
        target.chmod(0o644)
    return env
