"""A real Kubernetes control plane for tests: etcd + kube-apiserver on loopback, no Docker.

The binaries come from ``deploy/envtest/build.sh`` (built with Go from the module proxy and cached
under ``$SANDPOD_ENVTEST_DIR``); when they are missing the test fails and says to run the script.
Everything else is generated per session in a temp dir:

    ca.crt/key --signs--> apiserver.crt (127.0.0.1, localhost)   the API server's TLS identity
               --signs--> admin.crt (O=system:masters)            the tests' credential
    sa.key / sa.pub                                               ServiceAccount token signing

Data flow: etcd (client port) <- kube-apiserver (secure port) <- tests via ``KubeSettings``.
Readiness is an event: ``/readyz`` answering 200, polled with a deadline.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from sandpod_kube import KubeSettings

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "deploy" / "envtest" / "build.sh"
KUBE_VERSION = (REPO / "deploy" / "envtest" / "kube-version").read_text().strip()


def binaries_dir() -> Path:
    """Where build.sh put (or will put) the binaries for the pinned release."""
    if explicit := os.environ.get("SANDPOD_ENVTEST_BIN"):
        return Path(explicit)
    root = os.environ.get("SANDPOD_ENVTEST_DIR") or str(Path.home() / ".cache/sandpod/envtest")
    return Path(root) / KUBE_VERSION / "bin"


def crd_manifests() -> list[dict[str, object]]:
    """Every CRD of schemas/crds/, as the API server takes them (``apply_crds``)."""
    import yaml

    return [
        doc
        for path in sorted((REPO / "schemas" / "crds").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
    ]


def missing_binaries() -> str | None:
    """None when etcd and kube-apiserver are there, else what to run to build them."""
    bin_dir = binaries_dir()
    missing = [b for b in ("etcd", "kube-apiserver") if not os.access(bin_dir / b, os.X_OK)]
    if not missing:
        return None
    return (
        f"{', '.join(missing)} not found in {bin_dir}: build the test control plane with "
        f"`{BUILD_SCRIPT.relative_to(REPO)}` (Go from the module proxy, ~15 min once, then "
        "cached; .ci/run does this)"
    )


# -- certificates ------------------------------------------------------------------------------


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _issue(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    *,
    server: bool = False,
    sans: tuple[str, ...] = (),
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, issuer_key = issuer or (subject, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if issuer is None:
        builder = builder.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
    else:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if server:
        names: list[x509.GeneralName] = []
        for san in ("localhost", "127.0.0.1", *sans):
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(san)))
            except ValueError:
                names.append(x509.DNSName(san))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_pki(
    directory: Path,
    *,
    sans: tuple[str, ...] = (),
    clients: tuple[tuple[str, str, str | None], ...] = (),
) -> None:
    """Write ca.crt, apiserver.{crt,key}, admin.{crt,key}, sa.{key,pub} into ``directory``,
    plus a ``<stem>.{crt,key}`` client certificate per ``(stem, cn, org)`` of ``clients``; the
    API server's certificate also names ``sans`` (IP addresses or DNS names)."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("sandpod-envtest-ca")
    ca = _issue(ca_name, ca_key, None)
    (directory / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for stem, subject, server in (
        ("apiserver", _name("kube-apiserver"), True),
        ("admin", _name("sandpod-test-admin", "system:masters"), False),
        *((stem, _name(cn, org), False) for stem, cn, org in clients),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _issue(subject, key, (ca_name, ca_key), server=server, sans=sans)
        (directory / f"{stem}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(directory / f"{stem}.key", key)
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(directory / "sa.key", sa_key)
    (directory / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


# -- processes ---------------------------------------------------------------------------------


class ControlPlane:
    """etcd + kube-apiserver in ``workdir`` on free loopback ports; ``start()``/``stop()``."""

    def __init__(self, workdir: Path, ports: tuple[int, int, int]) -> None:
        self.dir = workdir
        self.etcd_port, self.peer_port, self.port = ports
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def admin_cert(self) -> tuple[Path, Path]:
        return self.dir / "admin.crt", self.dir / "admin.key"

    @property
    def settings(self) -> KubeSettings:
        """Admin (system:masters) settings for ``sandpod_kube``."""
        cert, key = self.admin_cert
        return KubeSettings(
            host=self.url,
            ca_file=str(self.ca_file),
            client_cert_file=str(cert),
            client_key_file=str(key),
        )

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with (self.dir / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def start(self, timeout: float = 120.0) -> None:
        bin_dir = binaries_dir()
        self.make_pki()
        etcd_url, peer_url = (f"http://127.0.0.1:{p}" for p in (self.etcd_port, self.peer_port))
        self._spawn(
            "etcd",
            [
                str(bin_dir / "etcd"),
                "--name=envtest",
                f"--data-dir={self.dir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=envtest={peer_url}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        self._start_apiserver(etcd_url)
        self._wait_ready(timeout)

    def make_pki(self) -> None:
        """The certificates and keys (the real node's plane names more addresses)."""
        make_pki(self.dir)

    def restart_apiserver(self, timeout: float = 120.0) -> None:
        """Stop kube-apiserver (etcd keeps the data) and start it again on the same port."""
        apiserver = self.procs.pop()
        apiserver.send_signal(signal.SIGTERM)
        try:
            apiserver.wait(15)
        except subprocess.TimeoutExpired:
            apiserver.kill()
            apiserver.wait(5)
        self._start_apiserver(f"http://127.0.0.1:{self.etcd_port}")
        self._wait_ready(timeout)

    def _start_apiserver(self, etcd_url: str) -> None:
        self._spawn("kube-apiserver", self.apiserver_argv(etcd_url))

    def apiserver_argv(self, etcd_url: str) -> list[str]:
        """kube-apiserver's command line (the real node's plane serves on its own address)."""
        d = self.dir
        return [
            str(binaries_dir() / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--cert-dir={d / 'certs'}",
            f"--tls-cert-file={d / 'apiserver.crt'}",
            f"--tls-private-key-file={d / 'apiserver.key'}",
            f"--client-ca-file={d / 'ca.crt'}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={d / 'sa.pub'}",
            f"--service-account-signing-key-file={d / 'sa.key'}",
            # No node or Service IPs here; the endpoint reconciler refuses loopback addresses.
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true",
            "--v=1",
        ]

    def _wait_ready(self, timeout: float) -> None:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        context.load_cert_chain(*map(str, self.admin_cert))
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            for proc, name in zip(self.procs, ("etcd", "kube-apiserver"), strict=True):
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}"
                    )
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", context=context, timeout=2) as r:
                    if r.status == 200:
                        return
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
            except OSError as exc:  # not listening yet
                last = repr(exc)
            time.sleep(0.1)
        tail = self.log_tail("kube-apiserver")
        raise RuntimeError(f"kube-apiserver not ready after {timeout}s ({last}):\n{tail}")

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.dir / f"{name}.log"
        return (
            "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            if path.exists()
            else ""
        )

    def kubeconfig(self) -> Path:
        """A kubeconfig with the admin credential (for kubectl and from_kubeconfig)."""
        cert, key = self.admin_cert
        path = self.dir / "kubeconfig"
        path.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: envtest\n"
            f"clusters:\n- name: envtest\n  cluster:\n    server: {self.url}\n"
            f"    certificate-authority: {self.ca_file}\n"
            "users:\n- name: admin\n  user:\n"
            f"    client-certificate: {cert}\n    client-key: {key}\n"
            "contexts:\n- name: envtest\n  context: {cluster: envtest, user: admin}\n"
        )
        return path

    def stop(self) -> None:
        """SIGTERM the API server, then etcd; kill what does not exit within 15 s."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        self.procs.clear()
