"""The node resolver's settings: a typed dataclass, read once at start from the environment
(``ResolverSettings.from_env``) and passed down; the concurrency bounds are documented on the
fields (``resolver.py`` says how each is enforced).

| variable | default | meaning |
|---|---|---|
| ``SANDPOD_DNS_UPSTREAMS`` | the host's resolv.conf | ``ip[:port]``, comma-separated |
| ``SANDPOD_DNS_ATTEMPT_TIMEOUT`` | 1.5 s | one upstream's time to answer |
| ``SANDPOD_DNS_DEADLINE`` | 3 s | a lookup's whole time (SERVFAIL after) |
| ``SANDPOD_DNS_MIN_TTL`` | 30 s | shortest life of an address in the firewall's sets |
| ``SANDPOD_DNS_MAX_TTL`` | 600 s | longest TTL told / set entry life |
| ``SANDPOD_DNS_CACHE_ENTRIES`` | 10000 | answers cached (least recently used dropped) |
| ``SANDPOD_DNS_DENIED_RCODE`` | ``refused`` | ``refused`` or ``nxdomain`` for denied names |
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from collections.abc import Mapping

import dns.rcode

from sandpod_lifecycle.network.upstream import upstreams_from_resolv_conf
from sandpod_service import env_float, env_int, env_str

__all__ = ["ResolverSettings"]

Address = tuple[str, int]


def _parse_upstreams(text: str) -> tuple[Address, ...]:
    out: list[Address] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        host, port = item, 53
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            port = int(rest[1:]) if rest.startswith(":") else 53
        elif item.count(":") == 1:
            host, _, raw = item.partition(":")
            port = int(raw)
        ipaddress.ip_address(host)  # ValueError names the bad one
        if not 0 < port < 65536:
            raise ValueError(f"port {port}")
        out.append((host, port))
    return tuple(out)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ResolverSettings:
    """The resolver's knobs (module docstring: the table of variables)."""

    upstreams: tuple[Address, ...] = dataclasses.field(default_factory=upstreams_from_resolv_conf)
    attempt_timeout: float = 1.5
    deadline: float = 3.0
    max_inflight: int = 256  # upstream lookups at once
    sandbox_inflight: int = 32  # ... of which one sandbox may have
    workers: int = 64  # UDP queries handled at once
    udp_queue: int = 1024  # UDP queries waiting for a worker
    max_query_bytes: int = 4096
    min_ttl: int = 30
    max_ttl: int = 600
    cache_entries: int = 10_000
    tcp_connections: int = 256
    tcp_idle_timeout: float = 10.0  # RFC 7766's suggestion for an idle connection
    tcp_queries: int = 100  # per connection
    sink_timeout: float = 2.0
    denied_rcode: dns.rcode.Rcode = dns.rcode.REFUSED
    names_per_sandbox: int = 4096  # addresses remembered for the proxy's SNI/Host check
    max_sandboxes: int = 65_536
    event_burst: int = 10  # denial events one sandbox may raise at once ...
    event_rate: float = 1.0  # ... refilled at this many per second

    def __post_init__(self) -> None:
        if not self.upstreams:
            raise ValueError(
                "resolver: no upstream server (SANDPOD_DNS_UPSTREAMS, or a nameserver in "
                "/etc/resolv.conf)"
            )
        if not 0 < self.attempt_timeout <= self.deadline:
            raise ValueError("resolver: 0 < attempt_timeout <= deadline")
        if not 1 <= self.min_ttl <= self.max_ttl:
            raise ValueError("resolver: 1 <= min_ttl <= max_ttl")
        bounds = (self.max_inflight, self.sandbox_inflight, self.workers, self.udp_queue)
        if min(*bounds, self.tcp_connections) < 1:
            raise ValueError("resolver: every concurrency bound must be >= 1")
        if self.denied_rcode not in (dns.rcode.REFUSED, dns.rcode.NXDOMAIN):
            raise ValueError("resolver: denied_rcode is REFUSED or NXDOMAIN")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ResolverSettings:
        """The settings from ``SANDPOD_DNS_*`` (once, at start). Raises ValueError naming a bad
        value."""
        env = os.environ if env is None else env
        rcode = env_str(env, "SANDPOD_DNS_DENIED_RCODE", "refused").lower()
        if rcode not in ("refused", "nxdomain"):
            raise ValueError("SANDPOD_DNS_DENIED_RCODE: refused or nxdomain")
        raw_upstreams = env_str(env, "SANDPOD_DNS_UPSTREAMS", "")
        try:
            upstreams = (
                _parse_upstreams(raw_upstreams) if raw_upstreams else upstreams_from_resolv_conf()
            )
        except ValueError as exc:
            raise ValueError(f"SANDPOD_DNS_UPSTREAMS: {raw_upstreams!r}: {exc}") from exc
        base = cls(upstreams=upstreams)
        return cls(
            upstreams=upstreams,
            attempt_timeout=env_float(
                env, "SANDPOD_DNS_ATTEMPT_TIMEOUT", base.attempt_timeout, minimum=0.05
            ),
            deadline=env_float(env, "SANDPOD_DNS_DEADLINE", base.deadline, minimum=0.05),
            min_ttl=env_int(env, "SANDPOD_DNS_MIN_TTL", base.min_ttl, minimum=1),
            max_ttl=env_int(env, "SANDPOD_DNS_MAX_TTL", base.max_ttl, minimum=1),
            cache_entries=env_int(env, "SANDPOD_DNS_CACHE_ENTRIES", base.cache_entries),
            denied_rcode=dns.rcode.REFUSED if rcode == "refused" else dns.rcode.NXDOMAIN,
        )
