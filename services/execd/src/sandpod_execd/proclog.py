"""The bounded, cursor-addressed output log of a background process.

One log holds both streams in the order execd read them; each piece remembers its stream, so a
reader gets stdout and stderr interleaved as they happened (or one of them, filtered). Positions
are absolute byte offsets over both streams and only grow, so a reader that went away resumes
from the cursor it last saw; when the bound forced old output out, the reader is told how many
bytes it missed (``skipped``) instead of silently getting a gap.

Memory is bounded by ``capacity``: the bytes kept plus ``CHUNK_OVERHEAD`` per piece (so a
process alternating one-byte writes between its streams cannot make the bookkeeping outgrow the
bound). Consecutive reads of the same stream are merged into pieces of up to ``COALESCE`` bytes.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import dataclasses
import time
from typing import Literal

__all__ = ["CHUNK_OVERHEAD", "Chunk", "LogRead", "OutputLog", "StreamName"]

StreamName = Literal["stdout", "stderr"]

CHUNK_OVERHEAD = 64  # bytes of the bound charged per kept piece
WIRE_OVERHEAD = 16  # bytes of a reply's budget charged per returned piece (msgpack framing)
COALESCE = 64 * 1024


class _Piece:
    __slots__ = ("data", "offset", "stream")

    def __init__(self, offset: int, stream: StreamName, data: bytes) -> None:
        self.offset = offset
        self.stream = stream
        self.data = bytearray(data)


@dataclasses.dataclass(frozen=True, slots=True)
class Chunk:
    offset: int  # cursor of data[0]
    stream: StreamName
    data: bytes

    @property
    def end(self) -> int:
        return self.offset + len(self.data)


@dataclasses.dataclass(frozen=True, slots=True)
class LogRead:
    chunks: list[Chunk]  # in log order
    cursor: int  # where the chunks begin: after dropped bytes (and, filtered, other streams')
    next_cursor: int
    skipped: int  # bytes between the requested cursor and ``cursor`` that were dropped
    eof: bool  # closed and nothing after ``next_cursor``


class OutputLog:
    """The last ``capacity`` bytes of a process's stdout and stderr, interleaved."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._pieces: collections.deque[_Piece] = collections.deque()
        self._kept = 0  # bytes in _pieces
        self.total = 0  # bytes ever appended: the cursor of the next byte
        self.closed = False
        self._news = asyncio.Event()

    @property
    def start(self) -> int:
        """Cursor of the oldest byte still kept."""
        return self._pieces[0].offset if self._pieces else self.total

    def append(self, stream: StreamName, data: bytes) -> None:
        if not data:
            return
        last = self._pieces[-1] if self._pieces else None
        if last is not None and last.stream == stream and len(last.data) < COALESCE:
            last.data += data
        else:
            self._pieces.append(_Piece(self.total, stream, data))
        self._kept += len(data)
        self.total += len(data)
        self._trim()
        self._notify()

    def _trim(self) -> None:
        while self._pieces and self._kept + CHUNK_OVERHEAD * len(self._pieces) > self.capacity:
            excess = self._kept + CHUNK_OVERHEAD * len(self._pieces) - self.capacity
            head = self._pieces[0]
            if excess >= len(head.data):
                self._pieces.popleft()
                self._kept -= len(head.data)
            else:
                del head.data[:excess]
                head.offset += excess
                self._kept -= excess

    def close(self) -> None:
        """No more output will come (the process exited and its pipes closed)."""
        self.closed = True
        self._notify()

    def _notify(self) -> None:
        self._news.set()
        self._news = asyncio.Event()

    def read(self, cursor: int, max_bytes: int, stream: StreamName | None = None) -> LogRead:
        """Pieces from ``cursor`` (clamped to what is kept), costing at most ``max_bytes``.

        Each returned piece costs its length plus ``WIRE_OVERHEAD``; at least one byte is
        returned when there is any. With ``stream``, other streams' bytes are passed over
        (``next_cursor`` moves past them) without costing anything.
        """
        cursor = max(cursor, 0)
        begin = min(max(cursor, self.start), self.total)
        pos, budget = begin, max(max_bytes, WIRE_OVERHEAD + 1)
        out: list[Chunk] = []
        i = max(bisect.bisect_right(self._pieces, pos, key=lambda p: p.offset) - 1, 0)
        while i < len(self._pieces) and budget > WIRE_OVERHEAD:
            piece = self._pieces[i]
            rel = pos - piece.offset
            if rel >= len(piece.data):  # the cursor sits at this piece's end
                i += 1
                continue
            if stream is not None and piece.stream != stream:
                pos = piece.offset + len(piece.data)
            else:
                data = bytes(piece.data[rel : rel + budget - WIRE_OVERHEAD])
                last = out[-1] if out else None
                if last is not None and last.stream == piece.stream and last.end == pos:
                    out[-1] = Chunk(last.offset, last.stream, last.data + data)
                else:
                    out.append(Chunk(pos, piece.stream, data))
                    budget -= WIRE_OVERHEAD
                budget -= len(data)
                pos += len(data)
                if rel + len(data) < len(piece.data):
                    break
            i += 1
        skipped = begin - cursor if begin > cursor else 0
        return LogRead(out, begin, pos, skipped, self.closed and pos >= self.total)

    async def read_wait(
        self, cursor: int, max_bytes: int, timeout: float, stream: StreamName | None = None
    ) -> LogRead:
        """Like :meth:`read`, but wait up to ``timeout`` seconds for something to return."""
        first = self.read(cursor, max_bytes, stream)
        deadline = time.monotonic() + timeout
        current = first
        while not (current.chunks or current.eof or current.skipped):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if current.next_cursor >= self.total and not self.closed:
                news = self._news
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(news.wait(), left)
            current = self.read(current.next_cursor, max_bytes, stream)
        if current is first:
            return first
        return LogRead(
            current.chunks,
            current.cursor,
            current.next_cursor,
            first.skipped + current.skipped,
            current.eof,
        )
