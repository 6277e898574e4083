"""Liveness watching for long requests, now :mod:`sandpod_client.liveness` (one copy of the
protocol for the SDK and the gateway); re-exported for the SDK families that import it here."""

from sandpod_client.liveness import PROBE_INTERVAL, watch

__all__ = ["PROBE_INTERVAL", "watch"]
