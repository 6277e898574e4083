"""execd's Prometheus metrics, declared on an injected registry (labels never carry ids)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["ExecdMetrics"]


class ExecdMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "sandpod_execd_requests_total",
            "Data-plane requests handled, by operation and outcome code",
            ["op", "code"],
            registry=registry,
        )
        self.exec_seconds = Histogram(
            "sandpod_execd_exec_seconds",
            "Wall time of finished execs (spawn to exit)",
            ["mode"],
            registry=registry,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120, 600),
        )
        self.running = Gauge(
            "sandpod_execd_running_execs", "Execs currently running", registry=registry
        )
        self.stream_bytes = Counter(
            "sandpod_execd_stream_bytes_total",
            "Output bytes read from commands",
            ["mode"],
            registry=registry,
        )
        self.rejected = Counter(
            "sandpod_execd_rejected_total",
            "Requests refused before reaching a handler, by reason",
            ["reason"],
            registry=registry,
        )
