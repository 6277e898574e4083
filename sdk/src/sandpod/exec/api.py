"""The exec family's entry points behind ``sbx.exec`` and ``sbx.exec_stream``.

A call's positionals go through :func:`~sandpod.exec.args.cwd_and_command` (``exec(command)``
or the write-up's ``exec("/workspace", "date")``), then to the one-shot exec
(:mod:`sandpod.exec.oneshot`) or a streaming one (:mod:`sandpod.exec.stream`) on the sandbox's
:class:`~sandpod.channel.Channel`. The one thing added here is the argv hint: two positionals
that read as a program and its arguments (``exec("ls", "-l")``) raise
:class:`~sandpod.errors.ArgvExpected` naming the argv form, before anything is sent when the
command is an option, and in place of execd's bare ``InvalidCwd`` when the "cwd" is a program
name that is no directory.
"""

from __future__ import annotations

from collections.abc import Mapping

from sandpod.channel import Channel
from sandpod.errors import ArgvExpected, InvalidCwd
from sandpod.exec.args import Command, argv_hint, cwd_and_command, looks_like_program
from sandpod.exec.oneshot import run_oneshot
from sandpod.exec.stream import AsyncExecStream
from sandpod.exec.types import ExecResult

__all__ = ["open_exec_stream", "run_exec"]


async def run_exec(
    channel: Channel,
    cwd_or_command: str | Command | None,
    command: Command | None,
    *,
    env: Mapping[str, str] | None,
    stdin: bytes | str | None,
    timeout: float | None,
    max_output: int | None,
    check: bool,
) -> ExecResult:
    """Run a command to completion; arguments and errors as :meth:`AsyncSandbox.exec`.

    Raises:
        ArgvExpected: ``exec("ls", "-l")``-shaped positionals (see the module docstring).
        SandpodError: as listed by :meth:`AsyncSandbox.exec`.
    """
    cwd, cmd = cwd_and_command(cwd_or_command, command)
    try:
        return await run_oneshot(
            channel,
            cwd,
            cmd,
            env=env,
            stdin=stdin,
            timeout=timeout,
            max_output=max_output,
            check=check,
        )
    except InvalidCwd as exc:
        if cwd is None or not isinstance(cmd, str) or not looks_like_program(cwd):
            raise
        raise ArgvExpected(
            f"no directory {cwd!r} in the sandbox: {argv_hint(cwd, cmd)}", cwd=cwd, command=cmd
        ) from exc


def open_exec_stream(
    channel: Channel,
    cwd_or_command: str | Command | None,
    command: Command | None,
    *,
    env: Mapping[str, str] | None,
    stdin: bytes | str | None,
    stdin_open: bool,
    timeout: float | None,
    window: int | None,
    abandon_after: float | None,
) -> AsyncExecStream:
    """A streaming exec, not started yet; arguments as :meth:`AsyncSandbox.exec_stream`.

    Raises:
        ArgvExpected: the command is an option (``exec_stream("ls", "-l")``).
        TypeError: no command, or a ``cwd`` that is not a string.
    """
    cwd, cmd = cwd_and_command(cwd_or_command, command)
    return AsyncExecStream(
        channel,
        cwd,
        cmd,
        env=env,
        stdin=stdin,
        stdin_open=stdin_open,
        timeout=timeout,
        window=window,
        abandon_after=abandon_after,
    )
