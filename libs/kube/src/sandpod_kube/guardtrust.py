"""What a guarded sandbox Pod trusts: the image's own system CA bundle plus the guard's
interception authorities of the domains its policy injects into (none, until it does), as one
file its commands use by default.

The guard (``podguard``) writes the authorities of the Pod's injected domains to
``egress.pem`` in the ``netguard-trust`` emptyDir (read-only in the sandbox container) on every
policy change. The image's system bundle is only readable from the image, so an init container
``trust-bundle`` (the sandbox's image, its uid, the execd bundle's Python run isolated: no code
of the image runs, and only after the guard's firewall is up) copies it to
``merged/image-bundle.pem`` and writes ``merged/bundle.pem`` = image bundle + ``egress.pem``
(``merged/``: a directory of its own, not sticky like the emptyDir, so the guard may replace
files of the sandbox's uid there); the guard
rewrites ``bundle.pem`` (:func:`rebuild_bundle`) each time it rewrites ``egress.pem``, so a
domain added to ``inject`` at runtime is trusted by the clients started after the update.

Commands get it through their environment (:func:`trust_env`, in ``SANDPOD_EXECD_ENV``: execd
never hands its own environment to a command): ``SSL_CERT_FILE`` (OpenSSL's default paths:
Python's ``ssl``, curl, Go), ``REQUESTS_CA_BUNDLE`` (requests and pip), ``CURL_CA_BUNDLE``,
``GIT_SSL_CAINFO``, and ``NODE_EXTRA_CA_CERTS`` = ``egress.pem`` (Node adds it to its own roots).
Every guarded Pod gets the init container and the variables, so an injection added while it
runs is trusted by the commands started after the update; while its policy injects nothing,
``egress.pem`` is empty and the bundle is the image's own: it trusts no Sandpod authority, as
in the local runtime.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = [
    "BUNDLE_FILE",
    "SYSTEM_BUNDLES",
    "TRUST_BUNDLE_CONTAINER",
    "TRUST_FILE",
    "TRUST_MOUNT",
    "TRUST_SCRIPT",
    "rebuild_bundle",
    "replace_file",
    "trust_bundle_container",
    "trust_env",
]

TRUST_MOUNT = "/run/sandpod-trust"  # the emptyDir "netguard-trust"
TRUST_FILE = f"{TRUST_MOUNT}/egress.pem"  # the guard's authorities
# The init container's files, in a directory of its own: the emptyDir is sticky (1777), where
# the guard (uid 0 without CAP_FOWNER) could not replace a file of the sandbox's uid.
MERGED = "merged"
IMAGE_BUNDLE = "image-bundle.pem"  # the image's system bundle, as the init container found it
BUNDLE_FILE = f"{TRUST_MOUNT}/{MERGED}/bundle.pem"  # the two together: what commands trust
TRUST_BUNDLE_CONTAINER = "trust-bundle"
# Where images keep their system bundle (Debian/Ubuntu/Alpine, Fedora/RHEL, others): the first
# one that is a file is the image's (network/trust.py's BUNDLES, for the local runtime).
SYSTEM_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
)

# argv: the trust directory, then SYSTEM_BUNDLES. Self-contained (the execd bundle's Python has
# no Sandpod library): what rebuild_bundle does, plus the copy of the image's bundle.
TRUST_SCRIPT = r"""
import os, sys
trust, candidates = sys.argv[1], sys.argv[2:]
merged = os.path.join(trust, "merged")
os.makedirs(merged, exist_ok=True)
os.chmod(merged, 0o777)  # not sticky: the guard replaces what is written here
image = b""
for path in candidates:
    if os.path.isfile(path):
        with open(path, "rb") as f:
            image = f.read()
        break
def put(name, data):
    tmp = os.path.join(merged, "." + name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, os.path.join(merged, name))
put("image-bundle.pem", image)
try:
    with open(os.path.join(trust, "egress.pem"), "rb") as f:
        pem = f.read()
except FileNotFoundError:
    pem = b""
if image and not image.endswith(b"\n"):
    image += b"\n"
put("bundle.pem", image + pem)
"""


def trust_env() -> dict[str, str]:
    """The variables that make a command trust :data:`BUNDLE_FILE` (module docstring)."""
    return {
        "SSL_CERT_FILE": BUNDLE_FILE,
        "REQUESTS_CA_BUNDLE": BUNDLE_FILE,
        "CURL_CA_BUNDLE": BUNDLE_FILE,
        "GIT_SSL_CAINFO": BUNDLE_FILE,
        "NODE_EXTRA_CA_CERTS": TRUST_FILE,
    }


def trust_bundle_container(
    image: str, python: str, security_context: dict[str, Any], bundle_volume: tuple[str, str]
) -> dict[str, Any]:
    """The ``trust-bundle`` init container: ``image`` (the sandbox's), ``python`` (the execd
    bundle's, from ``bundle_volume`` = (volume name, mount path)), the sandbox container's
    ``security_context``."""
    name, mount = bundle_volume
    return {
        "name": TRUST_BUNDLE_CONTAINER,
        "image": image,
        "command": [python, "-I", "-S", "-c", TRUST_SCRIPT, TRUST_MOUNT, *SYSTEM_BUNDLES],
        "securityContext": security_context,
        "resources": {
            "requests": {"cpu": "10m", "memory": "16Mi"},
            "limits": {"cpu": "500m", "memory": "64Mi"},
        },
        "volumeMounts": [
            {"name": name, "mountPath": mount, "readOnly": True},
            {"name": "netguard-trust", "mountPath": TRUST_MOUNT},
        ],
    }


def rebuild_bundle(trust_file: Path) -> bool:
    """The guard's half: ``merged/bundle.pem`` beside ``trust_file`` (its ``egress.pem``) from
    ``merged/image-bundle.pem`` and ``trust_file`` again; False (nothing written) when no image
    bundle was copied (no injection at the Pod's start, or the init container has not run yet:
    it writes both itself)."""
    trust_dir = trust_file.parent / MERGED
    try:
        image = (trust_dir / IMAGE_BUNDLE).read_bytes()
    except FileNotFoundError:
        return False
    try:
        pem = trust_file.read_bytes()
    except FileNotFoundError:
        pem = b""
    if image and not image.endswith(b"\n"):
        image += b"\n"
    replace_file(trust_dir / "bundle.pem", image + pem)
    return True


def replace_file(path: Path, data: bytes) -> None:
    """``path`` holds ``data``, readable by the sandbox's uid, never half-written."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
