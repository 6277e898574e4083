"""Refused connections: the exact count (counters) and where each one went (NFLOG).

Every refused packet of a sandbox goes through its chain ``deny_<n>`` (``firewall.py``,
``rules.py``), which does two things with it:

- counts it in the named counter ``denied_<n>``: :class:`DenialWatch` reads all of them in one
  nftables call every ``interval`` seconds and adds the growth to
  ``sandpod_lifecycle_network_denied_total{kind="connect"}`` (exact, however hard a sandbox
  hammers a closed port). On a node without NFLOG it also reports the growth as a count-only
  ``network.denied`` event (``report``);
- logs it, at most ``rules.LOG_RATE`` a second per sandbox after a burst of
  ``rules.LOG_BURST``, to the installation's NFLOG group (``nflog.py``). :class:`DenialLog`
  reads that socket when the event loop says it is readable (at most ``per_wakeup`` datagrams a
  turn), parses each message (``nflogwire.py``: malformed ones counted and skipped), finds the
  sandbox from the log prefix (``sandbox_of``: a prefix of another installation, or of a
  sandbox gone since, is counted as ``stranger``), and queues it (``queue_size`` at most; past
  that counted as ``queue_full``); one task publishes the queue in order: ``network.denied``,
  kind ``connect``, destination ``203.0.113.9:443/tcp`` (the service's ``Events`` rate-limits
  them per sandbox). The same sandbox refused the same destination again within ``repeat``
  seconds (a SYN's retransmissions, a client retrying) is not published again: it is counted
  (``repeated``) and the next event of that destination carries the count (:class:`Repeats`).
  A full socket buffer (``ENOBUFS``) is counted and read on.

Why both: the counters are exact and cost no userspace work per packet, the log names the
destination but is sampled by its rate limit. The resolver and the proxy report their
refusals (kinds ``dns``, ``sni``, with the name) through the same publish.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import time
from collections.abc import Awaitable, Callable, Mapping

import structlog

from sandpod_lifecycle.network.metrics import NetworkMetrics
from sandpod_lifecycle.network.nflog import NflogSocket
from sandpod_lifecycle.network.nflogwire import Refused, parse_batch

__all__ = ["DenialLog", "DenialWatch", "Repeats"]

log = structlog.get_logger("sandpod.lifecycle.network")

Report = Callable[[str, str, int], Awaitable[None]]
# (sandbox id, kind, destination, rule, count) -> publish a network.denied event
Publish = Callable[[str, str, str, str, int], Awaitable[None]]


class DenialWatch:
    """Polls ``counts`` (sandbox id -> packets dropped so far): the growth goes to the metric
    and, unless ``report`` is None (NFLOG reports them), to ``report``."""

    def __init__(
        self,
        counts: Callable[[], Mapping[str, int]],
        report: Report | None,
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
            if self._report is not None:
                await self._report(sandbox_id, "connect", delta)
        return grown

    async def run(self) -> None:
        while True:
            await self.step()
            await self._sleep(self._interval)


class Repeats:
    """Coalesces repeated refusals of one destination by one sandbox: the first within
    ``window`` seconds is published, later ones are counted into the next one published; at
    most ``size`` (sandbox, destination) pairs are remembered (least recently seen forgotten,
    with what they had counted: the metric has the exact total)."""

    def __init__(
        self, window: float = 1.0, size: int = 1024, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._window = window
        self._size = size
        self._clock = clock
        # (sandbox id, destination) -> (when last published, refusals held back since)
        self._seen: collections.OrderedDict[tuple[str, str], tuple[float, int]] = (
            collections.OrderedDict()
        )

    def take(self, sandbox_id: str, destination: str) -> int:
        """The count to publish now (this refusal and those held back before it), or 0: hold
        it back (one of this destination was published less than ``window`` ago)."""
        key, now = (sandbox_id, destination), self._clock()
        when, held = self._seen.pop(key, (None, 0))
        if when is not None and now - when < self._window:
            self._seen[key] = (when, held + 1)
            return 0
        self._seen[key] = (now, 0)
        while len(self._seen) > self._size:
            self._seen.popitem(last=False)
        return held + 1


class DenialLog:
    """NFLOG messages of refused packets -> ``network.denied`` events with their destination
    (see the module docstring). ``run`` is the owner's task; ``close`` ends it."""

    def __init__(
        self,
        sock: NflogSocket,
        sandbox_of: Callable[[str], str | None],
        publish: Publish,
        metrics: NetworkMetrics,
        *,
        queue_size: int = 256,
        per_wakeup: int = 64,
        repeats: Repeats | None = None,
    ) -> None:
        self._sock = sock
        self._repeats = repeats or Repeats()
        self._sandbox_of = sandbox_of
        self._publish = publish
        self._metrics = metrics
        self._per_wakeup = per_wakeup
        self._limit = queue_size
        # one more than the limit: the end-of-reading marker always fits
        self._queue: asyncio.Queue[tuple[str, Refused] | None] = asyncio.Queue(queue_size + 1)
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd: int | None = None  # watched by the loop
        self._overrun_logged = False

    async def run(self) -> None:
        """Read and publish until :meth:`close` (or cancellation)."""
        self._loop = asyncio.get_running_loop()
        if self._sock.closed:
            return
        self._fd = self._sock.fileno()
        self._loop.add_reader(self._fd, self._readable)
        try:
            while (item := await self._queue.get()) is not None:
                sandbox_id, refused = item
                if not (count := self._repeats.take(sandbox_id, refused.target)):
                    self._metrics.denied_logs.labels(outcome="repeated").inc()
                    continue
                await self._publish(sandbox_id, "connect", refused.target, "policy", count)
                self._metrics.denied_logs.labels(outcome="reported").inc()
        finally:
            self._unwatch()

    def close(self) -> None:
        """Stop reading; ``run`` returns once what is queued is published (idempotent)."""
        self._unwatch()
        if not self._closed:
            self._closed = True
            self._queue.put_nowait(None)

    def _unwatch(self) -> None:
        fd, self._fd = self._fd, None
        if self._loop is not None and fd is not None:
            self._loop.remove_reader(fd)

    def _readable(self) -> None:
        for _ in range(self._per_wakeup):  # the rest at the next turn: never starves the loop
            try:
                data = self._sock.recv()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    self._overrun()
                    continue
                log.error("network_denied_log_failed", error=str(exc))
                self._unwatch()
                return
            self._take(data)

    def _take(self, data: bytes) -> None:
        refused, malformed = parse_batch(data)
        if malformed:
            self._metrics.denied_logs.labels(outcome="malformed").inc(malformed)
        for item in refused:
            sandbox_id = self._sandbox_of(item.prefix)
            if sandbox_id is None:
                self._metrics.denied_logs.labels(outcome="stranger").inc()
                continue
            if self._closed or self._queue.qsize() >= self._limit:
                self._metrics.denied_logs.labels(outcome="queue_full").inc()
                continue
            self._queue.put_nowait((sandbox_id, item))

    def _overrun(self) -> None:
        self._metrics.denied_log_overruns.inc()
        if not self._overrun_logged:  # once per reader: the metric has the rest
            self._overrun_logged = True
            log.warning("network_denied_log_overrun", group=self._sock.group)
