"""Handlers by subject family. Each family module exposes a class built from :class:`Deps` whose
``routes()`` maps ``(family, verb)`` to a :class:`Route`; the service joins them. Decoding is the
router's job; domain logic lives outside ``handlers``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from sandpod_contract.codec import Message
from sandpod_execd.metrics import ExecdMetrics
from sandpod_execd.settings import ExecdSettings
from sandpod_service import Supervisor

__all__ = ["Deps", "Route"]

Publish = Callable[[str, bytes], Awaitable[None]]


@dataclasses.dataclass(frozen=True, slots=True)
class Deps:
    """What every family's handlers may use."""

    settings: ExecdSettings
    metrics: ExecdMetrics
    supervisor: Supervisor  # owner of background tasks (streams, followers, watchers)
    publish: Publish  # publish raw bytes to a subject (frames to a client's deliver inbox)
    max_payload: int  # the NATS server's max payload


@dataclasses.dataclass(frozen=True, slots=True)
class Route:
    """How the router runs one verb.

    Attributes:
        handler: ``async (sbx, request, *prepared) -> reply message | None``.
        inline: run in the subscription callback (cheap verbs that must keep order with what
            came before them on the same connection); otherwise a supervised task.
        quiet: no log line on success (probes, acks).
        activity: counts as sandbox activity for idle timeouts (not probes or info).
        prepare: synchronous ``(sbx, request) -> tuple`` run in the callback before the task
            starts (e.g. register an id so a status probe right behind finds it); its tuple is
            passed to the handler after the request. Errors it raises are replied at once.
        release: undo ``prepare`` when the task could not be started.
    """

    handler: Callable[..., Awaitable[Message | None]]
    inline: bool = False
    quiet: bool = False
    activity: bool = True
    prepare: Callable[[Any, Any], tuple[Any, ...]] | None = None
    release: Callable[[Any, tuple[Any, ...]], None] | None = None
