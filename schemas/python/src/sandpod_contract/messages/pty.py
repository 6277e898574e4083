"""``pty`` family: pseudo-terminals with a replay buffer and several viewers.

``pty.open`` starts a command (or the sandbox's login shell) on a new pseudo-terminal and replies
:class:`PtyInfo`. Everything the terminal prints goes into a bounded replay buffer addressed by
absolute byte **cursors** that only grow. Viewers pull: ``pty.read {cursor, wait}`` answers with
the bytes after ``cursor`` as soon as there are any (or after ``wait`` seconds with none), so any
number of viewers read the same terminal, each at its own pace, and a viewer that went away
re-attaches from the last cursor it saw (or from 0 to replay what is kept). execd drains the
terminal into the buffer continuously, so a slow viewer never blocks the program; a viewer further
behind than the buffer is told how many bytes it missed (``skipped``). When the program has
exited and a viewer has read everything, its read says ``exited`` with the exit status.

``pty.input`` types bytes (keystrokes, pastes), ``pty.resize`` changes the window size (the
program gets SIGWINCH), ``pty.signal`` signals the foreground job, ``pty.close`` kills the whole
process tree and forgets the terminal.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Literal

from sandpod_contract.codec import Message
from sandpod_contract.messages.common import Empty, check_env, check_text
from sandpod_contract.operations import Operation

__all__ = [
    "FRAMES",
    "MAX_SIZE",
    "MAX_WAIT",
    "OPERATIONS",
    "PTY_ID_PATTERN",
    "PtyInfo",
    "PtyInput",
    "PtyList",
    "PtyOpen",
    "PtyOutput",
    "PtyRead",
    "PtyRef",
    "PtyResize",
    "PtySignal",
    "PtyWritten",
]

PTY_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}"
_PTY_ID = re.compile(PTY_ID_PATTERN)
MAX_SIZE = 4096  # largest cols/rows: bigger screens only make programs allocate huge buffers
MAX_WAIT = 60.0  # longest long-poll of pty.read, in seconds


def _check_id(pty_id: str | None) -> None:
    if pty_id is not None and not _PTY_ID.fullmatch(pty_id):
        raise ValueError(
            f"pty_id {pty_id!r} must be 1-128 characters of A-Z a-z 0-9 _ . : - "
            "(starting with a letter or digit)"
        )


def _check_size(cols: int, rows: int) -> None:
    for name, value in (("cols", cols), ("rows", rows)):
        if not 1 <= value <= MAX_SIZE:
            raise ValueError(f"{name} must be 1..{MAX_SIZE} (got {value})")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PtyOpen(Message):
    """``pty.open``: start a program on a new pseudo-terminal.

    Without ``argv`` and ``shell`` the sandbox's shell runs as an interactive login shell. The
    program is the leader of a new session with the terminal as its controlling terminal (job
    control, Ctrl-C and ``tty`` work). ``TERM`` defaults to ``xterm-256color``.
    """

    TYPE = "pty.open"
    pty_id: str | None = None  # caller-chosen id (unique among this sandbox's ptys)
    argv: tuple[str, ...] | None = None  # program and arguments, no shell
    shell: str | None = None  # a command line for the sandbox shell -c
    cwd: str | None = None  # default: the sandbox workspace
    env: dict[str, str] | None = None  # added to the sandbox's base environment (and TERM)
    cols: int = 80
    rows: int = 24
    buffer_bytes: int | None = None  # replay buffer size; execd clamps it (see PtyInfo)
    abandon_after: float | None = None  # kill the tree if no request names this pty this long

    def __post_init__(self) -> None:
        _check_id(self.pty_id)
        if self.argv is not None and self.shell is not None:
            raise ValueError("at most one of 'argv' or 'shell' (neither: the login shell)")
        if self.argv is not None:
            if not self.argv or not self.argv[0]:
                raise ValueError("argv must be a non-empty array with a non-empty program")
            check_text("argv", self.argv)
        if self.shell is not None:
            check_text("shell", [self.shell])
        if self.cwd is not None:
            check_text("cwd", [self.cwd])
        check_env(self.env)
        _check_size(self.cols, self.rows)
        if self.buffer_bytes is not None and self.buffer_bytes < 1:
            raise ValueError("buffer_bytes must be >= 1")
        if self.abandon_after is not None and not self.abandon_after > 0:
            raise ValueError(f"abandon_after must be > 0 (got {self.abandon_after})")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PtyInfo(Message):
    """Reply to ``pty.open``/``get``/``resize``/``signal``/``close``: where a pty stands.

    ``end_cursor`` is the number of bytes the terminal has printed so far (a viewer that only
    wants new output starts there); ``start_cursor`` is the oldest byte still in the buffer.
    ``state`` is ``exited`` once the program exited (``exit_code``, or ``signal`` if a signal
    killed it); output may still be readable then.
    """

    TYPE = "pty.info"
    pty_id: str
    pid: int
    argv: tuple[str, ...]  # what runs (the resolved login shell when none was asked for)
    cwd: str
    cols: int
    rows: int
    state: Literal["running", "exited"]
    exit_code: int | None = None
    signal: int | None = None
    abandoned: bool = False  # killed because no request named it for abandon_after
    started_at: float  # wall clock, seconds since the epoch
    end_cursor: int
    start_cursor: int = 0
    buffer_bytes: int  # the replay buffer size execd applies
    abandon_after: float | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PtyRef(Message):
    """``pty.get`` / ``pty.close``: names one pty."""

    TYPE = "pty.ref"
    pty_id: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PtyInput(Message):
    """``pty.input``: type ``data`` into the terminal (raw bytes: ``\\r`` is Enter, ``\\x03``
    Ctrl-C, ``\\x04`` Ctrl-D).

    The reply comes once every byte is in the terminal, so a client that waits for it before
    sending the next keeps its input in order and is flow-controlled by the program.
    """

    TYPE = "pty.input"
    pty_id: str
    data: bytes


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PtyWritten(Message):
    """Reply to ``pty.input``: ``written`` bytes are in the terminal."""

    TYPE = "pty.written"
    pty_id: str
    written: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PtyResize(Message):
    """``pty.resize``: set the window size; the program gets SIGWINCH."""

    TYPE = "pty.resize"
    pty_id: str
    cols: int
    rows: int

    def __post_init__(self) -> None:
        _check_size(self.cols, self.rows)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PtySignal(Message):
    """``pty.signal``: send a signal to the terminal's foreground process group (the job that
    Ctrl-C would interrupt; the program's own group if none). A no-op once it exited."""

    TYPE = "pty.signal"
    pty_id: str
    signal: int

    def __post_init__(self) -> None:
        if not 1 <= self.signal <= 64:
            raise ValueError(f"signal must be 1..64 (got {self.signal})")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PtyRead(Message):
    """``pty.read``: output after ``cursor``; wait up to ``wait`` seconds for some if none yet.

    Each viewer keeps its own cursor (start at 0 to replay what is kept, or at ``end_cursor``
    for new output only) and passes the reply's ``next_cursor`` next time. A cursor beyond what
    the terminal has printed is a ``bad_request``.
    """

    TYPE = "pty.read"
    pty_id: str
    cursor: int = 0
    max_bytes: int | None = None  # at most this many bytes (execd caps it to fit one message)
    wait: float = 0.0  # seconds; 0 answers at once

    def __post_init__(self) -> None:
        if self.cursor < 0:
            raise ValueError(f"cursor must be >= 0 (got {self.cursor})")
        if self.max_bytes is not None and self.max_bytes < 1:
            raise ValueError("max_bytes must be >= 1")
        if not 0 <= self.wait <= MAX_WAIT:
            raise ValueError(f"wait must be 0..{MAX_WAIT:g} seconds (got {self.wait})")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PtyOutput(Message):
    """Reply to ``pty.read``.

    ``data`` starts at ``cursor``, which is past the requested cursor by ``skipped`` bytes when
    the viewer fell behind the replay buffer. ``exited`` (with ``exit_code`` or ``signal``) means
    the program has ended and nothing is left after ``next_cursor``.
    """

    TYPE = "pty.output"
    pty_id: str
    data: bytes = b""
    cursor: int
    next_cursor: int
    skipped: int = 0
    exited: bool = False
    exit_code: int | None = None
    signal: int | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PtyList(Message):
    """Reply to ``pty.list``: every pty execd keeps for this sandbox, oldest first."""

    TYPE = "pty.list"
    ptys: tuple[PtyInfo, ...] = ()


OPERATIONS: tuple[Operation, ...] = (
    Operation("pty", "open", PtyOpen, PtyInfo, "start a program on a new pseudo-terminal"),
    Operation("pty", "input", PtyInput, PtyWritten, "type bytes into the terminal"),
    Operation("pty", "read", PtyRead, PtyOutput, "output after a cursor (long-poll)"),
    Operation("pty", "resize", PtyResize, PtyInfo, "set the window size (SIGWINCH)"),
    Operation("pty", "signal", PtySignal, PtyInfo, "signal the terminal's foreground job"),
    Operation("pty", "get", PtyRef, PtyInfo, "where one pty stands"),
    Operation("pty", "list", Empty, PtyList, "every pty of this sandbox"),
    Operation("pty", "close", PtyRef, PtyInfo, "kill the whole tree and forget the pty"),
)
FRAMES: tuple[type[Message], ...] = ()
