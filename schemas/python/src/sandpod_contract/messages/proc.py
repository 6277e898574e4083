"""``proc`` family: background processes with bounded, cursor-readable logs.

``proc.start`` launches a command that outlives the request (a dev server, a watcher, a long
build) under a caller-chosen ``proc_id`` and optional ``tags``; the reply is a :class:`ProcInfo`.
execd keeps draining the process's stdout and stderr into one bounded log (the last
``log_limit`` bytes of both streams, in the order they were read, each piece tagged with its
stream), so the process never blocks on a full pipe whether or not anyone reads it.

Reading is pull-based and resumable: ``proc.logs {cursor}`` returns the pieces after an absolute
byte ``cursor`` and the ``next_cursor`` to ask for next; with ``wait`` it long-polls until news
arrive. A client that went away re-attaches by asking again from the last cursor it saw; if the
bound forced that data out, ``skipped`` says how many bytes it missed. ``eof`` means the process
exited and everything was read. ``proc.wait`` long-polls for the exit, ``proc.wait_port`` for a
port to accept connections (checked from inside the sandbox). ``proc.kill`` ends the whole
process tree (a signal, then SIGKILL after ``grace``); ``proc.remove`` forgets an exited record.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Literal

from sandpod_contract.codec import Message
from sandpod_contract.messages.common import check_env, check_text
from sandpod_contract.operations import Operation

__all__ = [
    "FRAMES",
    "ID_PATTERN",
    "MAX_TAGS",
    "MAX_TAG_VALUE",
    "MAX_WAIT",
    "OPERATIONS",
    "TAG_KEY_PATTERN",
    "ProcChunk",
    "ProcInfo",
    "ProcKill",
    "ProcList",
    "ProcListing",
    "ProcLogPart",
    "ProcLogs",
    "ProcPortStatus",
    "ProcRef",
    "ProcSignal",
    "ProcStart",
    "ProcState",
    "ProcWait",
    "ProcWaitPort",
    "check_id",
    "check_wait",
]

# A process or session id: 1-128 characters, letters, digits, '.', '_', '-', not starting with
# a punctuation character (so it can appear in file names and log lines unquoted).
ID_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
TAG_KEY_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$"
MAX_TAGS = 16
MAX_TAG_VALUE = 256
MAX_WAIT = 60.0  # longest long-poll a request may ask for, in seconds

_ID_RE = re.compile(ID_PATTERN)
_TAG_KEY_RE = re.compile(TAG_KEY_PATTERN)

ProcState = Literal["running", "exited"]
StreamName = Literal["stdout", "stderr"]


def check_id(name: str, value: str) -> None:
    """Reject ids that are not 1-128 characters of ``[A-Za-z0-9._-]`` (first alphanumeric)."""
    if not _ID_RE.fullmatch(value):
        raise ValueError(
            f"{name} {value[:40]!r} must be 1-128 characters of letters, digits, '.', '_', '-' "
            "starting with a letter or digit"
        )


def check_wait(value: float | None) -> None:
    """A long-poll duration: 0 (answer at once) up to :data:`MAX_WAIT` seconds."""
    if value is not None and not 0 <= value <= MAX_WAIT:
        raise ValueError(f"wait must be 0..{MAX_WAIT:g} seconds (got {value})")


def _check_tags(tags: Mapping[str, str] | None) -> None:
    if tags is None:
        return
    if len(tags) > MAX_TAGS:
        raise ValueError(f"at most {MAX_TAGS} tags (got {len(tags)})")
    for key, value in tags.items():
        if not _TAG_KEY_RE.fullmatch(key):
            raise ValueError(f"tag name {key[:40]!r} must match {TAG_KEY_PATTERN}")
        if len(value) > MAX_TAG_VALUE or "\x00" in value:
            raise ValueError(f"tag {key!r}: value longer than {MAX_TAG_VALUE} or contains NUL")


def _check_positive(name: str, value: float | None) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"{name} must be > 0 (got {value})")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProcStart(Message):
    """``proc.start``: run a command in the background; the reply comes once it was spawned."""

    TYPE = "proc.start"
    proc_id: str | None = None  # unique among this sandbox's kept records; execd makes one if unset
    argv: tuple[str, ...] | None = None  # program and arguments, no shell
    shell: str | None = None  # a command line for the sandbox shell
    cwd: str | None = None  # default: the sandbox workspace
    env: dict[str, str] | None = None  # added to the sandbox's base environment
    tags: dict[str, str] | None = None  # labels to find it by (proc.list); at most 16
    stdin: bytes | None = None  # written to stdin, then EOF (without it stdin is /dev/null)
    timeout: float | None = None  # seconds; on expiry the whole process tree is killed
    log_limit: int | None = None  # bytes of output kept (both streams); execd clamps to its max

    def __post_init__(self) -> None:
        if (self.argv is None) == (self.shell is None):
            raise ValueError("exactly one of 'argv' or 'shell' is required")
        if self.argv is not None:
            if not self.argv or not self.argv[0]:
                raise ValueError("argv must be a non-empty array with a non-empty program")
            check_text("argv", self.argv)
        if self.shell is not None:
            check_text("shell", [self.shell])
        if self.proc_id is not None:
            check_id("proc_id", self.proc_id)
        if self.cwd is not None:
            check_text("cwd", [self.cwd])
        check_env(self.env)
        _check_tags(self.tags)
        _check_positive("timeout", self.timeout)
        _check_positive("log_limit", self.log_limit)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProcInfo(Message):
    """Where a background process stands (reply to most ``proc`` verbs).

    ``exit_code`` is set when it exited, ``signal`` when a signal ended it. ``killed`` means
    ``proc.kill``/``proc.remove`` (or execd shutting down) ended it, ``timed_out`` that its
    ``timeout`` did. ``log_start``/``log_end`` are the cursors of the oldest byte still kept and
    of the next byte to come: read from ``max(log_end - n, log_start)`` for the last ``n`` bytes.
    """

    TYPE = "proc.info"
    proc_id: str
    pid: int
    state: ProcState
    command: str  # the shell string or the argv joined shell-style, cut to 1024 characters
    cwd: str  # the resolved working directory
    tags: dict[str, str] | None = None
    started_at: float  # wall clock, seconds since the epoch
    ended_at: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    killed: bool = False
    timed_out: bool = False
    stdout_size: int = 0  # bytes the process wrote to stdout so far (kept or not)
    stderr_size: int = 0
    log_limit: int  # bytes of output kept (the limit execd applies)
    log_start: int = 0
    log_end: int = 0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProcRef(Message):
    """``proc.status`` / ``proc.remove``: names one background process."""

    TYPE = "proc.ref"
    proc_id: str

    def __post_init__(self) -> None:
        check_id("proc_id", self.proc_id)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProcList(Message):
    """``proc.list``: the kept records, optionally filtered (every given tag must match)."""

    TYPE = "proc.list"
    tags: dict[str, str] | None = None
    state: ProcState | None = None

    def __post_init__(self) -> None:
        _check_tags(self.tags)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProcListing(Message):
    """Reply to ``proc.list``, oldest first. ``truncated``: more matched than fit in one reply."""

    TYPE = "proc.listing"
    procs: tuple[ProcInfo, ...] = ()
    truncated: bool = False


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProcWait(Message):
    """``proc.wait``: reply when the process exited, or after ``wait`` seconds with its state."""

    TYPE = "proc.wait"
    proc_id: str
    wait: float | None = None  # seconds, 0..60; unset or 0: answer at once

    def __post_init__(self) -> None:
        check_id("proc_id", self.proc_id)
        check_wait(self.wait)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProcLogs(Message):
    """``proc.logs``: output after ``cursor``; with ``wait``, long-poll until there is some.

    The reply comes at once if there is data past ``cursor`` (or the log ended), else when data
    arrives or ``wait`` seconds passed (then with no chunks). ``stream`` filters the chunks
    returned; cursors always count both streams.
    """

    TYPE = "proc.logs"
    proc_id: str
    cursor: int = 0  # absolute byte position in the combined log; 0 = the beginning
    max_bytes: int | None = None  # default and upper bound: what fits in one reply
    wait: float | None = None  # seconds, 0..60
    stream: StreamName | None = None  # only this stream's chunks (cursors still count both)

    def __post_init__(self) -> None:
        check_id("proc_id", self.proc_id)
        if self.cursor < 0:
            raise ValueError("cursor must be >= 0")
        _check_positive("max_bytes", self.max_bytes)
        check_wait(self.wait)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProcChunk(Message):
    """A piece of a background process's output and the stream it came from."""

    TYPE = "proc.chunk"
    offset: int  # cursor of the chunk's first byte; resume after it from offset + len(data)
    stream: StreamName
    data: bytes


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProcLogPart(Message):
    """Reply to ``proc.logs``.

    ``chunks`` cover the log from ``cursor`` to ``next_cursor`` in the order execd read them
    (without ``stream`` they are contiguous; each names its own ``offset``).
    ``skipped`` > 0: the bytes between the requested cursor and ``cursor`` were dropped by the
    log's bound before anyone read them. ``eof``: the process exited, its pipes closed, and
    nothing is left after ``next_cursor``.
    """

    TYPE = "proc.log_part"
    proc_id: str
    cursor: int  # where the chunks begin: past dropped bytes (and, with stream, the other's)
    next_cursor: int  # ask from here next time
    skipped: int = 0
    eof: bool = False
    state: ProcState
    chunks: tuple[ProcChunk, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProcSignal(Message):
    """``proc.signal``: send a signal (number) to the process group; nothing else happens."""

    TYPE = "proc.signal"
    proc_id: str
    signal: int

    def __post_init__(self) -> None:
        check_id("proc_id", self.proc_id)
        if not 1 <= self.signal <= 64:
            raise ValueError(f"signal must be 1..64 (got {self.signal})")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProcKill(Message):
    """``proc.kill``: end the whole process tree; the reply comes once it is gone.

    ``signal`` (default SIGTERM, 15) goes to every process of the tree, descendants that left
    the group with setsid included; whatever is still alive ``grace`` seconds later gets
    SIGKILL. Killing an exited process kills what it left running, if anything.
    """

    TYPE = "proc.kill"
    proc_id: str
    signal: int | None = None  # default 15 (SIGTERM)
    grace: float | None = None  # seconds before SIGKILL, 0..60 (default 5)

    def __post_init__(self) -> None:
        check_id("proc_id", self.proc_id)
        if self.signal is not None and not 1 <= self.signal <= 64:
            raise ValueError(f"signal must be 1..64 (got {self.signal})")
        if self.grace is not None and not 0 <= self.grace <= MAX_WAIT:
            raise ValueError(f"grace must be 0..{MAX_WAIT:g} seconds (got {self.grace})")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProcWaitPort(Message):
    """``proc.wait_port``: long-poll until ``port`` on the sandbox's loopback accepts.

    ``kind: "tcp"``: a TCP connection succeeds; ``"http"``: ``GET path`` answers with a status
    in 200..399. With ``proc_id`` the wait also ends when that process exits.
    """

    TYPE = "proc.wait_port"
    port: int
    kind: Literal["tcp", "http"] = "tcp"
    path: str | None = None  # http only; default "/"
    proc_id: str | None = None
    wait: float | None = None  # seconds, 0..60; unset or 0: check once

    def __post_init__(self) -> None:
        if not 1 <= self.port <= 65535:
            raise ValueError(f"port must be 1..65535 (got {self.port})")
        if self.path is not None and (
            not self.path.startswith("/") or any(c.isspace() or c == "\x00" for c in self.path)
        ):
            raise ValueError("path must start with '/' and contain no whitespace or NUL")
        if self.proc_id is not None:
            check_id("proc_id", self.proc_id)
        check_wait(self.wait)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProcPortStatus(Message):
    """Reply to ``proc.wait_port``: ``ready``, else why not yet (``reason``, ``status_code``).

    (Not ``error``: a reply map with an ``error`` key is the error envelope.)
    """

    TYPE = "proc.port_status"
    port: int
    ready: bool
    status_code: int | None = None  # the last HTTP status seen (kind "http")
    reason: str | None = None  # the last failure, e.g. "connection refused"
    proc_state: ProcState | None = None  # the state of proc_id, when one was given


OPERATIONS: tuple[Operation, ...] = (
    Operation("proc", "start", ProcStart, ProcInfo, "start a background process"),
    Operation("proc", "list", ProcList, ProcListing, "list kept processes (filter by tags, state)"),
    Operation("proc", "status", ProcRef, ProcInfo, "where one background process stands"),
    Operation("proc", "wait", ProcWait, ProcInfo, "long-poll for the process's exit"),
    Operation("proc", "logs", ProcLogs, ProcLogPart, "read output after a cursor (long-poll)"),
    Operation("proc", "signal", ProcSignal, ProcInfo, "send a signal to the process group"),
    Operation("proc", "kill", ProcKill, ProcInfo, "end the whole tree: signal, then SIGKILL"),
    Operation("proc", "remove", ProcRef, ProcInfo, "kill if running, then forget the record"),
    Operation("proc", "wait_port", ProcWaitPort, ProcPortStatus, "long-poll for a port to accept"),
)
FRAMES: tuple[type[Message], ...] = ()
