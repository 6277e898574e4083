"""Refused connections: each sandbox chain's drop counter, turned into events and a metric.

Every drop in a sandbox's chain (``firewall.py``) counts in its named counter ``denied_<n>``.
:class:`DenialWatch` reads all of them in one nftables call every ``interval`` seconds and, for
each sandbox whose count grew, adds the growth to ``sandpod_lifecycle_network_denied_total
{kind="connect"}`` and calls ``report(sandbox_id, kind, count)`` (the service publishes a
``network.denied`` event, rate-limited per sandbox by ``Events``).

Why counters rather than ``log group`` + reading NFLOG: bounded by construction (one counter per
sandbox, one read per interval, however hard a sandbox hammers a closed port: no per-packet work
in userspace, no queue to overflow, no netlink parsing), and the count is exact. What it does not
give is each refused packet's destination: the event says how many were refused, not where.
The resolver reports its refusals (kind ``dns``, with the name) through the same ``report``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

import structlog

from sandpod_lifecycle.network.metrics import NetworkMetrics

__all__ = ["DenialWatch"]

log = structlog.get_logger("sandpod.lifecycle.network")

Report = Callable[[str, str, int], Awaitable[None]]


class DenialWatch:
    """Polls ``counts`` (sandbox id -> packets dropped so far) and reports the growth."""

    def __init__(
        self,
        counts: Callable[[], Mapping[str, int]],
        report: Report,
        metrics: NetworkMetrics,
        interval: float = 5.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._counts = counts
        self._report = report
        self._metrics = metrics
        self._interval = interval
        self._sleep = sleep
        self._last: dict[str, int] = {}

    async def step(self) -> dict[str, int]:
        """One poll; returns sandbox id -> packets refused since the previous poll."""
        try:
            now = dict(await asyncio.to_thread(self._counts))
        except Exception as exc:
            log.warning("network_denied_poll_failed", error=str(exc))
            return {}
        grown = {}
        for sandbox_id, count in now.items():
            before = self._last.get(sandbox_id, 0)
            delta = count - before if count >= before else count  # a new chain starts at 0
            if delta > 0:
                grown[sandbox_id] = delta
        self._last = now  # only live sandboxes: bounded by their number
        for sandbox_id, delta in grown.items():
            self._metrics.denied.labels(kind="connect").inc(delta)
            await self._report(sandbox_id, "connect", delta)
        return grown

    async def run(self) -> None:
        while True:
            await self.step()
            await self._sleep(self._interval)
