"""``session`` family: long-lived shells whose state (cwd, env, functions) persists.

``session.create`` starts a real ``bash`` that lives until ``session.delete``. Each
``session.run`` executes one command line *in that shell* (so ``cd``, ``export``, variables,
functions and aliases carry over to the next command) and replies with that command's own
stdout, stderr and exit status. Commands of one session run one at a time in the order execd
received them; different sessions run in parallel.

A ``timeout`` (or ``session.cancel``) ends the command, never the session: the processes it
started are killed and the shell abandons the command and stays, with its state as the command
left it. If the shell itself exits (``exit``, ``exec``, a crash) the result says
``shell_exited`` and later requests get ``session.dead``; ``session.create`` with the same id
replaces a dead session. Output larger than one reply is read with ``session.fetch``, like
``exec.fetch``.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from sandpod_contract.codec import Message
from sandpod_contract.messages.common import Empty, check_env, check_text
from sandpod_contract.messages.proc import check_id
from sandpod_contract.operations import Operation

__all__ = [
    "FRAMES",
    "OPERATIONS",
    "SessionCommandRef",
    "SessionCreate",
    "SessionFetch",
    "SessionInfo",
    "SessionListing",
    "SessionOutputPart",
    "SessionRef",
    "SessionResult",
    "SessionRun",
    "SessionState",
]

SessionState = Literal["idle", "busy", "dead"]
StreamName = Literal["stdout", "stderr"]


def _check_positive(name: str, value: float | None) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"{name} must be > 0 (got {value})")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SessionCreate(Message):
    """``session.create``: start a shell; replaces a dead session of the same id."""

    TYPE = "session.create"
    session_id: str | None = None  # execd makes one if unset
    cwd: str | None = None  # where the shell starts; default: the sandbox workspace
    env: dict[str, str] | None = None  # exported in the shell on top of the base environment

    def __post_init__(self) -> None:
        if self.session_id is not None:
            check_id("session_id", self.session_id)
        if self.cwd is not None:
            check_text("cwd", [self.cwd])
        check_env(self.env)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SessionInfo(Message):
    """Where a session stands.

    ``state``: ``idle`` (waiting for a command), ``busy`` (running one; ``queued`` more wait),
    ``dead`` (the shell exited with ``exit_code``/``signal``: delete or recreate it).
    """

    TYPE = "session.info"
    session_id: str
    pid: int  # the shell's pid
    state: SessionState
    cwd: str  # the shell's working directory after the last command
    created_at: float  # wall clock, seconds since the epoch
    commands: int = 0  # commands run so far
    queued: int = 0  # commands waiting behind the running one
    running: str | None = None  # command_id of the running command
    exit_code: int | None = None  # dead sessions: the shell's exit status
    signal: int | None = None  # dead sessions: the signal that killed the shell


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SessionRef(Message):
    """``session.status`` / ``session.delete``: names one session."""

    TYPE = "session.ref"
    session_id: str

    def __post_init__(self) -> None:
        check_id("session_id", self.session_id)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SessionListing(Message):
    """Reply to ``session.list``, oldest first."""

    TYPE = "session.listing"
    sessions: tuple[SessionInfo, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SessionRun(Message):
    """``session.run``: run one command line in the session's shell and return its result.

    The command is sourced by the shell, so it may span lines, define functions, ``cd`` and
    ``export``. Its stdin is ``stdin`` (then EOF) or ``/dev/null``, never the shell's.
    """

    TYPE = "session.run"
    session_id: str
    command: str
    command_id: str | None = None  # for session.cancel and probes; execd makes one if unset
    timeout: float | None = None  # seconds from the start of the command (not its queueing)
    stdin: bytes | None = None
    max_output: int | None = None  # per-stream capture cap in bytes (default from sys.info)

    def __post_init__(self) -> None:
        check_id("session_id", self.session_id)
        check_text("command", [self.command])
        if self.command_id is not None:
            check_id("command_id", self.command_id)
        _check_positive("timeout", self.timeout)
        if self.max_output is not None and self.max_output < 0:
            raise ValueError("max_output must be >= 0")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SessionResult(Message):
    """Reply to ``session.run``: one command's output and status.

    ``exit_code`` is the command's status as the shell saw it (128+N when signal N killed its
    last program); 124 after ``timed_out``, 130 after ``cancelled``. ``cwd`` is the shell's
    directory afterwards. ``shell_exited``: the command ended the shell itself (``exit``); the
    session is dead. When ``len(stdout) < stdout_size`` the rest is read with ``session.fetch``.
    """

    TYPE = "session.result"
    session_id: str
    command_id: str
    exit_code: int | None = None  # None only if the shell was killed by a signal
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_size: int = 0
    stderr_size: int = 0
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    cancelled: bool = False
    shell_exited: bool = False
    duration: float = 0.0  # seconds from the start of the command to its end
    cwd: str | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SessionCommandRef(Message):
    """``session.cancel``: end a running or queued command (the session stays)."""

    TYPE = "session.command_ref"
    session_id: str
    command_id: str

    def __post_init__(self) -> None:
        check_id("session_id", self.session_id)
        check_id("command_id", self.command_id)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SessionFetch(Message):
    """``session.fetch``: read a finished command's output that did not fit in its result."""

    TYPE = "session.fetch"
    session_id: str
    command_id: str
    stream: StreamName
    offset: int
    max_bytes: int | None = None

    def __post_init__(self) -> None:
        check_id("session_id", self.session_id)
        check_id("command_id", self.command_id)
        if self.offset < 0:
            raise ValueError("offset must be >= 0")
        _check_positive("max_bytes", self.max_bytes)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SessionOutputPart(Message):
    """Reply to ``session.fetch``."""

    TYPE = "session.output_part"
    session_id: str
    command_id: str
    stream: StreamName
    offset: int
    data: bytes
    eof: bool  # no captured bytes beyond offset + len(data)


OPERATIONS: tuple[Operation, ...] = (
    Operation("session", "create", SessionCreate, SessionInfo, "start a long-lived shell"),
    Operation("session", "list", Empty, SessionListing, "list this sandbox's sessions"),
    Operation("session", "status", SessionRef, SessionInfo, "where one session stands"),
    Operation("session", "delete", SessionRef, SessionInfo, "kill the shell and its processes"),
    Operation("session", "run", SessionRun, SessionResult, "run one command in the shell"),
    Operation("session", "cancel", SessionCommandRef, SessionInfo, "end a running/queued command"),
    Operation("session", "fetch", SessionFetch, SessionOutputPart, "read output that did not fit"),
)
FRAMES: tuple[type[Message], ...] = ()
