"""The one-shot exec behind :meth:`AsyncSandbox.exec`: run a command to completion, one result.

Data flow: the command, its stdin and options become one ``exec.run`` request, run by the
protocol client (:func:`sandpod_client.run_oneshot`, shared with the gateway: liveness probes
so a dead execd is a typed error rather than a hang, ``exec.cancel`` when the caller gives up,
``exec.fetch`` of output beyond the reply); its result becomes the SDK's :class:`ExecResult`.
Stdin too large for one message takes another path: the command runs as a streaming exec
(:mod:`sandpod.exec.stream`) that is fed the stdin and whose output is collected up to the
same cap.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from sandpod.channel import Channel
from sandpod.exec.args import NO_DEADLINE, REPLY_SLACK, Command, check_result, split_command
from sandpod.exec.stream import AsyncExecStream
from sandpod.exec.types import ExecResult
from sandpod_client import run_oneshot as run_wire
from sandpod_contract.messages.exec import ExecRequest

__all__ = ["run_oneshot"]

STREAMED_OUTPUT_CAP = 16 * 1024 * 1024  # per stream, when stdin forced a streaming exec


async def run_oneshot(
    sbx: Channel,
    cwd: str | None,
    command: Command,
    *,
    env: Mapping[str, str] | None,
    stdin: bytes | str | None,
    timeout: float | None,
    max_output: int | None,
    check: bool,
) -> ExecResult:
    """Run ``command`` in ``sbx`` to completion; arguments and errors as :meth:`AsyncSandbox.exec`.

    Raises:
        TypeError: ``command`` is not a string or a non-empty sequence of strings.
        CommandFailed: ``check`` and the command did not exit 0.
        SandpodError: as listed by :meth:`AsyncSandbox.exec`.
    """
    argv, shell = split_command(command)
    data = stdin.encode() if isinstance(stdin, str) else stdin
    if data is not None and len(data) > sbx.limits.max_payload // 2:
        return await _exec_via_stream(
            sbx,
            cwd,
            command,
            env=env,
            stdin=data,
            timeout=timeout,
            max_output=max_output,
            check=check,
        )
    req = ExecRequest(
        argv=argv,
        shell=shell,
        cwd=cwd,
        env=dict(env) if env else None,
        stdin=data,
        timeout=timeout,
        max_output=max_output,
    )
    done = await run_wire(sbx, req, timeout + REPLY_SLACK if timeout else NO_DEADLINE)
    wire = done.result
    result = ExecResult(
        exec_id=wire.exec_id,
        exit_code=wire.exit_code,
        signal=wire.signal,
        stdout_bytes=done.stdout,
        stderr_bytes=done.stderr,
        stdout_truncated=wire.stdout_truncated,
        stderr_truncated=wire.stderr_truncated,
        timed_out=wire.timed_out,
        duration=wire.duration,
    )
    if check:
        check_result(result)
    return result


async def _exec_via_stream(
    sbx: Channel,
    cwd: str | None,
    command: Command,
    *,
    env: Mapping[str, str] | None,
    stdin: bytes,
    timeout: float | None,
    max_output: int | None,
    check: bool,
) -> ExecResult:
    """A one-shot exec whose stdin is too large for one message: stream it in."""
    cap = max_output if max_output is not None else STREAMED_OUTPUT_CAP
    out: list[bytes] = []
    err: list[bytes] = []
    sizes = {"stdout": 0, "stderr": 0}
    async with AsyncExecStream(sbx, cwd, command, env=env, stdin_open=True, timeout=timeout) as st:
        feeder = asyncio.create_task(st._feed_all(stdin))
        try:
            async for chunk in st:
                room = cap - sizes[chunk.stream]
                if room > 0:
                    (out if chunk.stream == "stdout" else err).append(chunk.data[:room])
                sizes[chunk.stream] += len(chunk.data)
        finally:
            feeder.cancel()
            await asyncio.gather(feeder, return_exceptions=True)
        status = await st.wait()
    result = ExecResult(
        exec_id=status.exec_id,
        exit_code=status.exit_code,
        signal=status.signal,
        stdout_bytes=b"".join(out),
        stderr_bytes=b"".join(err),
        stdout_truncated=sizes["stdout"] > cap,
        stderr_truncated=sizes["stderr"] > cap,
        timed_out=status.timed_out,
        duration=status.duration,
    )
    if check:
        check_result(result)
    return result
