"""RFC 3339 timestamps, the one format every Sandpod object and message carries.

Objects store times as strings (``shutdownTime``, ``lastActivityTime``, ``creationTimestamp``,
conditions' ``lastTransitionTime``); the code that decides on them works in epoch seconds (what a
:class:`sandpod_service.clock.Clock` reads). These two functions are the only conversion between
the two, so every writer uses one shape (UTC, ``Z`` suffix, whole seconds unless asked for
microseconds as Kubernetes' ``MicroTime``) and every reader accepts any RFC 3339 offset.
"""

from __future__ import annotations

import datetime

__all__ = ["from_rfc3339", "to_rfc3339"]


def to_rfc3339(moment: float | datetime.datetime, *, micro: bool = False) -> str:
    """``moment`` (epoch seconds, or an aware datetime; a naive one is taken as UTC) as
    ``2026-01-02T03:04:05Z`` (``micro``: ``2026-01-02T03:04:05.123456Z``)."""
    if isinstance(moment, datetime.datetime):
        at = moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)
    else:
        at = datetime.datetime.fromtimestamp(moment, datetime.UTC)
    return at.astimezone(datetime.UTC).strftime(
        "%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ"
    )


def from_rfc3339(value: str) -> float:
    """Epoch seconds of an RFC 3339 date-time (``Z`` or any offset; none is taken as UTC).

    Raises:
        ValueError: ``value`` is not an RFC 3339 date-time.
    """
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not an RFC 3339 date-time")
    at = datetime.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    if at.tzinfo is None:
        at = at.replace(tzinfo=datetime.UTC)
    return at.timestamp()
