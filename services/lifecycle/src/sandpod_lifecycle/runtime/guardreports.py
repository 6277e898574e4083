"""The Pod runtime's refusal events: every sandbox Pod's network guard reports its refusals in
its Sandbox's report ConfigMap (``network/podguard/report.py``); this loop watches them and
publishes each as the sandbox's ``network.denied`` event, as the local runtime's enforcers do.

    sandpod_kube.guardreport.watch_reports (the installation's namespace, or all)
      --> ReportReader.seen --> Events.publish_denied (per-sandbox token bucket)
                            --> sandpod_lifecycle_network_denied_total{kind}

Only the leader publishes (``leading``): replicas all watch (so a new leader knows each
report's last batch and does not publish it again), and a watch that fails is re-opened after a
backoff, re-reading each report's latest version.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog
from prometheus_client import Counter

from sandpod_contract.errors import StoreError
from sandpod_kube import KubeSettings
from sandpod_kube.guardreport import watch_reports
from sandpod_lifecycle.events import Events
from sandpod_lifecycle.network.podguard.report import Refusal, ReportReader

__all__ = ["follow_guard_reports"]

log = structlog.get_logger("sandpod.lifecycle.runtime.guardreports")

RETRY_MIN, RETRY_MAX = 0.5, 30.0


async def follow_guard_reports(
    kube: KubeSettings,
    namespace: str | None,
    events: Events,
    denied: Counter,
    *,
    leading: Callable[[], bool] = lambda: True,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Publish the guards' refusals until cancelled (module docstring)."""

    async def publish(ns: str, sandbox: str, refusal: Refusal) -> None:
        if leading():
            await events.publish_denied(
                name=sandbox,
                kind=refusal.kind,
                destination=refusal.destination,
                rule=refusal.rule,
                count=refusal.count,
                namespace=ns,
            )

    reader = ReportReader(publish, denied)
    delay = RETRY_MIN
    while True:
        try:
            async for ns, sandbox, text in watch_reports(kube, namespace):
                await reader.seen(ns, sandbox, text)
                _cancelled_meanwhile()
                delay = RETRY_MIN
        except StoreError as exc:
            log.warning("guard_reports_watch_failed", error=exc.message, retry_in=delay)
        await sleep(delay)
        delay = min(delay * 2, RETRY_MAX)


def _cancelled_meanwhile() -> None:
    """Raise CancelledError if this task was cancelled while publishing: the NATS client can
    turn a cancellation during a JetStream publish into a publish error, which ``Events``
    logs and swallows, and the loop would go on as if never asked to stop."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
