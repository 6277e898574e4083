"""Every Sandbox transition, published on the JetStream stream ``SANDPOD_EVENTS``."""

from __future__ import annotations

import time

import structlog

from sandpod_bus import Bus
from sandpod_contract.codec import encode
from sandpod_contract.errors import SandpodError
from sandpod_contract.messages.sandboxes import SandboxEvent
from sandpod_contract.subjects import Subjects

__all__ = ["STREAM", "Events"]

STREAM = "sandpod-events"
RETENTION = 7 * 24 * 3600.0

log = structlog.get_logger("sandpod.lifecycle.events")


class Events:
    def __init__(self, bus: Bus, subjects: Subjects, stream: str = STREAM) -> None:
        self._bus = bus
        self._subjects = subjects
        self.stream = stream

    async def setup(self) -> None:
        await self._bus.ensure_stream(self.stream, [self._subjects.events_all()], RETENTION)

    async def publish(
        self, *, name: str, namespace: str, type_: str, phase: str, reason: str = "",
        message: str = "", generation: int = 0,
    ) -> None:  # fmt: skip
        event = SandboxEvent(
            name=name, namespace=namespace, type=type_, phase=phase, reason=reason,
            message=message, time=time.time(), generation=generation,
        )  # fmt: skip
        subject = self._subjects.event("sandbox", name, type_)
        try:
            await self._bus.js_publish(subject, encode(event))
        except SandpodError as exc:  # an event lost is logged, never fatal to reconciling
            log.warning("event_publish_failed", subject=subject, error=exc.message)
        log.info("sandbox_event", sandbox=name, type=type_, phase=phase, reason=reason)
