"""A build's progress on the bus: one :class:`SandboxEvent` per log line, then the outcome.

Both places a build runs publish through here, on the same core NATS subject
``<prefix>.events.template.<name>.<type>`` (``build`` for a line, ``built`` / ``build_failed``
at the end): the lifecycle for a local build, and the builder Pod's entry point
(``builds.podmain``) for a build in Kubernetes mode, so the SDK and the CLI follow both the
same way. A lost line is logged and never fails the build.
"""

from __future__ import annotations

import time

import structlog

from sandpod_bus import Bus
from sandpod_contract.builds import BuildPhase
from sandpod_contract.codec import encode
from sandpod_contract.errors import SandpodError
from sandpod_contract.messages.sandboxes import SandboxEvent
from sandpod_contract.subjects import Subjects

__all__ = ["publish_build_event"]

log = structlog.get_logger("sandpod.lifecycle.builds")


async def publish_build_event(  # noqa: PLR0917 - the event's fields, in order
    bus: Bus,
    subjects: Subjects,
    name: str,
    type_: str,
    phase: BuildPhase,
    reason: str,
    message: str,
) -> None:
    """Publish one event of template ``name``'s build (never raises a bus error)."""
    event = SandboxEvent(
        name=name,
        namespace="",
        type=type_,
        phase=str(phase),
        reason=reason,
        message=message,
        time=time.time(),
    )
    try:
        await bus.publish(subjects.event("template", name, type_), encode(event))
    except SandpodError as exc:
        log.warning("build_log_publish_failed", template=name, error=exc.message)
