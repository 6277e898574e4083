"""The lifecycle's time rules, as pure functions of ``now`` (epoch seconds). No I/O here.

The reconciler asks these what a sandbox's clock says -- has its lifetime ended, when can it
first be idle, how long to wait after a failed create -- and acts on the answer; the answers
depend only on the object and the ``now`` its :class:`~sandpod_service.clock.Clock` gave, so
``tests/unit/test_lifetime.py`` checks every rule on a fake clock without waiting.

    lifetime  : expired once ``now >= spec.shutdownTime`` (a renew moves shutdownTime: the rule
                reads the object, so a renewed sandbox lives on)
    idle      : a sandbox cannot be idle before ``latest activity + limit``; the latest known
                activity is a claim's bind (``sandpod.dev/bound-at``) or ``lastActivityTime``
    backoff   : the n-th failed create waits ``min(2**n, BACKOFF_CAP)`` seconds
"""

from __future__ import annotations

import contextlib
import dataclasses

from sandpod_contract.times import from_rfc3339
from sandpod_store import SandboxView

__all__ = [
    "BACKOFF_CAP",
    "Failures",
    "backoff",
    "bound_at",
    "expires_at",
    "idle_after",
    "latest_activity",
    "lifetime_over",
]

BACKOFF_CAP = 60.0  # seconds: the longest wait between two creates of one sandbox


@dataclasses.dataclass
class Failures:
    """One sandbox's failed creates so far, and when the next may be tried (wall time)."""

    count: int = 0
    next_try: float = 0.0

    def failed(self, now: float) -> float:
        """Count one more failure at ``now``; the delay until the next try."""
        self.count += 1
        delay = backoff(self.count)
        self.next_try = now + delay
        return delay


def backoff(count: int) -> float:
    """Seconds to wait after the ``count``-th failure in a row (2, 4, 8 ... capped)."""
    return min(2.0 ** max(count, 0), BACKOFF_CAP)


def expires_at(view: SandboxView) -> float | None:
    """When the sandbox's lifetime ends (epoch seconds), None when it has no shutdownTime
    (permanent) or the time cannot be read (the schema validated it on write)."""
    shutdown = view.spec.shutdown_time
    if not shutdown:
        return None
    try:
        return from_rfc3339(shutdown)
    except ValueError:
        return None


def lifetime_over(view: SandboxView, now: float) -> bool:
    """Whether the sandbox's shutdownTime has come."""
    end = expires_at(view)
    return end is not None and end <= now


def bound_at(view: SandboxView) -> float | None:
    """When a claim bound this sandbox (the pool's annotation), if it did."""
    return view.bound_at


def latest_activity(view: SandboxView) -> float | None:
    """The latest known moment of activity: a bind, or the recorded lastActivityTime."""
    times = [t for t in (bound_at(view),) if t is not None]
    if view.status.last_activity_time:
        with contextlib.suppress(ValueError):
            times.append(from_rfc3339(view.status.last_activity_time))
    return max(times) if times else None


def idle_after(view: SandboxView, limit: int, now: float) -> float | None:
    """The moment before which the sandbox cannot be idle (its known activity plus ``limit``),
    if that is still ahead of ``now``; None: ask its execd now."""
    known = latest_activity(view)
    if known is not None and now < known + limit:
        return known + limit
    return None
