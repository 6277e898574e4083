"""The one-shot exec behind :meth:`AsyncSandbox.exec`: run a command to completion, one result.

Data flow: the command, its stdin and options become one ``exec.run`` request; execd runs the
command and replies with the exit and the head of each output stream. While the reply is
outstanding, :func:`sandpod._watch.watch` probes ``exec.status`` so a dead execd is a typed
error rather than a hang, and a caller who gives up (task cancelled, Ctrl-C in the sync SDK)
cancels the command with ``exec.cancel`` instead of leaving it running. Output beyond what fit
in the reply is fetched with ``exec.fetch``. Stdin too large for one message takes another
path: the command runs as a streaming exec (:mod:`sandpod.exec.stream`) that is fed the stdin
and whose output is collected up to the same cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Mapping

from sandpod._watch import watch
from sandpod.channel import Channel
from sandpod.exec.args import (
    CONTROL_TIMEOUT,
    NO_DEADLINE,
    REPLY_SLACK,
    Command,
    check_result,
    exec_status,
    split_command,
)
from sandpod.exec.stream import AsyncExecStream
from sandpod.exec.types import ExecResult
from sandpod_contract.errors import SandpodError
from sandpod_contract.messages.exec import (
    ExecFetch,
    ExecRef,
    ExecRequest,
    ExecStatus,
    OutputPart,
)
from sandpod_contract.messages.exec import (
    ExecResult as WireResult,
)

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
    exec_id = uuid.uuid4().hex
    req = ExecRequest(
        exec_id=exec_id,
        argv=argv,
        shell=shell,
        cwd=cwd,
        env=dict(env) if env else None,
        stdin=data,
        timeout=timeout,
        max_output=max_output,
    )
    wire = await _run(sbx, exec_id, req, timeout + REPLY_SLACK if timeout else NO_DEADLINE)
    stdout = await _complete(sbx, wire, "stdout", wire.stdout, wire.stdout_size)
    stderr = await _complete(sbx, wire, "stderr", wire.stderr, wire.stderr_size)
    result = ExecResult(
        exec_id=wire.exec_id,
        exit_code=wire.exit_code,
        signal=wire.signal,
        stdout_bytes=stdout,
        stderr_bytes=stderr,
        stdout_truncated=wire.stdout_truncated,
        stderr_truncated=wire.stderr_truncated,
        timed_out=wire.timed_out,
        duration=wire.duration,
    )
    if check:
        check_result(result)
    return result


async def _run(sbx: Channel, exec_id: str, req: ExecRequest, deadline: float) -> WireResult:
    """The ``exec.run`` request, watched for execd's liveness; cancelled with its caller."""
    try:
        return await watch(
            sbx.call("exec", "run", req, WireResult, deadline),
            lambda: exec_status(sbx, exec_id),
            what=f"exec {exec_id}",
        )
    except asyncio.CancelledError:
        # The caller gave up (task cancelled, Ctrl-C in the sync SDK): do not leave the
        # command running in the sandbox.
        await asyncio.shield(_cancel_quietly(sbx, exec_id))
        raise


async def _complete(sbx: Channel, wire: WireResult, stream: str, head: bytes, size: int) -> bytes:
    """Fetch the part of the output that did not fit in the reply."""
    parts = [head]
    offset = len(head)
    while offset < size:
        req = ExecFetch(exec_id=wire.exec_id, stream=stream, offset=offset)  # type: ignore[arg-type]
        part = await sbx.call("exec", "fetch", req, OutputPart, CONTROL_TIMEOUT)
        if not part.data:
            break
        parts.append(part.data)
        offset += len(part.data)
        if part.eof:
            break
    return b"".join(parts)


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


async def _cancel_quietly(sbx: Channel, exec_id: str) -> None:
    with contextlib.suppress(SandpodError):
        await sbx.call("exec", "cancel", ExecRef(exec_id=exec_id), ExecStatus, 2.0)
