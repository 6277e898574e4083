"""Refusals in a Pod, to the sandbox's events: the guard's side (:class:`GuardReporter`), the
report both sides share (:class:`GuardReport`, versioned), and lifecycle's side
(:class:`ReportReader`).

    guard: resolver / egress proxy refusals (each already rate-limited per sandbox by them)
           + the table's drop counters (connections the chain refused, IPv6)
      --GuardReporter: merged by (kind, destination, rule), at most every ``interval`` s-->
      GuardReport JSON --sandpod_kube.guardreport.write_report--> ConfigMap <sandbox>-netguard
    lifecycle: sandpod_kube.guardreport.watch_reports --> ReportReader.seen(ns, sandbox, text)
      --> new batch (seq moved on): ``publish`` each entry (``Events.publish_denied``: the
          same per-sandbox token bucket and ``network.denied`` event as a local refusal)
          and ``sandpod_lifecycle_network_denied_total{kind}`` by how much each total grew

Why batches with totals: a guard that refuses a lot must neither flood the API server (one
patch a second at most, a bounded batch of :data:`MAX_RECENT` distinct refusals, the rest
counted in the next entry of the same destination or dropped and counted in ``lost``) nor
make the metric lie; totals are cumulative, so the metric is exact even when lifecycle misses
a batch (a watch that re-lists sees the latest report only). After a lifecycle restart the last
batch of each report may be published once more.

The sandbox is the ConfigMap's name (see ``sandpod_kube.guardreport``), never a field of the
report: a report cannot speak for another sandbox.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog
from prometheus_client import Counter

from sandpod_contract.errors import StoreError
from sandpod_lifecycle.network.sandboxnet import Denial

__all__ = [
    "MAX_RECENT",
    "GuardReport",
    "GuardReporter",
    "Refusal",
    "ReportInvalid",
    "ReportReader",
]

log = structlog.get_logger("sandpod.lifecycle.network.podguard")

VERSION = 1
MAX_RECENT = 64  # distinct refusals per batch
MAX_TEXT = 64 * 1024  # a report lifecycle accepts (a ConfigMap holds 1 MiB)


class ReportInvalid(ValueError):
    """A report that is not a well-formed version-1 report. ``code`` is stable."""

    code = "network.guard_report_invalid"


@dataclasses.dataclass(frozen=True, slots=True)
class Refusal:
    kind: str  # dns, rebinding, connect, sni
    destination: str  # "" for counted drops of the table (no destination known)
    rule: str
    count: int = 1


@dataclasses.dataclass(frozen=True, slots=True)
class GuardReport:
    """What a guard reports (version 1): batch ``seq``, its refusals, cumulative totals."""

    seq: int = 0
    recent: tuple[Refusal, ...] = ()
    totals: Mapping[str, int] = dataclasses.field(default_factory=dict)
    lost: int = 0  # refusals left out of batches (over MAX_RECENT), counted in totals

    def to_json(self) -> str:
        return json.dumps(
            {
                "v": VERSION,
                "seq": self.seq,
                "recent": [dataclasses.asdict(r) for r in self.recent],
                "totals": dict(self.totals),
                "lost": self.lost,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> GuardReport:
        """Raises ReportInvalid for anything but a well-formed version-1 report."""
        if len(text) > MAX_TEXT:
            raise ReportInvalid("report too large")
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise ReportInvalid(f"not JSON: {exc}") from exc
        if not isinstance(raw, dict) or raw.get("v") != VERSION:
            raise ReportInvalid("not a version-1 report")
        recent = raw.get("recent")
        totals = raw.get("totals")
        if not isinstance(recent, list) or not isinstance(totals, dict):
            raise ReportInvalid("recent must be a list, totals a map")
        refusals = tuple(_refusal(r) for r in recent[:MAX_RECENT])
        counts = {str(k): _count(v) for k, v in list(totals.items())[:16]}
        return cls(_count(raw.get("seq")), refusals, counts, _count(raw.get("lost", 0)))


def _count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ReportInvalid(f"{value!r} is no count")
    return value


def _refusal(raw: Any) -> Refusal:
    if not isinstance(raw, dict):
        raise ReportInvalid("a refusal must be a map")
    fields = [raw.get(k) for k in ("kind", "destination", "rule")]
    if not all(isinstance(f, str) and len(f) <= 300 for f in fields):
        raise ReportInvalid("kind, destination and rule must be short strings")
    kind, destination, rule = (str(f) for f in fields)
    return Refusal(kind, destination, rule, max(1, _count(raw.get("count", 1))))


Write = Callable[[str], Awaitable[None]]  # the report's JSON -> the ConfigMap


class GuardReporter:
    """The guard's side: ``add`` from the enforcers (the guard's loop), ``run`` flushes."""

    def __init__(
        self,
        write: Write,
        counters: Callable[[], Mapping[str, int]],
        *,
        interval: float = 1.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """``counters``: the table's cumulative drop counts by kind (read each flush)."""
        self._write = write
        self._counters = counters
        self._interval = interval
        self._sleep = sleep
        self._pending: dict[tuple[str, str, str], int] = {}
        self._totals: dict[str, int] = {}
        self._table: dict[str, int] = {}  # the counters' values at the last flush
        self._seq = 0
        self._lost = 0

    def add(self, denial: Denial) -> None:
        kind = str(denial.kind)
        self._totals[kind] = self._totals.get(kind, 0) + 1
        key = (kind, denial.destination, denial.rule)
        if key in self._pending or len(self._pending) < MAX_RECENT:
            self._pending[key] = self._pending.get(key, 0) + 1
        else:
            self._lost += 1

    def _drops(self) -> None:
        """The table's refusals since the last flush: one entry per kind, no destination."""
        for kind, value in self._counters().items():
            grown = value - self._table.get(kind, 0)
            self._table[kind] = value
            if grown > 0:
                self._totals[kind] = self._totals.get(kind, 0) + grown
                key = (kind, "", "policy")
                self._pending[key] = self._pending.get(key, 0) + grown

    async def flush(self) -> bool:
        """Write a batch if there is one; whether one was written."""
        self._drops()
        if not self._pending:
            return False
        batch = tuple(Refusal(k, d, r, n) for (k, d, r), n in self._pending.items())
        report = GuardReport(self._seq + 1, batch, dict(self._totals), self._lost)
        try:
            await self._write(report.to_json())
        except StoreError as exc:  # kept: the next flush carries it
            log.warning("guard_report_not_written", error=exc.message)
            return False
        self._seq += 1
        self._pending = {}
        log.info("guard_report_written", seq=self._seq, refusals=len(batch))
        return True

    async def run(self) -> None:
        """Flush at most every ``interval`` seconds, forever (also polls the table's counters:
        a drop is no event of ours)."""
        while True:
            await self._sleep(self._interval)
            await self.flush()


Publish = Callable[[str, str, Refusal], Awaitable[None]]
# (namespace, sandbox, refusal) -> a network.denied event


class ReportReader:
    """Lifecycle's side: each report seen -> events and the metric (module docstring)."""

    def __init__(self, publish: Publish, denied: Counter) -> None:
        self._publish = publish
        self._denied = denied
        self._last: dict[tuple[str, str], GuardReport] = {}

    async def seen(self, namespace: str, sandbox: str, text: str) -> int:
        """Handle one version of a report; returns how many events it published."""
        try:
            report = GuardReport.from_json(text)
        except ReportInvalid as exc:  # a guard's bug or a tampered report: nothing published
            log.warning("guard_report_malformed", sandbox=sandbox, error=str(exc))
            return 0
        key = (namespace, sandbox)
        last = self._last.get(key, GuardReport())
        if report.seq <= last.seq:
            return 0
        self._last[key] = report
        for kind, total in report.totals.items():
            if (grown := total - last.totals.get(kind, 0)) > 0:
                self._denied.labels(kind).inc(grown)
        for r in report.recent:
            await self._publish(namespace, sandbox, r)
        return len(report.recent)

    def forget(self, namespace: str, sandbox: str) -> None:
        self._last.pop((namespace, sandbox), None)
