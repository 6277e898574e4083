"""The one serve loop every Sandpod service runs through.

``serve(service)``: configure logging, connect the bus, ``service.start(bus)``, then on
SIGTERM/SIGINT: ``service.stop(grace)`` (stop intake, finish in-flight work up to the grace
period, cancel stragglers with a log line), drain NATS, return 0.

A start that cannot succeed exits 2 with one log line instead of a traceback: NATS unreachable
(``nats_unreachable``), or a typed error from ``start`` (``service_start_failed`` with its code,
message and details, e.g. ``store.insufficient_storage`` when JetStream has no room for a
stream); whatever had started is stopped first. Any other exception is a bug and keeps its
traceback.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Protocol

import structlog

from sandpod_bus import Bus, BusSettings
from sandpod_contract.errors import ConnectionLost, SandpodError
from sandpod_service.logs import configure_logging

__all__ = ["Service", "serve"]

log = structlog.get_logger("sandpod.serve")


class Service(Protocol):
    """What ``serve()`` needs from a service."""

    name: str

    async def start(self, bus: Bus) -> None:
        """Subscribe and start background work; return once serving."""

    async def stop(self, grace: float) -> None:
        """Stop intake, finish in-flight work within ``grace`` seconds, cancel the rest."""


async def serve(
    service: Service,
    bus_settings: BusSettings,
    *,
    grace: float = 10.0,
    log_level: str = "info",
    ready: asyncio.Event | None = None,
    stop: asyncio.Event | None = None,
) -> int:
    """Run ``service`` until SIGTERM/SIGINT (or ``stop`` is set); return the exit code."""
    configure_logging(service.name, log_level)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        try:
            bus = await Bus.connect(bus_settings)
        except ConnectionLost as exc:
            log.error("nats_unreachable", url=bus_settings.url, error=exc.message)
            return 2
        try:
            await service.start(bus)
        except SandpodError as exc:  # typed: its message says what is wrong and what to do
            await _abandon_start(service, bus, exc, grace)
            return 2
        log.info("service_started", nats=bus_settings.url)
        if ready is not None:
            ready.set()
        await stop.wait()
        log.info("service_stopping", grace=grace)
        try:
            await service.stop(grace)
        except Exception:  # shutdown goes on: the bus must still be drained and closed
            log.exception("service_stop_failed")
        await bus.drain(timeout=grace)
        log.info("service_stopped")
        return 0
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


async def _abandon_start(service: Service, bus: Bus, exc: SandpodError, grace: float) -> None:
    """Report a start that failed with ``exc``, stop what had started, close the bus."""
    log.error("service_start_failed", code=exc.code, error=exc.message, details=exc.details)
    try:
        await service.stop(grace)
    except Exception:  # a half-started service: closing the bus is what is left to do
        log.exception("service_stop_failed")
    await bus.drain(timeout=grace)
