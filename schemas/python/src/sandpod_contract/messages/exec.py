"""``exec`` family: one-shot and streaming command execution.

One-shot (``exec.run``): one request, one :class:`ExecResult` reply. Output larger than fits in one
NATS message stays in execd for a short while and is read with ``exec.fetch``.

Streaming (``exec.start``): execd replies :class:`ExecStarted`, then publishes sequenced frames to
the client's ``deliver`` subject: :class:`OutputChunk` ... then exactly one :class:`ExecExit`. Frame
``seq`` starts at 1 and increases by one per frame. The client acknowledges consumed frames with
``exec.ack``; execd never has more than ``window`` bytes of unacknowledged chunk data in flight and
stops reading the command's pipes until acks arrive (the command then blocks on write). Unacked
frames are retained, so a client that missed frames (reconnect) or went away can re-attach with
``exec.resume`` from any unacknowledged ``seq``.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from sandpod_contract.codec import Message
from sandpod_contract.messages.common import check_deliver, check_env, check_text
from sandpod_contract.operations import Operation

__all__ = [
    "FRAMES",
    "OPERATIONS",
    "ExecExit",
    "ExecFetch",
    "ExecRef",
    "ExecRequest",
    "ExecResult",
    "ExecResume",
    "ExecSignal",
    "ExecStart",
    "ExecStarted",
    "ExecStatus",
    "OutputChunk",
    "OutputPart",
    "StdinWrite",
    "StreamAck",
    "StreamName",
]

StreamName = Literal["stdout", "stderr"]


def _check_command(argv: tuple[str, ...] | None, shell: str | None) -> None:
    if (argv is None) == (shell is None):
        raise ValueError("exactly one of 'argv' or 'shell' is required")
    if argv is not None:
        if not argv or not argv[0]:
            raise ValueError("argv must be a non-empty array with a non-empty program")
        check_text("argv", argv)
    if shell is not None:
        check_text("shell", [shell])


def _check_positive(name: str, value: float | None) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"{name} must be > 0 (got {value})")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ExecRequest(Message):
    """``exec.run``: run a command to completion and return its whole result."""

    TYPE = "exec.request"
    exec_id: str | None = None  # client-chosen id for exec.status probes; execd makes one if unset
    argv: tuple[str, ...] | None = None  # program and arguments, no shell
    shell: str | None = None  # a command line for the sandbox shell (sys.info; bash or sh) -c
    cwd: str | None = None  # default: the sandbox workspace
    env: dict[str, str] | None = None  # added to the sandbox's base environment
    stdin: bytes | None = None  # written to the command's stdin, then EOF
    timeout: float | None = None  # seconds; on expiry the whole process group is killed
    max_output: int | None = None  # per-stream capture cap in bytes (default from sys.info)

    def __post_init__(self) -> None:
        _check_command(self.argv, self.shell)
        check_env(self.env)
        _check_positive("timeout", self.timeout)
        if self.max_output is not None and self.max_output < 0:
            raise ValueError("max_output must be >= 0")
        if self.cwd is not None:
            check_text("cwd", [self.cwd])


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ExecResult(Message):
    """Reply to ``exec.run``.

    ``exit_code`` is set when the command exited; ``signal`` when a signal terminated it (then
    ``exit_code`` is absent). ``*_size`` is the number of bytes captured (at most ``max_output``);
    when ``len(stdout) < stdout_size`` the rest did not fit in one message: read it with
    ``exec.fetch``. ``*_truncated`` means the command wrote more than ``max_output``.
    """

    TYPE = "exec.result"
    exec_id: str
    exit_code: int | None = None
    signal: int | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_size: int = 0
    stderr_size: int = 0
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    duration: float = 0.0  # seconds from spawn to exit


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ExecFetch(Message):
    """``exec.fetch``: read captured output of a finished one-shot exec that did not fit."""

    TYPE = "exec.fetch"
    exec_id: str
    stream: StreamName
    offset: int
    max_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.offset < 0:
            raise ValueError("offset must be >= 0")
        _check_positive("max_bytes", self.max_bytes)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class OutputPart(Message):
    """Reply to ``exec.fetch``."""

    TYPE = "exec.output_part"
    exec_id: str
    stream: StreamName
    offset: int
    data: bytes
    eof: bool  # no captured bytes beyond offset + len(data)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ExecStart(Message):
    """``exec.start``: start a streaming exec whose frames go to ``deliver``."""

    TYPE = "exec.start"
    deliver: str  # subject the frames are published to (normally the client's inbox)
    exec_id: str | None = None
    argv: tuple[str, ...] | None = None
    shell: str | None = None
    cwd: str | None = None
    env: dict[str, str] | None = None
    stdin: bytes | None = None  # initial stdin bytes
    stdin_open: bool = False  # keep stdin open for exec.stdin; otherwise EOF after ``stdin``
    timeout: float | None = None
    window: int | None = None  # max unacknowledged chunk bytes in flight
    abandon_after: float | None = None  # kill if the client is silent this long (no ack/stdin)

    def __post_init__(self) -> None:
        _check_command(self.argv, self.shell)
        check_env(self.env)
        _check_positive("timeout", self.timeout)
        _check_positive("window", self.window)
        _check_positive("abandon_after", self.abandon_after)
        check_deliver(self.deliver)
        if self.cwd is not None:
            check_text("cwd", [self.cwd])


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ExecStarted(Message):
    """Reply to ``exec.start``: the command is running; frames follow on ``deliver``."""

    TYPE = "exec.started"
    exec_id: str
    pid: int
    window: int  # the window execd applies (the request's, clamped to max_window)
    abandon_after: float | None = None  # silence limit applied; absent: execd's default, 60 s


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class OutputChunk(Message):
    """Frame: a piece of the command's output, in order."""

    TYPE = "exec.chunk"
    DISCRIMINATOR = "kind"
    kind: Literal["chunk"] = "chunk"
    exec_id: str
    seq: int
    stream: StreamName
    data: bytes


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ExecExit(Message):
    """Frame: the command finished; always the last frame of a stream."""

    TYPE = "exec.exit"
    DISCRIMINATOR = "kind"
    kind: Literal["exit"] = "exit"
    exec_id: str
    seq: int
    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    cancelled: bool = False
    abandoned: bool = False  # killed because the client was silent for abandon_after
    duration: float = 0.0
    stdout_size: int = 0
    stderr_size: int = 0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StreamAck(Message):
    """``exec.ack`` (publish, no reply): every frame up to and including ``seq`` was consumed."""

    TYPE = "exec.ack"
    exec_id: str
    seq: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StdinWrite(Message):
    """``exec.stdin``: write bytes to a streaming exec's stdin; ``eof`` closes it after them.

    The reply (:class:`ExecStatus`) comes once the bytes are in the pipe, so a client that waits
    for it is flow-controlled by the command's reading speed.
    """

    TYPE = "exec.stdin"
    exec_id: str
    data: bytes = b""
    eof: bool = False


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ExecSignal(Message):
    """``exec.signal``: send a signal (number) to the command's whole process group.

    Works for streaming and one-shot execs (name a one-shot by the ``exec_id`` it was sent with).
    """

    TYPE = "exec.signal"
    exec_id: str
    signal: int

    def __post_init__(self) -> None:
        if not 1 <= self.signal <= 64:
            raise ValueError(f"signal must be 1..64 (got {self.signal})")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ExecRef(Message):
    """``exec.status`` / ``exec.cancel``: names one exec (streaming or one-shot)."""

    TYPE = "exec.ref"
    exec_id: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ExecResume(Message):
    """``exec.resume``: re-send retained frames from ``from_seq`` (to ``deliver`` if given)."""

    TYPE = "exec.resume"
    exec_id: str
    from_seq: int
    deliver: str | None = None

    def __post_init__(self) -> None:
        if self.from_seq < 1:
            raise ValueError("from_seq must be >= 1")
        if self.deliver is not None:
            check_deliver(self.deliver)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ExecStatus(Message):
    """Reply to the exec control verbs: where the exec stands."""

    TYPE = "exec.status"
    exec_id: str
    state: Literal["running", "exited"]
    pid: int | None = None
    next_seq: int | None = None  # seq the next new frame will carry (streaming execs)
    acked_seq: int | None = None  # highest seq the client acknowledged
    # A stream reports these as soon as its process exited, even while frames wait for acks.
    exit_code: int | None = None  # the process exited with this code
    signal: int | None = None  # the process was killed by this signal


OPERATIONS: tuple[Operation, ...] = (
    Operation("exec", "run", ExecRequest, ExecResult, "run a command to completion"),
    Operation("exec", "fetch", ExecFetch, OutputPart, "read one-shot output that did not fit"),
    Operation("exec", "start", ExecStart, ExecStarted, "start a streaming exec (frames follow)"),
    Operation("exec", "ack", StreamAck, None, "acknowledge consumed frames (publish only)"),
    Operation("exec", "stdin", StdinWrite, ExecStatus, "write/close a streaming exec's stdin"),
    Operation("exec", "signal", ExecSignal, ExecStatus, "signal the command's process group"),
    Operation("exec", "cancel", ExecRef, ExecStatus, "kill the command (SIGKILL to the group)"),
    Operation("exec", "resume", ExecResume, ExecStatus, "re-send retained frames from a seq"),
    Operation("exec", "status", ExecRef, ExecStatus, "is this exec known, running, exited"),
)

# Frames published by execd to a stream's ``deliver`` subject, told apart by their ``kind`` field.
FRAMES: tuple[type[Message], ...] = (OutputChunk, ExecExit)
