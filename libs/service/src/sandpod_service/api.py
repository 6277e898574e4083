"""Serving control-plane operations (``<prefix>.api.<kind>.<verb>``) in a queue group.

Every control-plane service (lifecycle, pool) has the same front: subscribe to the kinds it
serves, decode the request type of the operation the subject names, run the handler as a task
owned by the service's supervisor (bounded), and reply with the encoded result or the typed
error. One canonical log line per request.

The same operations arrive on tenant subjects too (``<prefix>.api.t.<tenant>.<kind>.<verb>``):
the handler then runs with :func:`caller_tenant` returning that tenant, taken from the subject
(which NATS permissions confine a tenant credential to), never from the request body.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import structlog

from sandpod_bus import Bus, Inbound, Subscription
from sandpod_contract.codec import Message, decode, encode, encode_error
from sandpod_contract.errors import InternalError, SandpodError, UnknownSubject
from sandpod_contract.operations import Operation
from sandpod_contract.subjects import Subjects
from sandpod_contract.tenancy import validate_tenant
from sandpod_service.tasks import Supervisor

__all__ = ["ApiServer", "Handler", "caller_tenant"]

log = structlog.get_logger("sandpod.api")

Handler = Callable[[Any], Awaitable[Message]]

_TENANT: contextvars.ContextVar[str | None] = contextvars.ContextVar("tenant", default=None)


def caller_tenant() -> str | None:
    """The tenant the current request came in for (its subject's), None on the global subjects
    (administrators and services)."""
    return _TENANT.get()


class ApiServer:
    def __init__(
        self,
        bus: Bus,
        subjects: Subjects,
        *,
        queue: str,
        operations: Iterable[Operation],
        routes: Mapping[tuple[str, str], Handler],
        supervisor: Supervisor,
    ) -> None:
        self._bus = bus
        self._subjects = subjects
        self._queue = queue
        self._ops = {(op.family, op.verb): op for op in operations}
        missing = set(self._ops) - set(routes)
        if missing:
            raise ValueError(f"operations without a handler: {sorted(missing)}")
        self._routes = dict(routes)
        self._supervisor = supervisor
        self._subs: list[Subscription] = []

    async def start(self) -> None:
        """Subscribe to each kind served (``<prefix>.api.<kind>.*``, and every tenant's
        ``<prefix>.api.t.*.<kind>.*``)."""
        for kind in sorted({family for family, _ in self._ops}):
            for subject in (self._subjects.api_kind(kind), self._subjects.api_tenant_kind(kind)):
                self._subs.append(
                    await self._bus.subscribe(subject, self._on_message, queue=self._queue)
                )

    async def stop(self) -> None:
        """Stop intake (requests in flight finish under the supervisor)."""
        for sub in self._subs:
            await sub.drain()
        self._subs.clear()

    async def _on_message(self, msg: Inbound) -> None:
        if not msg.reply:
            return
        parsed = self._subjects.parse_api(msg.subject)
        tenant: str | None = None
        if parsed is None and (scoped := self._subjects.parse_api_tenant(msg.subject)):
            tenant, parsed = scoped[0], (scoped[1], scoped[2])
            try:
                validate_tenant(tenant)
            except ValueError:
                parsed = None
        op = self._ops.get(parsed) if parsed else None
        if op is None or parsed is None:
            await self._reply(
                msg.reply, encode_error(UnknownSubject(f"no operation on {msg.subject}"))
            )
            return
        self._supervisor.spawn(
            self._handle(op, self._routes[parsed], msg, msg.reply, tenant), name="api"
        )

    async def _handle(
        self, op: Operation, handler: Handler, msg: Inbound, reply: str, tenant: str | None
    ) -> None:
        name = f"{op.family}.{op.verb}"
        started = time.perf_counter()
        _TENANT.set(tenant)  # this task's own context: it ends with the request
        try:
            payload = encode(await handler(decode(op.request, msg.data)))
            code = "ok"
        except SandpodError as exc:
            payload, code = encode_error(exc), exc.code
        except Exception as exc:
            log.exception("api_handler_failed", op=name)
            payload = encode_error(InternalError(f"{type(exc).__name__} in {name}"))
            code = "internal"
        log.info(
            "api_request",
            op=name,
            code=code,
            tenant=tenant,
            ms=round((time.perf_counter() - started) * 1000, 3),
        )
        await self._reply(reply, payload)

    async def _reply(self, subject: str, payload: bytes) -> None:
        try:
            await self._bus.publish(subject, payload)
        except SandpodError as exc:
            log.warning("reply_failed", code=exc.code)
