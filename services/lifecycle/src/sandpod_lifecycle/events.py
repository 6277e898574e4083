"""Every Sandbox transition, published on the JetStream stream ``<prefix>-events``; also each
egress policy a runtime applied (``<prefix>.events.network.<name>.updated``) and destinations
the network enforcers refused (``...network.<name>.denied``, :meth:`Events.publish_denied`).

The stream is bounded three ways (:class:`EventLimits`, from the lifecycle's settings): total
bytes and age (the oldest events are discarded first, publishing never blocks on a full stream)
and messages per subject (one subject per sandbox and event type). The reconciler publishes
only real transitions; on top of that each object has a token bucket (``burst`` events at once,
refilled at ``rate`` per second), so a sandbox flapping for whatever reason cannot flood the
stream: past it events are dropped, counted, and logged once per run of refusals.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import structlog

from sandpod_bus import Bus
from sandpod_contract.codec import Message, encode
from sandpod_contract.errors import SandpodError
from sandpod_contract.messages.sandboxes import NetworkEvent, SandboxEvent
from sandpod_contract.subjects import Subjects

__all__ = ["SIZE_SETTING", "STREAM", "EventLimits", "Events", "RateLimiter"]

STREAM = "sandpod-events"
SIZE_SETTING = "SANDPOD_EVENTS_MAX_BYTES"  # sizes the stream (settings.py reads it)
MAX_TRACKED = 10_000  # objects whose bucket is remembered (least recently used forgotten)

log = structlog.get_logger("sandpod.lifecycle.events")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EventLimits:
    """Bounds of the event stream and of each object's event rate (see the settings table)."""

    max_bytes: int = 256 * 1024 * 1024
    max_age: float = 7 * 24 * 3600.0
    max_msgs_per_subject: int = 100
    burst: int = 20  # events one object may publish at once ...
    rate: float = 1.0  # ... refilled at this many per second

    def __post_init__(self) -> None:
        if self.max_bytes < 1024 * 1024 or self.max_age < 60 or self.max_msgs_per_subject < 1:
            raise ValueError(
                "event stream limits: max_bytes >= 1 MiB, max_age >= 60 s, "
                "max_msgs_per_subject >= 1"
            )
        if self.burst < 1 or self.rate <= 0:
            raise ValueError("event rate limits: burst >= 1 and rate > 0")


