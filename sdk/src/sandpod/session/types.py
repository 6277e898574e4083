"""What the ``session`` family returns: a session's state and one command's outcome.

Plain frozen values built from the wire messages; no NATS, no I/O.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from sandpod_contract.messages.session import SessionInfo as WireInfo

__all__ = ["SessionInfo", "SessionResult"]


@dataclasses.dataclass(frozen=True, slots=True)
class SessionInfo:
    """Where a session stands: ``idle``, ``busy`` (running ``running``) or ``dead``."""

    session_id: str
    pid: int
    state: Literal["idle", "busy", "dead"]
    cwd: str
    created_at: float
    commands: int
    queued: int
    running: str | None
    exit_code: int | None  # dead sessions: how the shell ended
    signal: int | None

    @property
    def alive(self) -> bool:
        return self.state != "dead"

    @classmethod
    def _from_wire(cls, w: WireInfo) -> SessionInfo:
        return cls(**{f.name: getattr(w, f.name) for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True, slots=True)
class SessionResult:
    """One command's outcome. ``stdout``/``stderr`` decode ``*_bytes`` as UTF-8 (replacing).

    ``exit_code`` is 124 after ``timed_out``, 130 after ``cancelled``; ``shell_exited`` means the
    command ended the shell itself (``exit``): the session is dead, recreate it.
    """

    session_id: str
    command_id: str
    exit_code: int | None
    stdout_bytes: bytes
    stderr_bytes: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool
    cancelled: bool
    shell_exited: bool
    duration: float
    cwd: str | None  # the shell's working directory afterwards

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        return self.exit_code == 0
