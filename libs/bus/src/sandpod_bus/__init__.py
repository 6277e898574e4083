"""Sandpod's NATS seam.

:mod:`sandpod_bus.transport` is the only module in the code base that imports ``nats``; services
and SDKs talk to NATS through :class:`Bus` and get Sandpod's typed errors, never nats-py's.
"""

from sandpod_bus.kv import KvBucket, KvEntry
from sandpod_bus.transport import Bus, BusSettings, Inbound, Subscription

__all__ = ["Bus", "BusSettings", "Inbound", "KvBucket", "KvEntry", "Subscription"]
