"""What the ``watch`` family returns: events, one poll's batch, a watch as execd holds it.

Plain frozen values built from the wire messages (``_info``, ``_batch``); no NATS, no I/O.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from sandpod_contract.messages import watch as wire

__all__ = ["EventType", "WatchBatch", "WatchEvent", "WatchInfo"]


EventType = Literal["create", "modify", "delete", "move", "attrib", "overflow"]


@dataclasses.dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change. ``move`` has ``old_path`` -> ``path``; ``overflow`` means events were lost."""

    type: EventType
    path: str
    old_path: str | None
    is_dir: bool
    time: float  # wall clock in the sandbox
    count: int  # raw events merged into this one; overflow: events lost (0: unknown)
    seq: int  # cursor of this event
    reason: str | None  # overflow: "queue", "kernel" or "limit"


@dataclasses.dataclass(frozen=True, slots=True)
class WatchBatch:
    """One poll's answer: events from ``cursor``; pass ``next_cursor`` next time."""

    events: tuple[WatchEvent, ...]
    cursor: int
    next_cursor: int
    skipped: int  # events lost before this client read them (an overflow event says so too)
    closed: bool  # the watch ended (path removed or watch stopped) and nothing is left


@dataclasses.dataclass(frozen=True, slots=True)
class WatchInfo:
    """A watch as execd holds it."""

    watch_id: str
    path: str
    state: Literal["active", "closed"]
    recursive: bool
    include: tuple[str, ...]
    exclude: tuple[str, ...]
    events: tuple[str, ...]
    coalesce: float
    queue: int
    idle_timeout: float
    dirs: int
    next_cursor: int
    created: float


def _info(w: wire.WatchInfo) -> WatchInfo:
    return WatchInfo(**{f.name: getattr(w, f.name) for f in dataclasses.fields(WatchInfo)})


def _batch(r: wire.WatchEvents) -> WatchBatch:
    events = tuple(
        WatchEvent(
            type=e.type,
            path=e.path,
            old_path=e.old_path,
            is_dir=e.is_dir,
            time=e.time,
            count=e.count,
            seq=e.seq,
            reason=e.reason,
        )
        for e in r.events
    )
    return WatchBatch(events, r.cursor, r.next_cursor, r.skipped, r.closed)
