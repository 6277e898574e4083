"""The gateway's Prometheus metrics, declared on an injected registry.

Labels are bounded: the route *template* (``/v1/sandboxes/{name}/exec``), never a sandbox name,
a path or a tenant.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["GatewayMetrics"]


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "sandpod_gateway_requests_total",
            "HTTP requests and WebSocket sessions answered",
            ["method", "route", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            "sandpod_gateway_request_seconds",
            "time to the end of the response (or the session)",
            ["method", "route"],
            registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60),
        )
        self.streams = Gauge(
            "sandpod_gateway_streams",
            "open SSE, WebSocket and transfer streams",
            registry=registry,
        )
        self.rejected = Counter(
            "sandpod_gateway_rejected_total",
            "requests refused before a handler ran",
            ["reason"],
            registry=registry,
        )
        self.transfer_bytes = Counter(
            "sandpod_gateway_transfer_bytes_total",
            "file bytes streamed",
            ["direction"],
            registry=registry,
        )
        # a request's (count, latency) children by (method, route, status): labels() takes a
        # lock and builds tuples, a few microseconds per request (the label sets are bounded)
        self._request_children: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        """One answered request (or WebSocket session): its count and its latency."""
        key = (method, route, status)
        children = self._request_children.get(key)
        if children is None:
            children = (
                self.requests.labels(method, route, str(status)),
                self.latency.labels(method, route),
            )
            self._request_children[key] = children
        children[0].inc()
        children[1].observe(seconds)
