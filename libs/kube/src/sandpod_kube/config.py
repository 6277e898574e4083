"""How to reach an API server: typed settings, turned into a ``kubernetes`` client in one place.

Services build :class:`KubeSettings` once at start (:meth:`KubeSettings.from_env`: explicit
variables, a kubeconfig file, or the in-cluster service account) and pass it down; deep code never
reads the environment or a kubeconfig itself.

``kubernetes`` is imported inside the methods that need it, not at module load: the services read
their settings in every mode, and importing the client costs ~1 s that the KV mode never needs.

| variable | meaning |
|---|---|
| ``SANDPOD_KUBE_SERVER`` | API server URL; with it, the explicit variables below are used |
| ``SANDPOD_KUBE_CA_FILE`` | PEM bundle of the API server's CA |
| ``SANDPOD_KUBE_TOKEN_FILE`` | file holding a bearer token (a ServiceAccount token) |
| ``SANDPOD_KUBE_CLIENT_CERT`` / ``SANDPOD_KUBE_CLIENT_KEY`` | client certificate instead |
| ``SANDPOD_KUBECONFIG`` / ``KUBECONFIG`` | kubeconfig file (when no server is given) |
| ``SANDPOD_KUBE_CONTEXT`` | kubeconfig context (default: the current one) |
| ``SANDPOD_KUBE_NAMESPACE`` | only this namespace is listed and watched (unset: all) |
| ``SANDPOD_KUBE_TLS_SERVER_NAME`` | the name the API server's certificate must carry, when the |
| | URL's host is another (the server reached through a relay) |

Without a server or kubeconfig, inside a pod (``KUBERNETES_SERVICE_HOST`` set) the mounted
ServiceAccount is used, else ``~/.kube/config``.

Leader election (:class:`LeaderSettings`, used by :mod:`sandpod_kube.leader`; client-go's
defaults):

| variable | default | meaning |
|---|---|---|
| ``SANDPOD_LEADER_LEASE_DURATION`` | 15 s | whole seconds a dead leader's Lease stays taken |
| ``SANDPOD_LEADER_RENEW_DEADLINE`` | 10 s | a leader unable to renew this long stops acting |
| ``SANDPOD_LEADER_RETRY_PERIOD`` | 2 s | how often each replica tries to acquire or renew |
| ``SANDPOD_LEADER_NAMESPACE`` | | the Lease's namespace; else ``SANDPOD_NAMESPACE`` (the |
| | | pod's, from the chart), the watched namespace, the pod's ServiceAccount's, ``default`` |
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubernetes import client

__all__ = ["KubeSettings", "LeaderSettings"]

_SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


class _TokenFile:
    """The client's refresh hook: the token file's content, re-read only when the file changed
    (its mtime), so every request carries the current token at the cost of one ``stat``."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._mtime = -1

    def __call__(self, cfg: client.Configuration) -> None:
        try:
            mtime = self._path.stat().st_mtime_ns
            if mtime != self._mtime:
                cfg.api_key["BearerToken"] = self._path.read_text().strip()
                self._mtime = mtime
        except OSError:  # keep the last token; the API server's 401 says the rest
            return


