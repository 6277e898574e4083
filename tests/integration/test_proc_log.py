"""OutputLog (execd's background-process log): bounded, interleaved, cursor-addressed, waitable.

Pure unit tests of the domain module; no NATS involved.
"""

from __future__ import annotations

import asyncio

from sandpod_execd.proclog import CHUNK_OVERHEAD, OutputLog


def _flat(read) -> list[tuple[str, bytes, int]]:  # type: ignore[no-untyped-def]
    return [(c.stream, c.data, c.offset) for c in read.chunks]


def test_streams_interleave_in_order_and_same_stream_pieces_merge() -> None:
    """Pieces keep their stream and order; consecutive pieces of one stream come back merged."""
    log = OutputLog(1 << 20)
    for stream, data in [("stdout", b"a"), ("stdout", b"b"), ("stderr", b"E"), ("stdout", b"c")]:
        log.append(stream, data)  # type: ignore[arg-type]
    r = log.read(0, 1000)
    assert _flat(r) == [("stdout", b"ab", 0), ("stderr", b"E", 2), ("stdout", b"c", 3)]
    assert (r.cursor, r.next_cursor, r.skipped, r.eof) == (0, 4, 0, False)
    assert _flat(log.read(1, 1000))[0] == ("stdout", b"b", 1)
    assert log.read(4, 1000).chunks == []  # at the end: nothing, not an empty chunk


def test_the_bound_counts_bytes_and_pieces_and_reports_skips() -> None:
    """Old output goes first; per-piece overhead counts, so 1-byte alternation stays bounded."""
    log = OutputLog(4 * CHUNK_OVERHEAD + 40)
    for i in range(100):
        log.append("stdout" if i % 2 else "stderr", b"x")
    kept = log.total - log.start
    assert kept * (1 + CHUNK_OVERHEAD) <= log.capacity
    r = log.read(0, 10_000)
    assert r.skipped == r.cursor == log.start > 0
    assert sum(len(c.data) for c in r.chunks) == kept and r.next_cursor == 100


def test_a_piece_larger_than_the_bound_keeps_its_tail() -> None:
    """A single huge write keeps its last bytes, cut mid-piece."""
    log = OutputLog(CHUNK_OVERHEAD + 10)
    log.append("stdout", b"0123456789abcdefghij")
    r = log.read(0, 1000)
    assert _flat(r) == [("stdout", b"abcdefghij", 10)] and r.skipped == 10


def test_reads_respect_the_byte_budget_and_stream_filter() -> None:
    """max_bytes caps a read (framing included); a stream filter passes over the other stream."""
    log = OutputLog(1 << 20)
    log.append("stdout", b"o" * 100)
    log.append("stderr", b"e" * 100)
    log.append("stdout", b"O" * 100)
    r = log.read(0, 66)
    assert sum(len(c.data) for c in r.chunks) == 50 and r.next_cursor == 50
    r = log.read(0, 10_000, "stderr")
    assert _flat(r) == [("stderr", b"e" * 100, 100)] and r.next_cursor == 300


async def test_read_wait_returns_on_news_or_timeout_and_eof_after_close() -> None:
    """A waiting read wakes on new output, times out empty, and reports eof once closed."""
    log = OutputLog(1 << 20)
    empty = await log.read_wait(0, 100, 0.05)
    assert empty.chunks == [] and not empty.eof
    waiter = asyncio.ensure_future(log.read_wait(0, 100, 30))
    await asyncio.sleep(0)
    log.append("stderr", b"late")
    assert _flat(await asyncio.wait_for(waiter, 5)) == [("stderr", b"late", 0)]
    filtered = asyncio.ensure_future(log.read_wait(4, 100, 30, "stdout"))
    await asyncio.sleep(0)
    log.append("stderr", b"ignored")
    log.append("stdout", b"wanted")
    r = await asyncio.wait_for(filtered, 5)
    assert _flat(r) == [("stdout", b"wanted", 11)]
    log.close()
    assert (await log.read_wait(r.next_cursor, 100, 30)).eof