class RateLimiter:
    """A token bucket per key, ``MAX_TRACKED`` keys at most; ``clock`` is injectable."""

    def __init__(
        self, burst: int, rate: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._burst = float(burst)
        self._rate = rate
        self._clock = clock
        # key -> (tokens, when, dropped since the last allowed one)
        self._buckets: collections.OrderedDict[str, tuple[float, float, int]] = (
            collections.OrderedDict()
        )
        self.dropped = 0  # in all, for metrics and tests

    def allow(self, key: str) -> tuple[bool, int]:
        """(whether ``key`` may go now, how many of its calls were refused in a row)."""
        now = self._clock()
        tokens, when, refused = self._buckets.pop(key, (self._burst, now, 0))
        tokens = min(self._burst, tokens + max(now - when, 0.0) * self._rate)
        allowed = tokens >= 1.0
        refused = 0 if allowed else refused + 1
        self._buckets[key] = (tokens - 1.0 if allowed else tokens, now, refused)
        while len(self._buckets) > MAX_TRACKED:
            self._buckets.popitem(last=False)
        self.dropped += 0 if allowed else 1
        return allowed, refused


class Events:
    def __init__(
        self,
        bus: Bus,
        subjects: Subjects,
        stream: str = STREAM,
        limits: EventLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._bus = bus
        self._subjects = subjects
        self.stream = stream
        self.limits = limits or EventLimits()
        self._limiter = RateLimiter(self.limits.burst, self.limits.rate, clock)

    async def setup(self) -> None:
        """Create (or update) the stream, reserving ``limits.max_bytes`` of JetStream.

        Raises:
            InsufficientStorage: JetStream cannot reserve that much; the message names the
                stream, the sizes and the remedies (:data:`SIZE_SETTING` among them).
            StoreError: JetStream failed otherwise.
        """
        await self._bus.ensure_stream(
            self.stream,
            [self._subjects.events_all()],
            self.limits.max_age,
            max_bytes=self.limits.max_bytes,
            max_msgs_per_subject=self.limits.max_msgs_per_subject,
            size_setting=SIZE_SETTING,
        )

    def _allowed(self, name: str, namespace: str, type_: str) -> bool:
        allowed, refused = self._limiter.allow(f"{namespace}/{name}")
        if not allowed and refused == 1:  # once per run of refusals: the log is bounded too
            log.warning(
                "sandbox_events_rate_limited",
                sandbox=name,
                namespace=namespace,
                type=type_,
                burst=self.limits.burst,
                rate=self.limits.rate,
            )
        return allowed

    async def _send(self, subject: str, event: Message) -> None:
        try:
            await self._bus.js_publish(subject, encode(event))
        except SandpodError as exc:  # an event lost is logged, never fatal to reconciling
            log.warning("event_publish_failed", subject=subject, error=exc.message)

    async def publish_volume(
        self, *, name: str, namespace: str, type_: str, phase: str, sandbox: str = "", how: str = ""
    ) -> None:
        """``volume.<type_>`` of SandboxVolume ``name`` (``sandbox``: who claimed or released
        it; ``how``: read-only or read-write)."""
        if not self._allowed(f"{name}#volume", namespace, f"volume.{type_}"):
            return
        event = SandboxEvent(
            name=name,
            namespace=namespace,
            type=type_,
            phase=phase,
            reason=sandbox,
            message=how,
            time=time.time(),
        )
        await self._send(self._subjects.event("volume", name, type_), event)

    async def publish_network(
        self,
        *,
        name: str,
        namespace: str,
        type_: str,
        generation: int,
        policy: dict[str, Any],
        enforced: bool,
        reason: str,
    ) -> None:
        """``network.<type_>`` of sandbox ``name`` (``updated``: the runtime applied ``policy``)."""
        if not self._allowed(name, namespace, f"network.{type_}"):
            return
        event = NetworkEvent(
            name=name,
            namespace=namespace,
            type=type_,
            time=time.time(),
            generation=generation,
            policy=policy,
            enforced=enforced,
            reason=reason,
        )
        await self._send(self._subjects.event("network", name, type_), event)
        log.info("network_event", sandbox=name, type=type_, enforced=enforced, reason=reason)

    async def publish_denied(
        self,
        *,
        name: str,
        kind: str,
        destination: str,
        rule: str,
        port: int | None = None,
        count: int = 1,
        namespace: str = "",
    ) -> bool:
        """``network.denied``: an enforcer (``kind``: dns, rebinding, connect or sni) refused
        ``destination`` by ``rule``. Denials have a token bucket of their own per sandbox (a
        sandbox hammering a blocked address never silences its lifecycle events). Returns
        whether it went out: a caller that was refused adds ``count`` to its next one.
        ``namespace`` may be unknown to an enforcer (it knows sandbox ids, which are unique
        across namespaces): empty then."""
        if not self._allowed(f"{name}#denied", namespace, "network.denied"):
            return False
        event = NetworkEvent(
            name=name,
            namespace=namespace,
            type="denied",
            time=time.time(),
            kind=kind,
            destination=destination,
            port=port,
            rule=rule,
            count=count,
        )
        await self._send(self._subjects.event("network", name, "denied"), event)
        return True

    async def publish(
        self,
        *,
        name: str,
        namespace: str,
        type_: str,
        phase: str,
        reason: str = "",
        message: str = "",
        generation: int = 0,
    ) -> None:
        if not self._allowed(name, namespace, type_):
            return
        event = SandboxEvent(
            name=name,
            namespace=namespace,
            type=type_,
            phase=phase,
            reason=reason,
            message=message,
            time=time.time(),
            generation=generation,
        )
        await self._send(self._subjects.event("sandbox", name, type_), event)
        log.info("sandbox_event", sandbox=name, type=type_, phase=phase, reason=reason)
