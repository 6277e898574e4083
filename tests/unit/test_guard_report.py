"""The network guard's refusal report (``podguard/report.py``): the guard batches and merges
refusals and the table's drop counts; lifecycle publishes each new batch once, grows the metric
by the totals, and publishes nothing for a malformed, replayed or oversized report."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from sandpod_contract.errors import StoreError
from sandpod_lifecycle.network.metrics import NetworkMetrics
from sandpod_lifecycle.network.podguard.report import (
    MAX_RECENT,
    GuardReport,
    GuardReporter,
    Refusal,
    ReportInvalid,
    ReportReader,
)
from sandpod_lifecycle.network.sandboxnet import Denial, DenialKind


@pytest.fixture(scope="session")
def _session_daemons() -> None:
    """No nats-server or execd: pure parts."""


def _denial(destination: str, kind: DenialKind = DenialKind.DNS) -> Denial:
    return Denial("sbx", kind, destination, "mode:allowlist")


async def test_the_guard_merges_batches_and_adds_the_tables_drops() -> None:
    """Repeats of one refusal are one entry with a count; drops of the table since the last
    flush are one ``connect`` entry; a failed write keeps the batch for the next flush."""
    written: list[str] = []
    fail = [True]
    drops = {"connect": 0}

    async def write(text: str) -> None:
        if fail[0]:
            raise StoreError("unreachable")
        written.append(text)

    reporter = GuardReporter(write, lambda: dict(drops))
    for _ in range(3):
        reporter.add(_denial("a.test"))
    drops["connect"] = 5
    assert not await reporter.flush() and not written
    fail[0] = False
    assert await reporter.flush()
    report = GuardReport.from_json(written[-1])
    assert report.seq == 1
    assert set(report.recent) == {
        Refusal("dns", "a.test", "mode:allowlist", 3),
        Refusal("connect", "", "policy", 5),
    }
    assert report.totals == {"dns": 3, "connect": 5}
    assert not await reporter.flush(), "nothing new: nothing written"


async def test_the_guard_bounds_a_batch_and_counts_what_it_left_out() -> None:
    """A flood of distinct refusals: at most MAX_RECENT entries, the rest in ``lost``, all in
    the totals."""
    written: list[str] = []

    async def write(text: str) -> None:
        written.append(text)

    reporter = GuardReporter(write, dict)
    for i in range(MAX_RECENT + 10):
        reporter.add(_denial(f"n{i}.test"))
    await reporter.flush()
    report = GuardReport.from_json(written[-1])
    assert len(report.recent) == MAX_RECENT and report.lost == 10
    assert report.totals == {"dns": MAX_RECENT + 10}


async def test_lifecycle_publishes_each_batch_once_and_counts_by_totals() -> None:
    """A new batch: its entries published under the ConfigMap's sandbox, the metric grown by
    the totals' growth; the same or an older seq again: nothing."""
    published: list[tuple[str, str, Refusal]] = []

    async def publish(namespace: str, sandbox: str, refusal: Refusal) -> None:
        published.append((namespace, sandbox, refusal))

    registry = CollectorRegistry()
    reader = ReportReader(publish, NetworkMetrics(registry).denied)
    first = GuardReport(1, (Refusal("dns", "a.test", "r", 2),), {"dns": 2})
    assert await reader.seen("ns", "sbx-a", first.to_json()) == 1
    assert await reader.seen("ns", "sbx-a", first.to_json()) == 0
    second = GuardReport(2, (Refusal("sni", "b.test:443", "r"),), {"dns": 2, "sni": 1})
    assert await reader.seen("ns", "sbx-a", second.to_json()) == 1
    assert [(s, r.kind) for _, s, r in published] == [("sbx-a", "dns"), ("sbx-a", "sni")]
    value = registry.get_sample_value

    assert value("sandpod_lifecycle_network_denied_total", {"kind": "dns"}) == 2
    assert value("sandpod_lifecycle_network_denied_total", {"kind": "sni"}) == 1


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"v": 2, "seq": 1, "recent": [], "totals": {}}',
        '{"v": 1, "seq": -1, "recent": [], "totals": {}}',
        '{"v": 1, "seq": 1, "recent": [{"kind": 1}], "totals": {}}',
        '{"v": 1, "seq": 1, "recent": [], "totals": {"dns": "many"}}',
        '{"v": 1, "seq": 1, "recent": "x", "totals": {}}',
        '{"v": 1, "seq": 1, "recent": [], "totals": {}, "pad": "' + "x" * 70000 + '"}',
    ],
)
async def test_a_malformed_report_publishes_nothing(text: str) -> None:
    """Anything but a well-formed version-1 report (a guard's bug, or a tampered ConfigMap)
    is refused with a typed ReportInvalid and publishes no event."""
    published: list[Refusal] = []

    async def publish(namespace: str, sandbox: str, refusal: Refusal) -> None:
        published.append(refusal)

    with pytest.raises(ReportInvalid):
        GuardReport.from_json(text)
    reader = ReportReader(publish, NetworkMetrics(CollectorRegistry()).denied)
    assert await reader.seen("ns", "sbx", text) == 0 and not published
