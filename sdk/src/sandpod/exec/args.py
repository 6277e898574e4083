"""What the exec calls share: how a command is given, the request timeouts, and ``check=True``.

Both the one-shot exec (:mod:`sandpod.exec.oneshot`) and the streaming one
(:mod:`sandpod.exec.stream`) accept the same call shapes, ``exec(command)`` or
``exec(cwd, command)`` with ``command`` a shell string or an argv sequence. A call's positionals
go through :func:`cwd_and_command`, the command through :func:`split_command` into the wire's
``argv``/``shell`` pair; a finished result goes through :func:`check_result` when the caller
asked for ``check=True``; :func:`exec_status` is the liveness probe both use.
:func:`split_command` is also the proc client's; the timeouts are :mod:`sandpod.channel`'s,
re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence

from sandpod.channel import CONTROL_TIMEOUT, DEFAULT_TIMEOUT, NO_DEADLINE, REPLY_SLACK, Channel
from sandpod.errors import ArgvExpected, CommandFailed
from sandpod.exec.types import ExecResult
from sandpod_contract.messages.exec import ExecRef, ExecStatus

__all__ = [
    "CONTROL_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "NO_DEADLINE",
    "REPLY_SLACK",
    "Command",
    "argv_hint",
    "check_result",
    "cwd_and_command",
    "exec_status",
    "looks_like_program",
    "split_command",
]

Command = str | Sequence[str]


def split_command(command: Command) -> tuple[tuple[str, ...] | None, str | None]:
    """The wire's ``(argv, shell)`` pair for ``command``: exactly one of them is set.

    Raises:
        TypeError: ``command`` is neither a string nor a non-empty sequence of strings.
    """
    if isinstance(command, str):
        return None, command
    argv = tuple(command)
    if not argv or not all(isinstance(a, str) for a in argv):
        raise TypeError("command must be a shell string or a non-empty sequence of strings")
    return argv, None


def cwd_and_command(
    first: str | Command | None, second: Command | None
) -> tuple[str | None, Command]:
    """``(command)`` or ``(cwd, command)``: the write-up's ``exec("/workspace", "date")`` form.

    Raises:
        TypeError: no command, or a ``cwd`` that is not a string.
        ArgvExpected: ``exec("ls", "-l")``: the "command" is an option, so the two positionals
            are one program and its arguments (no shell command starts with ``-``).
    """
    if second is None:
        if first is None:
            raise TypeError("a command is required")
        return None, first
    if first is not None and not isinstance(first, str):
        raise TypeError("cwd must be a string path")
    if first is not None and isinstance(second, str) and second.lstrip().startswith("-"):
        raise ArgvExpected(argv_hint(first, second), cwd=first, command=second)
    return first, second


def looks_like_program(cwd: str) -> bool:
    """Whether a "cwd" reads as a program name rather than a directory (``ls``, not ``src/``)."""
    return bool(cwd) and not cwd.startswith((".", "~")) and "/" not in cwd


def argv_hint(first: str, second: str) -> str:
    """The message of :class:`ArgvExpected` for ``exec(first, second)``: the argv form."""
    argv = [first, *second.split()]
    return (
        f"exec({first!r}, {second!r}) runs shell command {second!r} in directory {first!r}; "
        f"to run {first!r} with arguments pass one argv list: exec({argv!r}) "
        f"(or one shell string: exec({' '.join(argv)!r}))"
    )


def check_result(result: ExecResult) -> None:
    """``check=True``: a command that did not exit 0 is an error, with how it ended.

    Raises:
        CommandFailed: with ``exit_code``, ``signal`` and ``timed_out`` in its details.
    """
    if result.ok:
        return
    how = result.exit_code if result.signal is None else result.signal_name
    raise CommandFailed(
        f"command exited with {how}",
        exit_code=result.exit_code,
        signal=result.signal,
        timed_out=result.timed_out,
    )


async def exec_status(channel: Channel, exec_id: str) -> ExecStatus:
    """Where exec ``exec_id`` stands: the probe that tells a long request from a lost one."""
    return await channel.call(
        "exec", "status", ExecRef(exec_id=exec_id), ExecStatus, CONTROL_TIMEOUT
    )
