"""What the exec calls share: how a command is given, the request timeouts, and ``check=True``.

Both the one-shot exec (:mod:`sandpod.exec_oneshot`) and the streaming one
(:mod:`sandpod.exec_stream`) accept the same call shapes, ``exec(command)`` or
``exec(cwd, command)`` with ``command`` a shell string or an argv sequence. A call's positionals
go through :func:`cwd_and_command`, the command through :func:`split_command` into the wire's
``argv``/``shell`` pair; a finished result goes through :func:`check_result` when the caller
asked for ``check=True``. The timeouts and :func:`split_command` are also the session, proc,
pty, watch and git clients' (one definition, so they cannot drift apart; the timeouts are
:mod:`sandpod_client`'s, which the gateway shares).
"""

from __future__ import annotations

from collections.abc import Sequence

from sandpod.errors import CommandFailed
from sandpod.results import ExecResult
from sandpod_client import CONTROL_TIMEOUT, NO_DEADLINE, REPLY_SLACK

__all__ = [
    "CONTROL_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "NO_DEADLINE",
    "REPLY_SLACK",
    "Command",
    "check_result",
    "cwd_and_command",
    "split_command",
]

Command = str | Sequence[str]

DEFAULT_TIMEOUT = 60.0  # CONTROL_TIMEOUT, REPLY_SLACK and NO_DEADLINE: the protocol client's


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
    """
    if second is None:
        if first is None:
            raise TypeError("a command is required")
        return None, first
    if first is not None and not isinstance(first, str):
        raise TypeError("cwd must be a string path")
    return first, second


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
