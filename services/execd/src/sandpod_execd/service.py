"""execd wiring: subscriptions, routing by subject, replies, shutdown.

One wildcard subscription per served sandbox (``<prefix>.sbx.<id>.>``, queue group
``sandpod-execd``) feeds ``_on_message``, which checks size, looks the verb up in the contract's
operation catalogue, decodes the request and hands it to the family's :class:`Route`. Inline
routes run in the callback (so they keep order with what came before them on the connection);
the rest run as tasks owned by one bounded :class:`~sandpod_service.Supervisor`. Every request
gets exactly one reply: the handler's message or a typed error. Nothing a client sends can stop
the loop.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

import structlog
from prometheus_client import CollectorRegistry

from sandpod_bus import Bus, Inbound, Subscription
from sandpod_contract.catalogue import operation
from sandpod_contract.codec import Message, decode, encode, encode_error
from sandpod_contract.errors import (
    BadRequest,
    Busy,
    InternalError,
    PayloadTooLarge,
    SandboxNotFound,
    SandboxPaused,
    SandpodError,
    UnknownSubject,
)
from sandpod_contract.messages.node import NodeSandboxes, Release, Serve
from sandpod_contract.subjects import Subjects, validate_sandbox_id
from sandpod_execd.freezer import STARTS
from sandpod_execd.handlers import Deps, Route
from sandpod_execd.handlers.exec import ExecHandlers
from sandpod_execd.handlers.fs import FsHandlers
from sandpod_execd.handlers.git import GitHandlers
from sandpod_execd.handlers.proc import ProcHandlers
from sandpod_execd.handlers.pty import PtyHandlers
from sandpod_execd.handlers.session import SessionHandlers
from sandpod_execd.handlers.system import SystemHandlers
from sandpod_execd.handlers.watch import WatchHandlers
from sandpod_execd.jailfile import load_trusted
from sandpod_execd.metrics import ExecdMetrics
from sandpod_execd.oneshot import run_to_completion
from sandpod_execd.process import spawn
from sandpod_execd.registry import ExecRegistry
from sandpod_execd.sandbox import SandboxContext
from sandpod_execd.settings import ExecdSettings
from sandpod_execd.sysmetrics import kill_marked
from sandpod_service import Supervisor

__all__ = ["ExecdService"]

MAX_DRAIN = 60.0  # seconds a release may wait for running commands, whatever it asks

log = structlog.get_logger("sandpod.execd")
WARM_UP_TIMEOUT = 5.0  # seconds for the throwaway command that warms a new jail

QUEUE_GROUP = "sandpod-execd"
FAMILY_HANDLERS = (
    SystemHandlers,
    ExecHandlers,
    FsHandlers,
    ProcHandlers,
    SessionHandlers,
    PtyHandlers,
    WatchHandlers,
    GitHandlers,
)


class FamilyHandlers(Protocol):
    def routes(self) -> dict[tuple[str, str], Route]: ...

    async def close(self) -> None: ...


class ExecdService:
    name = "execd"

    def __init__(self, settings: ExecdSettings, registry: CollectorRegistry | None = None) -> None:
        self.settings = settings
        self.subjects = Subjects(settings.prefix)
        self.metrics = ExecdMetrics(registry or CollectorRegistry())
        self.supervisor = Supervisor("execd", settings.max_execs + 64)
        self.sandboxes = {
            sid: self._context(sid, settings.jail_file(sid)) for sid in settings.sandbox_ids
        }
        self._subs: dict[str, Subscription] = {}
        self._node_sub: Subscription | None = None
        self._bus: Bus | None = None
        self._families: list[FamilyHandlers] = []
        self._routes: dict[tuple[str, str], Route] = {}

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        deps = Deps(self.settings, self.metrics, self.supervisor, bus.publish, bus.max_payload)
        self._families = [cls(deps) for cls in FAMILY_HANDLERS]
        for family in self._families:
            self._routes.update(family.routes())
        for sbx in self.sandboxes.values():
            await self._serve(sbx)
        if self.settings.node:
            self._node_sub = await bus.subscribe(
                self.subjects.node_all(self.settings.node, "execd"), self._on_node
            )
            log.info("node_serving", node=self.settings.node)

    def _context(self, sid: str, jail: Path | None) -> SandboxContext:
        settings = self.settings
        return SandboxContext(
            sid,
            settings.workspace_for(sid),
            settings.shell,
            settings.base_env,
            ExecRegistry(settings.result_ttl, stored_budget=4 * settings.default_max_output),
            jail=load_trusted(jail, sid) if jail else None,
            sole=settings.node is None and len(settings.sandbox_ids) == 1,
            freezer=settings.freezer,
        )

    def _started(self) -> Bus:
        """The bus; set by ``start`` before anything is served or answered."""
        if self._bus is None:
            raise InternalError("execd is not started: no bus to use yet")
        return self._bus

    async def _serve(self, sbx: SandboxContext) -> None:
        bus = self._started()
        sbx.prepare()
        self._subs[sbx.sandbox_id] = await bus.subscribe(
            self.subjects.sandbox_all(sbx.sandbox_id),
            self._on_message,
            queue=QUEUE_GROUP,
            pending_msgs=8192,
            pending_bytes=max(256 * 1024 * 1024, 8 * self.settings.max_request_bytes),
        )
        log.info(
            "sandbox_served",
            sandbox_id=sbx.sandbox_id,
            workspace=str(sbx.workspace),
            runtime="local" if sbx.jail else "process",
            isolation="jail" if sbx.jail else "none",
        )

    async def _release(self, sandbox_id: str, drain: float = 0.0) -> None:
        """Stop serving ``sandbox_id``: unsubscribe, let its running one-shot commands finish
        for up to ``drain`` seconds (their callers get their answers), then kill everything
        it started.

        The unsubscribe drains: requests the server routed here before it saw the unsubscribe
        (on their way, or queued in the subscription) are handled, not dropped -- a dropped
        request's caller would wait its whole timeout, while one sent later finds no responder
        at once (and wakes a hibernating sandbox)."""
        sub = self._subs.pop(sandbox_id, None)
        if sub is not None:
            await sub.drain()
        sbx = self.sandboxes.get(sandbox_id)
        if sbx is not None and drain > 0:
            await sbx.registry.drained(min(drain, MAX_DRAIN))
        sbx = self.sandboxes.pop(sandbox_id, None)
        if sbx is None:
            return
        for stream in list(sbx.registry.streams.values()):
            stream.cancel()
        for proc in list(sbx.registry.oneshots.values()):
            if proc is not None:
                proc.kill_tree()
        kill_marked(sandbox_id, sbx.env_workspace)
        log.info("sandbox_released", sandbox_id=sandbox_id)

    async def _drain_release(self, msg: Inbound, release: Release) -> None:
        await self._release(release.sandbox_id, release.drain)
        if msg.reply:
            payload = encode(NodeSandboxes(sandbox_ids=tuple(sorted(self.sandboxes))))
            await self._respond(msg.reply, payload)

    async def _on_node(self, msg: Inbound) -> None:
        """``serve`` / ``release`` / ``list`` from the lifecycle service of this node.

        ``serve`` runs the sandbox in the jail this execd's own configuration names for its id
        (``SANDPOD_EXECD_JAIL``), never in one a request names: on a node configured for jails,
        a sandbox without a trusted jail file is refused (``sandbox.jail_refused``)."""
        verb = msg.subject.rsplit(".", 1)[-1]
        try:
            if verb == "serve":
                req = decode(Serve, msg.data)
                validate_sandbox_id(req.sandbox_id)
                if req.sandbox_id not in self.sandboxes:
                    sbx = self._context(req.sandbox_id, self.settings.jail_file(req.sandbox_id))
                    self.sandboxes[req.sandbox_id] = sbx
                    await self._serve(sbx)
                    # after the reply, not before: a create is Ready without waiting for it
                    self.supervisor.try_spawn(_warm_up(sbx), "warm-up")
            elif verb == "release":
                release = decode(Release, msg.data)
                if release.drain > 0 and self.supervisor.try_spawn(
                    self._drain_release(msg, release), "node-release"
                ):
                    return  # answered once drained: other node requests go on meanwhile
                await self._release(release.sandbox_id)
            elif verb != "list":
                raise UnknownSubject(f"no node operation {verb}")
            payload = encode(NodeSandboxes(sandbox_ids=tuple(sorted(self.sandboxes))))
        except SandpodError as exc:
            payload = encode_error(exc)
        except (ValueError, OSError) as exc:  # a bad id or an unreadable jail file
            payload = encode_error(BadRequest(f"cannot serve: {exc}"))
        if msg.reply:
            await self._respond(msg.reply, payload)

    async def stop(self, grace: float) -> None:
        if self._node_sub is not None:
            await self._node_sub.stop()
        for sub in self._subs.values():
            await sub.drain()
        for family in self._families:
            await family.close()
        for sbx in self.sandboxes.values():  # never leave a process frozen behind us
            await sbx.freezer.thaw()
        await self.supervisor.close(grace)

    # -- routing -------------------------------------------------------------------------------

    async def _on_message(self, msg: Inbound) -> None:
        parsed = self.subjects.parse_sandbox(msg.subject)
        sbx = self.sandboxes.get(parsed.sandbox_id) if parsed else None
        if parsed is None or sbx is None:
            await self._reject(msg, *self._unroutable(msg.subject))
            return
        op = operation(parsed.family, parsed.verb)
        route = self._routes.get((parsed.family, parsed.verb))
        if op is None or route is None:
            unknown = UnknownSubject(
                f"no operation {parsed.family}.{parsed.verb}; see schemas/README.md",
                subject=msg.subject,
            )
            await self._reject(msg, unknown, "unknown_subject")
            return
        if len(msg.data) > self.settings.max_request_bytes:
            too_large = PayloadTooLarge(
                f"request of {len(msg.data)} bytes exceeds {self.settings.max_request_bytes}; "
                "send it in chunks (exec.stdin, fs write chunks)",
                size=len(msg.data),
                limit=self.settings.max_request_bytes,
            )
            await self._reject(msg, too_large, "too_large")
            return
        if sbx.freezer.frozen and (op.family, op.verb) in STARTS:
            paused = SandboxPaused(
                f"sandbox {sbx.sandbox_id} is paused (its processes are frozen): resume it to "
                f"start commands",
                sandbox_id=sbx.sandbox_id,
            )
            await self._reject(msg, paused, "paused")
            return
        try:
            req = decode(op.request, msg.data)
            prepared = route.prepare(sbx, req) if route.prepare else ()
        except SandpodError as exc:  # malformed request, or refused by prepare (busy, id in use)
            await self._reject(
                msg, exc, "malformed" if exc.code.startswith("bad_request") else "refused"
            )
            return
        if route.activity:
            sbx.touch()
        name = f"{op.family}.{op.verb}"
        started = time.monotonic()
        if route.inline:
            await self._handle(name, route, sbx, (req, *prepared), reply=msg.reply, started=started)
            return
        coro = self._handle(name, route, sbx, (req, *prepared), reply=msg.reply, started=started)
        if not self.supervisor.try_spawn(coro, name):
            if route.release is not None:
                route.release(sbx, prepared)
            await self._reject(msg, Busy("execd is at its request limit; retry"), "busy")

    def _unroutable(self, subject: str) -> tuple[SandpodError, str]:
        """Why ``subject`` reaches no handler, and the metric reason: under a sandbox served here
        but not ``<family>.<verb>`` (``...exec``, ``...exec.run.extra``), the sandbox exists and
        the operation does not; anything else names a sandbox this execd does not serve."""
        if any(subject.startswith(self.subjects.sandbox_prefix(s) + ".") for s in self.sandboxes):
            unknown = UnknownSubject(
                f"{subject} names no operation; see schemas/README.md", subject=subject
            )
            return unknown, "unknown_subject"
        return SandboxNotFound(f"{subject} is not served here"), "route"

    async def _handle(
        self,
        name: str,
        route: Route,
        sbx: SandboxContext,
        args: tuple[Any, ...],
        *,
        reply: str | None,
        started: float,
    ) -> None:
        code = "ok"
        payload: bytes | None
        if route.activity:
            sbx.inflight += 1
        try:
            result: Message | None = await route.handler(sbx, *args)
            payload = encode(result) if result is not None else None
        except SandpodError as exc:
            code = exc.code
            payload = encode_error(exc)
        except Exception as exc:
            log.exception("handler_failed", op=name)
            code = InternalError.code
            payload = encode_error(InternalError(f"{type(exc).__name__} in {name}"))
        finally:
            if route.activity:
                sbx.inflight -= 1
                sbx.touch()  # the idle clock starts when the work ends, not when it began
        self.metrics.requests.labels(name, code).inc()
        if not route.quiet or code != "ok":
            log.info(
                "request_handled",
                op=name,
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
        bus = self._started()
        try:
            await bus.publish(reply, payload)
        except PayloadTooLarge:
            await bus.publish(reply, encode_error(InternalError("reply too large")))
        except SandpodError as exc:
            log.warning("reply_failed", code=exc.code)


async def _warm_up(sbx: SandboxContext) -> None:
    """Run one throwaway command in a jail once it is served, so the first real command (a
    claimant's, right after a warm-pool bind) does not pay for the cold path: the jail's
    overlay dentries, its cgroup tree and the entry helper's pages. Measured on the claim
    benchmark; a failure is only logged (the sandbox's commands report their own errors). It
    runs beside the serve reply, off a create's path to Ready (a few ms of a local create)."""
    if sbx.jail is None:
        return
    try:
        proc = spawn(sbx.command(("true",), None, None, None, stdin=False))
        await run_to_completion(
            proc, stdin=None, timeout=WARM_UP_TIMEOUT, max_output=4096, pipe_grace=0.1
        )
    except (SandpodError, OSError) as exc:
        log.warning("warm_up_failed", sandbox_id=sbx.sandbox_id, error=str(exc))
