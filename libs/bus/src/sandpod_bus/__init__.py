"""Sandpod's NATS seam.

:mod:`sandpod_bus.transport` is the only module in the code base that imports ``nats``; services
and SDKs talk to NATS through :class:`Bus` and get transport errors (:class:`NoResponders`, the
contract's ``RequestTimeout`` and ``ConnectionLost``), never nats-py's; each caller maps them to
what they mean for its domain.
:mod:`sandpod_bus.natsauth` (nkeys, JWTs, creds files for NATS operator mode) is imported only by
the control plane, which mints credentials; everyone else just passes ``BusSettings.creds``.
nats-py is first imported by :mod:`sandpod_bus._natspy` (before ``kv`` and ``transport``), so
its optional aiohttp, used only for WebSocket URLs, stays out of every TCP client's start.
"""

from sandpod_bus import _natspy  # noqa: F401 - imports nats without aiohttp, first
from sandpod_bus.errors import NoResponders
from sandpod_bus.kv import KvBucket, KvEntry
from sandpod_bus.objects import ObjectBucket, ObjectStat
from sandpod_bus.transport import Bus, BusSettings, Handler, Inbound, Subscription

__all__ = [
    "Bus",
    "BusSettings",
    "Handler",
    "Inbound",
    "KvBucket",
    "KvEntry",
    "NoResponders",
    "ObjectBucket",
    "ObjectStat",
    "Subscription",
]
