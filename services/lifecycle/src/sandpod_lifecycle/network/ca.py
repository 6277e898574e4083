"""The installation's interception authorities: the certificates the egress proxy shows a
sandbox for the domains it injects secrets into, and nothing else.

Why one small CA per injected domain (all of one installation's under one 0700 directory in its
state dir) rather than one root: a sandbox must trust the platform *only for the named
domains*. Each authority is self-signed and carries a critical X.509 ``NameConstraints``
extension permitting only its domain (``api.example.com``, or ``.example.com`` for a
``*.example.com`` rule); TLS libraries (OpenSSL, Go, NSS) apply a trust anchor's name
constraints, so even a leaked key cannot mint a certificate a sandbox accepts for any other
name. A single root would be trusted for everything, or would have to be re-issued (and
re-trusted by every sandbox) whenever any policy's injection list changed.

Data flow: ``trust_pem(domains)`` -> the PEM the sandbox's CA bundle gets (added to its writable
layer by the holder wiring); ``server_context(domain, name)`` -> an ``ssl.SSLContext`` with a
short-lived leaf for ``name`` signed by ``domain``'s authority, cached until half its lifetime.
Keys are EC P-256, written once with mode 0600 (checked again on every load: a key file that
others could have read is refused, :class:`CaError`).

Threat model: whoever can read this directory (root on the node, the lifecycle) can
impersonate the injected domains to the sandboxes that trust them, which is the point: the
platform terminates those connections to add the secret. It cannot impersonate any other name
to any sandbox, and a sandbox without injections trusts nothing of it.
"""

from __future__ import annotations

import collections
import datetime
import os
import secrets
import ssl
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["LEAF_LIFETIME", "CaError", "InterceptionCA"]

LEAF_LIFETIME = 24 * 3600.0
CA_LIFETIME = 10 * 365 * 24 * 3600.0
MAX_CACHED = 1024  # leaf contexts kept (least recently used dropped)


class CaError(Exception):
    """The authority directory or a key in it cannot be used safely. ``code`` is stable."""

    code = "network.ca"


def _label(domain: str) -> str:
    # Rule names are [a-z0-9_-.] with an optional leading "*.": safe file names as they are.
    return "wildcard." + domain[2:] if domain.startswith("*.") else domain


def _constraint(domain: str) -> str:
    # RFC 5280: "example.com" permits it and every name below; ".example.com" only names below.
    return domain[1:] if domain.startswith("*.") else domain


class InterceptionCA:
    """The authorities of one installation, kept in ``directory`` (created 0700)."""

    def __init__(
        self,
        directory: Path,
        installation: str,
        *,
        leaf_lifetime: float = LEAF_LIFETIME,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = directory
        self.installation = installation
        self.leaf_lifetime = leaf_lifetime
        self._clock = clock
        self._lock = threading.Lock()  # the proxy's thread and the lifecycle's both call in
        self._authorities: dict[str, tuple[ec.EllipticCurvePrivateKey, x509.Certificate]] = {}
        self._leaves: collections.OrderedDict[tuple[str, str], tuple[ssl.SSLContext, float]] = (
            collections.OrderedDict()
        )
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(directory, 0o700)
        except OSError as exc:
            raise CaError(f"cannot create {directory}: {exc.strerror}") from exc

    def trust_pem(self, domains: Iterable[str]) -> str:
        """The PEM certificates a sandbox whose policy injects into ``domains`` must trust
        (one name-constrained authority per domain rule; generated on first use)."""
        return "".join(
            self.certificate(d).public_bytes(serialization.Encoding.PEM).decode()
            for d in sorted(set(domains))
        )

    def certificate(self, domain: str) -> x509.Certificate:
        return self._authority(domain)[1]

    def server_context(self, domain: str, name: str) -> ssl.SSLContext:
        """A TLS server context presenting a leaf for ``name`` issued by ``domain``'s authority
        (``name`` must be covered by the rule ``domain``; the caller matched it)."""
        now = self._clock()
        with self._lock:
            cached = self._leaves.pop((domain, name), None)
            if cached is not None and cached[1] > now:
                self._leaves[(domain, name)] = cached
                return cached[0]
        context = self._mint(domain, name, now)
        with self._lock:
            self._leaves[(domain, name)] = (context, now + self.leaf_lifetime / 2)
            while len(self._leaves) > MAX_CACHED:
                self._leaves.popitem(last=False)
        return context

    # ------------------------------------------------------------ authorities

    def _authority(self, domain: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        with self._lock:
            found = self._authorities.get(domain)
            if found is None:
                found = self._load(domain) or self._create(domain)
                self._authorities[domain] = found
            return found

    def _paths(self, domain: str) -> tuple[Path, Path]:
        label = _label(domain)
        return self.directory / f"{label}.key", self.directory / f"{label}.crt"

    def _load(self, domain: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate] | None:
        key_path, crt_path = self._paths(domain)
        try:
            fd = os.open(key_path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CaError(f"{key_path}: {exc.strerror}") from exc
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if stat.S_IMODE(info.st_mode) & 0o077 or info.st_uid != os.geteuid():
                raise CaError(f"{key_path}: must be owned by us with mode 0600, refusing to use it")
            key = serialization.load_pem_private_key(f.read(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise CaError(f"{key_path}: not an EC key")
        try:
            cert = x509.load_pem_x509_certificate(crt_path.read_bytes())
        except (OSError, ValueError) as exc:
            raise CaError(f"{crt_path}: unreadable certificate") from exc
        return key, cert

    def _create(self, domain: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Sandpod"),
                x509.NameAttribute(
                    NameOID.COMMON_NAME, f"Sandpod egress {self.installation} {domain}"[:64]
                ),
            ]
        )
        now = datetime.datetime.fromtimestamp(self._clock(), datetime.UTC)
        public = key.public_key()
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(seconds=CA_LIFETIME))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_ca_usage(), critical=True)
            .add_extension(
                x509.NameConstraints([x509.DNSName(_constraint(domain))], None), critical=True
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(key, hashes.SHA256())
        )
        key_path, crt_path = self._paths(domain)
        pem_key = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        _write_private(key_path, pem_key)
        _write_private(crt_path, cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
        return key, cert

    # ------------------------------------------------------------ leaves

    def _mint(self, domain: str, name: str, now_s: float) -> ssl.SSLContext:
        ca_key, ca_cert = self._authority(domain)
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.fromtimestamp(now_s, datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(seconds=self.leaf_lifetime))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])  # the injector speaks HTTP/1.1 only
        pem = cert.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        # load_cert_chain reads files only: a 0600 file in a private directory, gone at once.
        with tempfile.TemporaryDirectory(dir=self.directory, prefix=".leaf-") as tmp:
            path = Path(tmp) / f"{secrets.token_hex(8)}.pem"
            _write_private(path, pem)
            context.load_cert_chain(path)
        return context


def _ca_usage() -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=False,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )


def _write_private(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` atomically, created with ``mode`` from the first byte."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
