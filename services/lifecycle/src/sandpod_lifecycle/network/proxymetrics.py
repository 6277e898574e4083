"""The egress proxy's Prometheus metrics, on an injected registry (labels never carry ids).

``sandpod_lifecycle_network_denied_total{kind}`` is shared with the resolver (kind ``dns``) and
the firewall (``connect``): pass the one counter the lifecycle declared (the resolver's
``NetworkMetrics.denied``) as ``denied`` so a registry never sees the name twice; without one,
this module declares it (tests, a proxy alone).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

__all__ = ["ProxyMetrics", "denied_counter"]


def denied_counter(registry: CollectorRegistry) -> Counter:
    return Counter(
        "sandpod_lifecycle_network_denied_total",
        "Refused egress (DNS lookups, connections, TLS/HTTP names), by kind",
        ["kind"],
        registry=registry,
    )


class ProxyMetrics:
    def __init__(self, registry: CollectorRegistry, denied: Counter | None = None) -> None:
        self.denied = denied if denied is not None else denied_counter(registry)
        self.connections = Counter(
            "sandpod_lifecycle_egress_connections_total",
            "Connections the egress proxy handled, by outcome",
            ["outcome"],
            registry=registry,
        )
        self.bytes = Counter(
            "sandpod_lifecycle_egress_bytes_total",
            "Bytes the egress proxy moved, by direction (up: from sandboxes)",
            ["direction"],
            registry=registry,
        )
