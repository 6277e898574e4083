"""Metrics of the node's network enforcers, declared once on an injected registry.

``sandpod_lifecycle_network_denied_total{kind}`` is shared by every enforcer (the resolver
counts ``dns``/``rebinding``, the proxy ``sni``, the firewall ``connect``): construct one
:class:`NetworkMetrics` per registry and hand it to each. Labels never carry a sandbox id.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["NetworkMetrics"]


class NetworkMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.denied = Counter(
            "sandpod_lifecycle_network_denied_total",
            "Lookups and connections a sandbox's network policy refused, by kind",
            ["kind"],
            registry=registry,
        )
        self.denied_logs = Counter(
            "sandpod_lifecycle_network_denied_logs_total",
            "NFLOG messages of refused packets read, by outcome (reported, repeated: counted "
            "into the next report, malformed, stranger: no sandbox of ours, queue_full: dropped)",
            ["outcome"],
            registry=registry,
        )
        self.denied_log_overruns = Counter(
            "sandpod_lifecycle_network_denied_log_overruns_total",
            "Times the NFLOG socket's buffer was full (ENOBUFS: the kernel dropped log messages)",
            registry=registry,
        )
        self.dns_queries = Counter(
            "sandpod_lifecycle_dns_queries_total",
            "Queries the node resolver answered, by transport and outcome",
            ["transport", "outcome"],
            registry=registry,
        )
        self.dns_malformed = Counter(
            "sandpod_lifecycle_dns_malformed_total",
            "Packets the node resolver could not take as a query, by reason",
            ["reason"],
            registry=registry,
        )
        self.dns_dropped = Counter(
            "sandpod_lifecycle_dns_dropped_total",
            "Queries dropped unanswered because the resolver was at a limit, by limit",
            ["limit"],
            registry=registry,
        )
        self.dns_cache = Counter(
            "sandpod_lifecycle_dns_cache_total",
            "Answer cache lookups, by result (hit, miss)",
            ["result"],
            registry=registry,
        )
        self.dns_upstream_seconds = Histogram(
            "sandpod_lifecycle_dns_upstream_seconds",
            "Time for an upstream answer, failures included",
            registry=registry,
            buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5),
        )
        self.dns_tcp_connections = Gauge(
            "sandpod_lifecycle_dns_tcp_connections",
            "TCP connections open to the node resolver",
            registry=registry,
        )
