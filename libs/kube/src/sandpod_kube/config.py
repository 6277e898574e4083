"""How to reach an API server: typed settings, turned into a ``kubernetes`` client in one place.

Services build :class:`KubeSettings` once at start (from a kubeconfig file, from the in-cluster
service account, or explicitly, as the tests do) and pass it down; deep code never reads the
environment or a kubeconfig itself.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from kubernetes import client, config

__all__ = ["KubeSettings"]


@dataclasses.dataclass(frozen=True, slots=True)
class KubeSettings:
    """Connection to one API server.

    Attributes:
        host: API server URL, e.g. ``https://127.0.0.1:6443``.
        ca_file: PEM bundle that signs the API server's certificate (None: system trust).
        token: bearer token (a ServiceAccount token, or a static token for tests).
        client_cert_file / client_key_file: client certificate authentication instead of a token.
        max_workers: threads running blocking client calls (bounds concurrent requests).
        request_timeout: seconds for one non-watch request (connect + read).
        watch_timeout: seconds the API server keeps one watch request open before the store
            re-opens it from the last revision seen (bounded, so a dead connection is noticed).
    """

    host: str
    ca_file: str | None = None
    token: str | None = dataclasses.field(default=None, repr=False)
    client_cert_file: str | None = None
    client_key_file: str | None = None
    max_workers: int = 8
    request_timeout: float = 30.0
    watch_timeout: int = 300

    @classmethod
    def from_kubeconfig(
        cls, path: str | Path | None = None, context: str | None = None
    ) -> KubeSettings:
        """Settings from a kubeconfig file (``$KUBECONFIG`` or ``~/.kube/config`` when None)."""
        cfg = client.Configuration()
        config.load_kube_config(  # type: ignore[no-untyped-call]  # untyped in the client
            config_file=str(path) if path else None, context=context, client_configuration=cfg
        )
        return cls._from_configuration(cfg)

    @classmethod
    def in_cluster(cls) -> KubeSettings:
        """Settings from the pod's mounted ServiceAccount (only inside a cluster)."""
        cfg = client.Configuration()
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        return cls._from_configuration(cfg)

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
        cfg = client.Configuration(host=self.host)
        cfg.verify_ssl = True
        cfg.ssl_ca_cert = self.ca_file
        cfg.cert_file = self.client_cert_file
        cfg.key_file = self.client_key_file
        if self.token:
            cfg.api_key = {"BearerToken": self.token}
            cfg.api_key_prefix = {"BearerToken": "Bearer"}
        # One pooled connection per worker thread, plus the long-lived watch streams.
        cfg.connection_pool_maxsize = self.max_workers + 4
        return client.ApiClient(cfg)
