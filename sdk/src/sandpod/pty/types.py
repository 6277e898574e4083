"""What the ``pty`` family returns: a terminal's state, one read's output, how it ended.

Plain frozen values built from the wire messages (``_info``); no NATS, no I/O.
"""

from __future__ import annotations

import dataclasses

from sandpod_contract.messages import pty as wire

__all__ = ["PtyExit", "PtyInfo", "PtyOutput"]


@dataclasses.dataclass(frozen=True, slots=True)
class PtyExit:
    """How a terminal's program ended: ``exit_code``, or ``signal`` if a signal killed it."""

    exit_code: int | None
    signal: int | None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclasses.dataclass(frozen=True, slots=True)
class PtyInfo:
    """Where a terminal stands. ``end_cursor`` is how many bytes it printed so far (start a
    viewer there for new output only); ``start_cursor`` is the oldest byte still replayable."""

    pty_id: str
    pid: int
    argv: tuple[str, ...]
    cwd: str
    cols: int
    rows: int
    running: bool
    exit: PtyExit | None  # once exited
    abandoned: bool
    started_at: float
    end_cursor: int
    start_cursor: int
    buffer_bytes: int
    abandon_after: float | None


@dataclasses.dataclass(frozen=True, slots=True)
class PtyOutput:
    """One read: ``data`` starts at ``cursor`` (``skipped`` bytes past the cursor asked for when
    the viewer fell behind the replay buffer). ``exit`` is set once the program ended and this
    viewer has read everything."""

    data: bytes
    cursor: int
    next_cursor: int
    skipped: int
    exit: PtyExit | None

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


def _info(msg: wire.PtyInfo) -> PtyInfo:
    done = msg.state == "exited"
    return PtyInfo(
        pty_id=msg.pty_id,
        pid=msg.pid,
        argv=msg.argv,
        cwd=msg.cwd,
        cols=msg.cols,
        rows=msg.rows,
        running=not done,
        exit=PtyExit(msg.exit_code, msg.signal) if done else None,
        abandoned=msg.abandoned,
        started_at=msg.started_at,
        end_cursor=msg.end_cursor,
        start_cursor=msg.start_cursor,
        buffer_bytes=msg.buffer_bytes,
        abandon_after=msg.abandon_after,
    )
