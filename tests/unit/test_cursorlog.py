"""ByteLog/EventLog: bounded, cursor-addressed, overflow reported, waiting for news."""

from __future__ import annotations

import asyncio

from sandpod_execd.cursorlog import ByteLog, EventLog


def test_bytelog_keeps_the_last_capacity_bytes_and_reports_skips() -> None:
    """Old bytes are dropped past the bound; a stale cursor learns how much it missed."""
    log = ByteLog(capacity=10)
    log.append(b"0123456789")
    log.append(b"abcde")
    r = log.read(0, 100)
    assert (r.data, r.cursor, r.next_cursor, r.skipped) == (b"56789abcde", 5, 15, 5)
    r = log.read(12, 2)
    assert (r.data, r.next_cursor, r.skipped, r.eof) == (b"cd", 14, 0, False)
    log.close()
    assert log.read(15, 10).eof and log.read(15, 10).data == b""


async def test_read_wait_wakes_on_append_and_on_close() -> None:
    """A reader at the end waits for news; an append or a close wakes it."""
    log = ByteLog(capacity=100)
    waiter = asyncio.create_task(log.read_wait(0, 10, timeout=30))
    await asyncio.sleep(0)
    log.append(b"hi")
    assert (await waiter).data == b"hi"
    waiter = asyncio.create_task(log.read_wait(2, 10, timeout=30))
    await asyncio.sleep(0)
    log.close()
    r = await waiter
    assert r.eof and r.data == b""


async def test_read_wait_times_out_empty() -> None:
    """With no news before the timeout, the read returns nothing and is not eof."""
    log = ByteLog(capacity=100)
    r = await log.read_wait(0, 10, timeout=0.01)
    assert r.data == b"" and not r.eof


def test_eventlog_sequence_and_overflow() -> None:
    """Events are numbered; overflow drops the oldest and the reader sees the skip."""
    log: EventLog[str] = EventLog(capacity=3)
    for e in "abcde":
        log.append(e)
    r = log.read(0, 10)
    assert (r.events, r.cursor, r.next_cursor, r.skipped) == (["c", "d", "e"], 2, 5, 2)
    assert log.read(4, 10).events == ["e"]
    assert log.read(5, 10).events == []
