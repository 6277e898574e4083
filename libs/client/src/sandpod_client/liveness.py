"""Liveness watching for long requests: never hang when execd dies mid-request.

A request can legitimately wait a long time (a long ``exec.run``, a stdin write into a full
pipe, a read from a slow disk), and a NATS request whose responder died is never answered: it
would wait out its whole deadline. So while ``work`` has not answered after ``interval``, the
client probes the same execd on the same connection every interval (the contract's "Liveness
probing"). Because the probe travels the same connection and subscription as the request, execd
always sees the request first. The answers mean: no responders (the channel's
``SandboxNotFound``) -> execd is gone (``SandboxUnavailable``); ``exec.not_found`` -> a different
execd answers, ours died (``ExecLost``); "exited" twice with no reply -> the reply was lost in a
reconnect (``ExecLost``); three probe timeouts in a row -> ``SandboxUnavailable``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from sandpod_client.channel import Link
from sandpod_contract.errors import (
    ExecLost,
    ExecNotFound,
    RequestTimeout,
    SandboxNotFound,
    SandboxUnavailable,
)
from sandpod_contract.messages.common import Empty
from sandpod_contract.messages.exec import ExecStatus
from sandpod_contract.messages.system import Pong

__all__ = ["MAX_MISSED", "PROBE_INTERVAL", "Probe", "ping_probe", "watch"]

T = TypeVar("T")
PROBE_INTERVAL = 1.0
MAX_MISSED = 3
Probe = Callable[[], Awaitable[ExecStatus | None]]  # None: alive, nothing more to say


def ping_probe(ch: Link, timeout: float = 2.0) -> Probe:
    """A probe for work that has no exec id (file transfer): execd answers ``sys.ping``."""

    async def probe() -> None:
        await ch.call("sys", "ping", Empty(), Pong, timeout)

    return probe


async def watch(
    work: Awaitable[T],
    probe: Probe,
    *,
    what: str,
    interval: float = PROBE_INTERVAL,
    exit_means_lost: bool = True,
) -> T:
    """Await ``work`` while probing liveness; raise a typed error as soon as it is lost.

    ``exit_means_lost=False`` for work that may outlast the exec's process legitimately (a stdin
    write into a pipe a grandchild still holds): only execd's own silence then counts.

    Raises:
        SandboxUnavailable: execd stopped answering (gone, or 3 probes unanswered).
        ExecLost: another execd answers for the sandbox, or the reply was lost.
        SandpodError: whatever ``work`` raises.
    """
    task = asyncio.ensure_future(work)
    missed = exited = 0
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=interval)
            if done:
                return task.result()
            try:
                status = await probe()
            except SandboxNotFound as exc:
                raise SandboxUnavailable(f"execd stopped answering during {what}") from exc
            except ExecNotFound as exc:
                raise ExecLost(f"execd no longer knows {what}; it was restarted") from exc
            except RequestTimeout as exc:
                missed += 1
                if missed >= MAX_MISSED:
                    raise SandboxUnavailable(
                        f"execd did not answer {MAX_MISSED} liveness probes during {what}"
                    ) from exc
                continue
            missed = 0
            if status is not None and status.state == "exited" and exit_means_lost:
                exited += 1
                if exited >= 2 and not task.done():
                    raise ExecLost(f"{what} finished but its reply never arrived")
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
