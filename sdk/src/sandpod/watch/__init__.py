"""The ``watch`` family: file watching in the sandbox (``sbx.watch``).

Same shape as every SDK family: ``api`` (the async client, given a
:class:`~sandpod.channel.Channel`), ``types`` (the values it returns), ``sync`` (the blocking
twins). This module lists the family's public names.
"""

from sandpod.watch.api import AsyncWatch, AsyncWatches
from sandpod.watch.sync import Watch, Watches
from sandpod.watch.types import EventType, WatchBatch, WatchEvent, WatchInfo

__all__ = [
    "AsyncWatch",
    "AsyncWatches",
    "EventType",
    "Watch",
    "WatchBatch",
    "WatchEvent",
    "WatchInfo",
    "Watches",
]
