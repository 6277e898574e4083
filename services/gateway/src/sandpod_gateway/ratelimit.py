"""Per-key token buckets with bounded memory.

Each API key gets a bucket of ``burst`` tokens refilled at ``rate`` per second; a request takes
one. At most ``max_keys`` buckets are kept: the least recently used is evicted (a returning key
starts full, which only ever errs on the side of letting a request through).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

__all__ = ["RateLimiter"]


class RateLimiter:
    def __init__(
        self,
        rate: float,
        burst: int,
        max_keys: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.max_keys = max_keys
        self._clock = clock
        self._buckets: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: str) -> float:
        """Take a token for ``key``: 0.0 if allowed, else seconds until one is available."""
        now = self._clock()
        tokens, last = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        wait = 0.0
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            wait = (1.0 - tokens) / self.rate
        self._buckets[key] = (tokens, now)
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        return wait
