"""What the exec family returns: a one-shot result, a stream's chunk, how a command ended."""

from __future__ import annotations

import dataclasses
import signal as _signal
from typing import Literal

__all__ = ["ExecResult", "ExitStatus", "OutputChunk"]


@dataclasses.dataclass(frozen=True, slots=True)
class ExecResult:
    """The outcome of a one-shot exec.

    ``stdout``/``stderr`` are the output decoded as UTF-8 (undecodable bytes replaced);
    ``stdout_bytes``/``stderr_bytes`` are the exact bytes. ``exit_code`` is ``None`` when a signal
    ended the command (see ``signal``).
    """

    exec_id: str
    exit_code: int | None
    signal: int | None
    stdout_bytes: bytes
    stderr_bytes: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool
    duration: float

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def signal_name(self) -> str | None:
        return _signal_name(self.signal)


@dataclasses.dataclass(frozen=True, slots=True)
class OutputChunk:
    """One piece of a streaming exec's output, in order."""

    stream: Literal["stdout", "stderr"]
    data: bytes
    seq: int

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


@dataclasses.dataclass(frozen=True, slots=True)
class ExitStatus:
    """How a streaming exec ended."""

    exec_id: str
    exit_code: int | None
    signal: int | None
    timed_out: bool
    cancelled: bool
    abandoned: bool
    duration: float
    stdout_size: int
    stderr_size: int

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def signal_name(self) -> str | None:
        return _signal_name(self.signal)


def _signal_name(sig: int | None) -> str | None:
    if sig is None:
        return None
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return f"SIG{sig}"
