"""execd wiring: subscriptions, routing by subject, replies, shutdown.

One wildcard subscription per served sandbox (``<prefix>.sbx.<id>.>``, queue group
``sandpod-execd``) feeds ``_on_message``, which checks size, looks the verb up in the contract's
operation catalogue, decodes the request and hands it to the family's handler. Cheap verbs run
inline (so they keep order with what came before them on the connection); the rest run as tasks
owned by one bounded :class:`~sandpod_service.Supervisor`. Every request gets exactly one reply:
the handler's message or a typed error. Nothing a client sends can stop the loop.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from prometheus_client import CollectorRegistry

from sandpod_bus import Bus, Inbound, Subscription
from sandpod_contract.catalogue import Operation, operation
from sandpod_contract.codec import Message, decode, encode, encode_error
from sandpod_contract.errors import (
    Busy,
    InternalError,
    PayloadTooLarge,
    SandboxNotFound,
    SandpodError,
    UnknownSubject,
)
from sandpod_contract.messages.exec import ExecRequest
from sandpod_contract.subjects import Subjects
from sandpod_execd.handlers.exec import ExecHandlers
from sandpod_execd.handlers.system import SystemHandlers
from sandpod_execd.metrics import ExecdMetrics
from sandpod_execd.registry import ExecRegistry
from sandpod_execd.sandbox import SandboxContext
from sandpod_execd.settings import ExecdSettings
from sandpod_service import Supervisor

__all__ = ["ExecdService"]

log = structlog.get_logger("sandpod.execd")

QUEUE_GROUP = "sandpod-execd"
INLINE = frozenset({("sys", "ping"), ("exec", "ack"), ("exec", "status"), ("exec", "signal"),
                    ("exec", "cancel")})  # fmt: skip
QUIET = frozenset({("sys", "ping"), ("exec", "ack"), ("exec", "status")})

Handler = Callable[..., Awaitable[Message | None]]


class ExecdService:
    name = "execd"

    def __init__(self, settings: ExecdSettings, registry: CollectorRegistry | None = None) -> None:
        self.settings = settings
        self.subjects = Subjects(settings.prefix)
        self.metrics = ExecdMetrics(registry or CollectorRegistry())
        self.supervisor = Supervisor("execd", settings.max_execs + 64)
        self.sandboxes = {
            sid: SandboxContext(
                sid,
                settings.workspace_for(sid),
                settings.shell,
                settings.base_env,
                ExecRegistry(settings.result_ttl, stored_budget=4 * settings.default_max_output),
            )
            for sid in settings.sandbox_ids
        }
        self._subs: list[Subscription] = []
        self._bus: Bus | None = None
        self._routes: dict[tuple[str, str], Handler] = {}
        self._exec: ExecHandlers | None = None

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        system = SystemHandlers(self.settings, bus.max_payload)
        self._exec = ex = ExecHandlers(
            self.settings, self.metrics, self.supervisor, bus.publish, bus.max_payload
        )
        self._routes = {
            ("sys", "ping"): system.ping,
            ("sys", "info"): system.info,
            ("exec", "run"): ex.run,
            ("exec", "fetch"): ex.fetch,
            ("exec", "start"): ex.start,
            ("exec", "ack"): ex.ack,
            ("exec", "stdin"): ex.stdin,
            ("exec", "signal"): ex.signal,
            ("exec", "cancel"): ex.cancel,
            ("exec", "resume"): ex.resume,
            ("exec", "status"): ex.status,
        }
        for sbx in self.sandboxes.values():
            sbx.prepare()
            sub = await bus.subscribe(
                self.subjects.sandbox_all(sbx.sandbox_id),
                self._on_message,
                queue=QUEUE_GROUP,
                pending_msgs=8192,
                pending_bytes=max(256 * 1024 * 1024, 8 * self.settings.max_request_bytes),
            )
            self._subs.append(sub)
            log.info(
                "sandbox_served",
                sandbox_id=sbx.sandbox_id,
                workspace=str(sbx.workspace),
                runtime="process",
                isolation="none",
            )

    async def stop(self, grace: float) -> None:
        for sub in self._subs:
            await sub.drain()
        await self.supervisor.close(grace)

    # -- routing -------------------------------------------------------------------------------

    async def _on_message(self, msg: Inbound) -> None:
        parsed = self.subjects.parse_sandbox(msg.subject)
        sbx = self.sandboxes.get(parsed.sandbox_id) if parsed else None
        if parsed is None or sbx is None:
            await self._reject(msg, SandboxNotFound(f"{msg.subject} is not served here"), "route")
            return
        op = operation(parsed.family, parsed.verb)
        if op is None:
            unknown = UnknownSubject(
                f"no operation {parsed.family}.{parsed.verb}; see schemas/README.md",
                subject=msg.subject,
            )
            await self._reject(msg, unknown, "unknown_subject")
            return
        if len(msg.data) > self.settings.max_request_bytes:
            too_large = PayloadTooLarge(
                f"request of {len(msg.data)} bytes exceeds {self.settings.max_request_bytes}; "
                "stream large stdin with exec.start + exec.stdin",
                size=len(msg.data),
                limit=self.settings.max_request_bytes,
            )
            await self._reject(msg, too_large, "too_large")
            return
        try:
            req = decode(op.request, msg.data)
        except SandpodError as exc:
            await self._reject(msg, exc, "malformed")
            return
        key = (op.family, op.verb)
        if key in INLINE:
            await self._handle(op, sbx, req, msg.reply, time.monotonic())
            return
        args: tuple[Any, ...] = (req,)
        if key == ("exec", "run"):
            assert self._exec is not None
            assert isinstance(req, ExecRequest)
            try:
                args = (req, self._exec.register_run(sbx, req))
            except SandpodError as exc:
                await self._reject(msg, exc, "busy")
                return
        started = time.monotonic()
        coro = self._handle(op, sbx, args, msg.reply, started)
        if not self.supervisor.try_spawn(coro, f"{op.family}.{op.verb}"):
            if key == ("exec", "run"):
                sbx.registry.finished(args[1])
            await self._reject(msg, Busy("execd is at its request limit; retry"), "busy")

    async def _handle(
        self,
        op: Operation,
        sbx: SandboxContext,
        args: Any,
        reply: str | None,
        started: float,
    ) -> None:
        handler = self._routes[(op.family, op.verb)]
        call_args = args if isinstance(args, tuple) else (args,)
        code = "ok"
        try:
            result = await handler(sbx, *call_args)
            payload = encode(result) if result is not None else None
        except SandpodError as exc:
            code = exc.code
            payload = encode_error(exc)
        except Exception as exc:
            log.exception("handler_failed", op=f"{op.family}.{op.verb}")
            code = InternalError.code
            payload = encode_error(InternalError(f"{type(exc).__name__} in {op.family}.{op.verb}"))
        self.metrics.requests.labels(f"{op.family}.{op.verb}", code).inc()
        if (op.family, op.verb) not in QUIET or code != "ok":
            log.info(
                "request_handled",
                op=f"{op.family}.{op.verb}",
                sandbox_id=sbx.sandbox_id,
                code=code,
                ms=round((time.monotonic() - started) * 1000, 2),
            )
        if reply and payload is not None:
            await self._respond(reply, payload)

    async def _reject(self, msg: Inbound, err: SandpodError, reason: str) -> None:
        self.metrics.rejected.labels(reason).inc()
        log.info("request_rejected", subject=msg.subject, code=err.code, reason=reason)
        if msg.reply:
            await self._respond(msg.reply, encode_error(err))

    async def _respond(self, reply: str, payload: bytes) -> None:
        assert self._bus is not None
        try:
            await self._bus.publish(reply, payload)
        except PayloadTooLarge:
            await self._bus.publish(reply, encode_error(InternalError("reply too large")))
        except SandpodError as exc:
            log.warning("reply_failed", code=exc.code)