@dataclasses.dataclass(frozen=True, slots=True)
class KubeSettings:
    """Connection to one API server.

    Attributes:
        host: API server URL, e.g. ``https://127.0.0.1:6443``.
        ca_file: PEM bundle that signs the API server's certificate (None: system trust).
        token: bearer token (a static token; tests).
        token_file: file holding the bearer token, re-read when it changes: projected
            ServiceAccount tokens rotate (hourly) and a token read once would expire.
        client_cert_file / client_key_file: client certificate authentication instead of a token.
        max_workers: threads running blocking client calls (bounds concurrent requests).
        request_timeout: seconds for one non-watch request (connect + read).
        watch_timeout: seconds the API server keeps one watch request open before the store
            re-opens it from the last revision seen (bounded, so a dead connection is noticed).
        tls_server_name: the name the API server's certificate must carry when the URL's host
            is another (None: the URL's host).
        namespace: when set, "all namespaces" means this one (a namespace-scoped installation,
            and what lets several installations share one API server).
    """

    host: str
    ca_file: str | None = None
    token: str | None = dataclasses.field(default=None, repr=False)
    token_file: str | None = None
    client_cert_file: str | None = None
    client_key_file: str | None = None
    max_workers: int = 8
    request_timeout: float = 30.0
    watch_timeout: int = 300
    namespace: str | None = None
    tls_server_name: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> KubeSettings:
        """Settings from ``SANDPOD_KUBE_*`` variables (table above). Raises ValueError."""
        base = cls._from_env(env)
        name = env.get("SANDPOD_KUBE_TLS_SERVER_NAME", "").strip() or None
        return dataclasses.replace(base, tls_server_name=name) if name else base

    @classmethod
    def _from_env(cls, env: Mapping[str, str]) -> KubeSettings:

        def get(*names: str) -> str | None:
            return next((env[n].strip() for n in names if env.get(n, "").strip()), None)

        namespace = get("SANDPOD_KUBE_NAMESPACE")
        server = get("SANDPOD_KUBE_SERVER")
        if server:
            token_file = get("SANDPOD_KUBE_TOKEN_FILE")
            if token_file and not Path(token_file).is_file():
                raise ValueError(f"SANDPOD_KUBE_TOKEN_FILE={token_file!r} is not a readable file")
            return cls(
                host=server,
                ca_file=get("SANDPOD_KUBE_CA_FILE"),
                token_file=token_file,
                client_cert_file=get("SANDPOD_KUBE_CLIENT_CERT"),
                client_key_file=get("SANDPOD_KUBE_CLIENT_KEY"),
                namespace=namespace,
            )
        kubeconfig = get("SANDPOD_KUBECONFIG", "KUBECONFIG")
        if kubeconfig is None and get("KUBERNETES_SERVICE_HOST"):
            return dataclasses.replace(cls.in_cluster(), namespace=namespace)
        base = cls.from_kubeconfig(kubeconfig, get("SANDPOD_KUBE_CONTEXT"))
        return dataclasses.replace(base, namespace=namespace)

    @classmethod
    def from_kubeconfig(
        cls, path: str | Path | None = None, context: str | None = None
    ) -> KubeSettings:
        """Settings from a kubeconfig file (``$KUBECONFIG`` or ``~/.kube/config`` when None)."""
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(  # type: ignore[no-untyped-call]  # untyped in the client
            config_file=str(path) if path else None, context=context, client_configuration=cfg
        )
        return cls._from_configuration(cfg)

    @classmethod
    def in_cluster(cls) -> KubeSettings:
        """Settings from the pod's mounted ServiceAccount (only inside a cluster); the token file
        is re-read as the kubelet rotates it."""
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        return dataclasses.replace(
            cls._from_configuration(cfg), token=None, token_file=f"{_SERVICE_ACCOUNT}/token"
        )

    @classmethod
    def _from_configuration(cls, cfg: client.Configuration) -> KubeSettings:
        auth = str(cfg.api_key.get("authorization") or cfg.api_key.get("BearerToken") or "")
        token = auth.removeprefix("Bearer ").strip() or None
        return cls(
            host=str(cfg.host),
            ca_file=cfg.ssl_ca_cert,
            token=token,
            client_cert_file=cfg.cert_file,
            client_key_file=cfg.key_file,
        )

    def api_client(self) -> client.ApiClient:
        """A new ``kubernetes`` ApiClient for these settings (the caller closes it)."""
        from kubernetes import client

        cfg = client.Configuration(host=self.host)
        cfg.verify_ssl = True
        cfg.ssl_ca_cert = self.ca_file
        cfg.cert_file = self.client_cert_file
        cfg.key_file = self.client_key_file
        if self.tls_server_name:
            cfg.tls_server_name = self.tls_server_name
        if self.token:
            cfg.api_key = {"BearerToken": self.token}
            cfg.api_key_prefix = {"BearerToken": "Bearer"}
        if self.token_file:
            cfg.api_key_prefix = {"BearerToken": "Bearer"}
            hook = _TokenFile(Path(self.token_file))
            hook(cfg)  # the client sends a token only if one is there before the hook runs
            cfg.refresh_api_key_hook = hook  # type: ignore[assignment]  # typed None in the client
        # One pooled connection per worker thread, plus the long-lived watch streams.
        cfg.connection_pool_maxsize = self.max_workers + 4
        return client.ApiClient(cfg)


@dataclasses.dataclass(frozen=True, slots=True)
class LeaderSettings:
    """Timing and place of the leader-election Lease (table above).

    Attributes:
        lease_duration: seconds a standby waits, from when it last saw the Lease's record
            change, before it takes the Lease (``leaseDurationSeconds``: whole seconds).
        renew_deadline: seconds after its last successful renew was *sent* that a leader stops
            acting; smaller than ``lease_duration``, so it stops before anyone else can start.
        retry_period: seconds between two acquire-or-renew attempts.
        namespace: the Lease's namespace (None: the watched namespace, else the pod's own).
    """

    lease_duration: int = 15
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    namespace: str | None = None

    def __post_init__(self) -> None:
        if self.lease_duration < 1:
            raise ValueError(f"lease duration {self.lease_duration}s: must be >= 1 s")
        if not 0 < self.renew_deadline < self.lease_duration:
            raise ValueError(
                f"renew deadline {self.renew_deadline:g}s must be > 0 and below "
                f"the lease duration ({self.lease_duration}s)"
            )
        if not 0 < self.retry_period < self.renew_deadline:
            raise ValueError(
                f"retry period {self.retry_period:g}s must be > 0 and below the "
                f"renew deadline ({self.renew_deadline:g}s)"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> LeaderSettings:
        """Settings from ``SANDPOD_LEADER_*`` (table above). Raises ValueError."""

        def number(name: str, default: float) -> float:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                return float(raw)
            except ValueError as exc:
                raise ValueError(f"{name}={raw!r} is not a number") from exc

        base = cls()
        duration = number("SANDPOD_LEADER_LEASE_DURATION", base.lease_duration)
        if duration != int(duration):
            raise ValueError(f"SANDPOD_LEADER_LEASE_DURATION={duration:g}: whole seconds only")
        namespace = next(
            (
                env[n].strip()
                for n in ("SANDPOD_LEADER_NAMESPACE", "SANDPOD_NAMESPACE")
                if env.get(n, "").strip()
            ),
            None,
        )
        return cls(
            lease_duration=int(duration),
            renew_deadline=number("SANDPOD_LEADER_RENEW_DEADLINE", base.renew_deadline),
            retry_period=number("SANDPOD_LEADER_RETRY_PERIOD", base.retry_period),
            namespace=namespace,
        )
