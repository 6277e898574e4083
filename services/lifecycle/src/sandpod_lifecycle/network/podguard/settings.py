"""The guard's settings: a typed dataclass read once from the environment at start.

| variable | default | meaning |
|---|---|---|
| ``SANDPOD_SANDBOX_ID`` | (required) | the Sandbox (and Pod) name |
| ``SANDPOD_GUARD_NAMESPACE`` | (required) | its namespace |
| ``SANDPOD_GUARD_SANDBOX_UID`` | (required) | the uid the sandbox container runs as |
| ``SANDPOD_NATS_URL`` | | execd's NATS URL (its host: always resolvable and reachable) |
| ``SANDPOD_GUARD_NATS_CIDRS`` | the URL host's addresses | where NATS is (comma-separated) |
| ``SANDPOD_GUARD_NATS_PORT`` | the URL's port, else 4222 | NATS client port |
| ``SANDPOD_GUARD_DNS_PORT`` | 53 | the resolver's port on 127.0.0.1 |
| ``SANDPOD_GUARD_HARD_DENY`` | | more networks no rule opens (comma-separated CIDRs) |
| ``SANDPOD_GUARD_READY_FILE`` | ``/run/sandpod-guard/ready`` | written once enforcing (probe) |
| ``SANDPOD_GUARD_PROXY_PORT`` | 3129 | the egress proxy's port on 127.0.0.1 (``off``: none) |
| ``SANDPOD_GUARD_CA_DIR`` | ``/run/sandpod-guard/ca`` | the Pod's interception authorities |
| ``SANDPOD_GUARD_TRUST_FILE`` | ``/run/sandpod-trust/egress.pem`` | their certificates (sandbox) |
| ``SANDPOD_GUARD_SECRET_REFRESH`` | 60 | seconds between two reads of the injected Secrets |
| ``SANDPOD_GUARD_REPORT_INTERVAL`` | 1 | seconds between two refusal reports (at most) |

The egress proxy's own knobs: ``SANDPOD_EGRESS_*`` (``proxyconfig.ProxySettings``).

Upstream DNS: ``SANDPOD_DNS_*`` (``dnssettings.py``; set ``SANDPOD_DNS_UPSTREAMS`` to the
cluster DNS: the Pod's own resolv.conf names the guard). The API server: ``SANDPOD_KUBE_*``
(``sandpod_kube.config``); ``SANDPOD_KUBE_SERVER`` defaults to the in-cluster
``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``, with the token and CA files of
the guard's own projected ServiceAccount token (``SANDPOD_KUBE_TOKEN_FILE``/``_CA_FILE``).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import urllib.parse
from collections.abc import Mapping
from pathlib import Path

from sandpod_kube import KubeSettings
from sandpod_lifecycle.network.dnssettings import ResolverSettings
from sandpod_lifecycle.network.proxyconfig import ProxySettings
from sandpod_service import env_float, env_int, env_str

__all__ = ["GuardSettings"]

DEFAULT_NATS_PORT = 4222


def _cidrs(name: str, raw: str) -> tuple[ipaddress.IPv4Network, ...]:
    out = []
    for item in filter(None, (p.strip() for p in raw.split(","))):
        try:
            net = ipaddress.ip_network(item, strict=False)
        except ValueError as exc:
            raise ValueError(f"{name}: {item!r} is not a CIDR") from exc
        if isinstance(net, ipaddress.IPv4Network):  # sandboxes have IPv4 egress only
            out.append(net)
    return tuple(out)


def _port_or_off(env: Mapping[str, str], name: str, default: int) -> int | None:
    if env.get(name, "").strip().lower() == "off":
        return None
    port = env_int(env, name, default, minimum=1)
    if port > 65535:
        raise ValueError(f"{name}: {port} is no port")
    return port


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GuardSettings:
    """The guard's knobs (module docstring: the table of variables)."""

    sandbox_id: str
    namespace: str
    sandbox_uid: int
    nats_host: str = ""
    nats_cidrs: tuple[ipaddress.IPv4Network, ...] = ()
    nats_port: int = DEFAULT_NATS_PORT
    dns_port: int = 53
    hard_deny: tuple[ipaddress.IPv4Network, ...] = ()
    ready_file: Path = Path("/run/sandpod-guard/ready")
    proxy_port: int | None = 3129
    ca_dir: Path = Path("/run/sandpod-guard/ca")
    trust_file: Path = Path("/run/sandpod-trust/egress.pem")
    secret_refresh: float = 60.0
    report_interval: float = 1.0
    proxy: ProxySettings = dataclasses.field(default_factory=ProxySettings)
    dns: ResolverSettings
    kube: KubeSettings

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GuardSettings:
        """The settings from the environment (once, at start). Raises ValueError naming a
        missing or bad variable."""
        env = dict(os.environ if env is None else env)
        missing = [
            n
            for n in ("SANDPOD_SANDBOX_ID", "SANDPOD_GUARD_NAMESPACE", "SANDPOD_GUARD_SANDBOX_UID")
            if not env.get(n, "").strip()
        ]
        if missing:
            raise ValueError(f"the network guard needs {', '.join(missing)}")
        url = urllib.parse.urlsplit(env_str(env, "SANDPOD_NATS_URL", "").split(",")[0].strip())
        port = env_int(env, "SANDPOD_GUARD_NATS_PORT", url.port or DEFAULT_NATS_PORT, minimum=1)
        host = env.get("KUBERNETES_SERVICE_HOST", "").strip()
        if not env.get("SANDPOD_KUBE_SERVER", "").strip() and host:
            bracketed = f"[{host}]" if ":" in host else host
            service_port = env.get("KUBERNETES_SERVICE_PORT", "443").strip()
            env["SANDPOD_KUBE_SERVER"] = f"https://{bracketed}:{service_port}"
        return cls(
            sandbox_id=env["SANDPOD_SANDBOX_ID"].strip(),
            namespace=env["SANDPOD_GUARD_NAMESPACE"].strip(),
            sandbox_uid=env_int(env, "SANDPOD_GUARD_SANDBOX_UID", 0, minimum=1),
            nats_host=url.hostname or "",
            nats_cidrs=_cidrs(
                "SANDPOD_GUARD_NATS_CIDRS", env_str(env, "SANDPOD_GUARD_NATS_CIDRS", "")
            ),
            nats_port=port,
            dns_port=env_int(env, "SANDPOD_GUARD_DNS_PORT", 53, minimum=1),
            hard_deny=_cidrs(
                "SANDPOD_GUARD_HARD_DENY", env_str(env, "SANDPOD_GUARD_HARD_DENY", "")
            ),
            ready_file=Path(env_str(env, "SANDPOD_GUARD_READY_FILE", "/run/sandpod-guard/ready")),
            proxy_port=_port_or_off(env, "SANDPOD_GUARD_PROXY_PORT", 3129),
            ca_dir=Path(env_str(env, "SANDPOD_GUARD_CA_DIR", "/run/sandpod-guard/ca")),
            trust_file=Path(
                env_str(env, "SANDPOD_GUARD_TRUST_FILE", "/run/sandpod-trust/egress.pem")
            ),
            secret_refresh=env_float(env, "SANDPOD_GUARD_SECRET_REFRESH", 60.0),
            report_interval=env_float(env, "SANDPOD_GUARD_REPORT_INTERVAL", 1.0),
            proxy=ProxySettings.from_env(env),
            dns=ResolverSettings.from_env(env),
            kube=KubeSettings.from_env(env),
        )
