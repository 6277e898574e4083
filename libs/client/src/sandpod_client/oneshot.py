"""The one-shot exec's client side: run a command to completion, one result, never a hang.

Data flow: the caller's :class:`ExecRequest` (given an ``exec_id`` here if it has none, since
the liveness probes name it) is one ``exec.run`` request; execd runs the command and replies
with the exit and the head of each output stream. While the reply is outstanding,
:func:`sandpod_client.liveness.watch` probes ``exec.status`` so a dead execd is a typed error
rather than a wait of the whole deadline, and a caller who gives up (task cancelled: Ctrl-C in
the sync SDK, an HTTP client that left) cancels the command with ``exec.cancel`` instead of
leaving it running. Output beyond what fit in the reply is fetched with ``exec.fetch``. The SDK
and the gateway both run this; each turns :class:`Completed` into its own result shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid

from sandpod_client.channel import CONTROL_TIMEOUT, Link, status_probe
from sandpod_client.liveness import PROBE_INTERVAL, watch
from sandpod_contract.errors import SandpodError
from sandpod_contract.messages.exec import (
    ExecFetch,
    ExecRef,
    ExecRequest,
    ExecResult,
    ExecStatus,
    OutputPart,
)

__all__ = ["REPLY_SLACK", "Completed", "run_oneshot"]

REPLY_SLACK = 10.0  # execd enforces the command timeout; the reply may take this much longer
CANCEL_TIMEOUT = 2.0


@dataclasses.dataclass(frozen=True, slots=True)
class Completed:
    """A finished one-shot exec: execd's reply and each stream's whole captured output."""

    result: ExecResult
    stdout: bytes
    stderr: bytes


async def run_oneshot(
    ch: Link,
    req: ExecRequest,
    deadline: float,
    *,
    probe_interval: float = PROBE_INTERVAL,
) -> Completed:
    """Run ``req`` in ``ch``'s sandbox to completion, its output fetched whole.

    Args:
        deadline: seconds to wait for the reply (the command's timeout plus slack, or a
            long "no deadline"): liveness, not this, is what ends a wait on a dead execd.

    Raises:
        SandboxUnavailable, ExecLost: execd died or was replaced during the request.
        SandboxNotFound: no execd serves the sandbox.
        SandpodError: the typed error execd answered (command not found, invalid cwd, ...).
    """
    if req.exec_id is None:
        req = dataclasses.replace(req, exec_id=uuid.uuid4().hex)
    exec_id = req.exec_id or ""
    try:
        result = await watch(
            ch.call("exec", "run", req, ExecResult, deadline),
            status_probe(ch, exec_id),
            what=f"exec {exec_id}",
            interval=probe_interval,
        )
    except asyncio.CancelledError:
        # The caller gave up: do not leave the command running in the sandbox.
        await asyncio.shield(_cancel_quietly(ch, exec_id))
        raise
    stdout = await fetch_rest(ch, result, "stdout", result.stdout, result.stdout_size)
    stderr = await fetch_rest(ch, result, "stderr", result.stderr, result.stderr_size)
    return Completed(result, stdout, stderr)


async def fetch_rest(ch: Link, result: ExecResult, stream: str, head: bytes, size: int) -> bytes:
    """The whole captured stream: what the reply held plus ``exec.fetch`` parts up to ``size``."""
    parts = [head]
    offset = len(head)
    while offset < size:
        req = ExecFetch(exec_id=result.exec_id, stream=stream, offset=offset)  # type: ignore[arg-type]
        part = await ch.call("exec", "fetch", req, OutputPart, CONTROL_TIMEOUT)
        if not part.data:
            break
        parts.append(part.data)
        offset += len(part.data)
        if part.eof:
            break
    return b"".join(parts)


async def _cancel_quietly(ch: Link, exec_id: str) -> None:
    with contextlib.suppress(SandpodError):
        await ch.call("exec", "cancel", ExecRef(exec_id=exec_id), ExecStatus, CANCEL_TIMEOUT)
