"""Liveness watching for long requests: never hang when execd dies mid-request.

A one-shot exec is a single request/reply. If it has not answered after ``PROBE_INTERVAL`` the
client asks ``exec.status`` for the same exec id every interval. Because the probe travels the same
connection and subscription as the request, execd always sees the request first. The answers
mean: no responders -> execd is gone (``SandboxUnavailable``); ``exec.not_found`` -> a different
execd answers, ours died (``ExecLost``); "exited" twice with no reply -> the reply was lost in a
reconnect (``ExecLost``); three probe timeouts in a row -> ``SandboxUnavailable``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from sandpod_contract.errors import (
    ExecLost,
    ExecNotFound,
    RequestTimeout,
    SandboxNotFound,
    SandboxUnavailable,
)
from sandpod_contract.messages.exec import ExecStatus

__all__ = ["PROBE_INTERVAL", "watch"]

T = TypeVar("T")
PROBE_INTERVAL = 1.0
MAX_MISSED = 3


async def watch(
    work: Awaitable[T],
    probe: Callable[[], Awaitable[ExecStatus]],
    *,
    what: str,
    interval: float = PROBE_INTERVAL,
    exit_means_lost: bool = True,
) -> T:
    """Await ``work`` while probing liveness; raise a typed error as soon as it is lost.

    ``exit_means_lost=False`` for work that may outlast the exec's process legitimately (a stdin
    write into a pipe a grandchild still holds): only execd's own silence then counts.
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
            if status.state == "exited" and exit_means_lost:
                exited += 1
                if exited >= 2 and not task.done():
                    raise ExecLost(f"{what} finished but its reply never arrived")
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
