"""Lifecycle wiring: store, leases, events, driver, reconciler and the control-plane API.

The API subscriptions (``<prefix>.api.sandboxes.*`` and ``.templates.*``, queue group
``sandpod-lifecycle``) routes by
``(kind, verb)`` through the contract's control-plane catalogue; the reconciler runs as one task
owned by the service's supervisor. Stopping leaves instances running (a restarted replica adopts
them through the driver) and releases this replica's leases so others take over at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog

from sandpod_bus import Bus, Inbound, Subscription
from sandpod_contract.codec import Message, decode, decode_reply, encode, encode_error
from sandpod_contract.errors import InternalError, SandpodError, UnknownSubject
from sandpod_contract.messages.common import Empty
from sandpod_contract.messages.node import NodeSandboxes
from sandpod_contract.messages.sandboxes import CONTROL_PLANE
from sandpod_contract.messages.system import Activity, Pong
from sandpod_contract.subjects import Subjects
from sandpod_lifecycle.api import LifecycleApi
from sandpod_lifecycle.driver import Driver, ExecdLauncher
from sandpod_lifecycle.events import Events
from sandpod_lifecycle.node import NodeLauncher
from sandpod_lifecycle.reconciler import Reconciler
from sandpod_lifecycle.runtime.local import LocalRuntime, LocalRuntimeConfig
from sandpod_lifecycle.runtime.local_driver import LocalDriver
from sandpod_lifecycle.runtime.process import ProcessDriver
from sandpod_lifecycle.settings import LifecycleSettings
from sandpod_service import Supervisor
from sandpod_service.leases import Leases
from sandpod_store import KvStore

__all__ = ["LifecycleService"]

log = structlog.get_logger("sandpod.lifecycle")

QUEUE_GROUP = "sandpod-lifecycle"
_OPS = {(op.family, op.verb): op for op in CONTROL_PLANE}


class LifecycleService:
    name = "lifecycle"

    def __init__(self, settings: LifecycleSettings) -> None:
        self.settings = settings
        self.subjects = Subjects(settings.prefix)
        self.supervisor = Supervisor("lifecycle", 256)
        self.reconciler: Reconciler | None = None
        self._subs: list[Subscription] = []
        self._leases: Leases | None = None
        self._routes: dict[tuple[str, str], Callable[[Any], Awaitable[Message]]] = {}
        self._bus: Bus | None = None
        self._node: NodeLauncher | None = None

    def _driver(self) -> Driver:
        state = self.settings.state_dir
        launcher = ExecdLauncher(state, self.settings.bus.url, self.settings.prefix)
        if self.settings.runtime == "local":
            # The whole state dir (NATS data, logs, other sandboxes) is masked in every jail.
            config = LocalRuntimeConfig(
                state_dir=state / "jails",
                cgroup_parent=f"sandpod-{self.settings.prefix.replace('.', '-')}",
                mask_paths=(Path("/root"), Path("/home"), state),
            )
            node = NodeLauncher(launcher, self.settings.node, self._node_request)
            self._node = node
            return LocalDriver(LocalRuntime(config), node)
        return ProcessDriver(launcher)

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        # Buckets and streams are named after the prefix: installations sharing a NATS stay apart.
        base = self.settings.prefix.replace(".", "-")
        store = await KvStore.open(bus, bucket=f"{base}-resources")
        events = Events(bus, self.subjects, stream=f"{base}-events")
        await events.setup()
        self._leases = await Leases.open(
            bus, self.settings.replica_id, self.settings.lease_ttl, bucket=f"{base}-leases"
        )
        api = LifecycleApi(store, events)
        self.reconciler = Reconciler(
            store=store, driver=self._driver(), leases=self._leases, events=events,
            templates=api.template, ready_probe=self._ready, idle_probe=self._idle,
            subjects=self.subjects, workers=self.settings.workers, resync=self.settings.resync,
            ready_timeout=self.settings.ready_timeout,
        )  # fmt: skip
        self._routes = {
            ("sandboxes", "create"): api.create, ("sandboxes", "get"): api.get,
            ("sandboxes", "list"): api.list, ("sandboxes", "delete"): api.delete,
            ("sandboxes", "renew"): api.renew, ("sandboxes", "pause"): api.pause,
            ("sandboxes", "resume"): api.resume, ("templates", "apply"): api.template_apply,
            ("templates", "get"): api.template_get, ("templates", "list"): api.template_list,
            ("templates", "delete"): api.template_delete,
        }  # fmt: skip
        self.supervisor.spawn(self.reconciler.run(), name="reconciler")
        # Only the kinds served here: the pool service answers pools and claims.
        self._subs = [
            await bus.subscribe(self.subjects.api_kind(kind), self._on_message, queue=QUEUE_GROUP)
            for kind in sorted({op.family for op in CONTROL_PLANE})
        ]
        log.info("lifecycle_ready", replica=self.settings.replica_id, runtime=self.settings.runtime)

    async def _node_request(self, verb: str, msg: Message) -> NodeSandboxes:
        assert self._bus is not None
        subject = self.subjects.node(self.settings.node, "execd", verb)
        return decode_reply(NodeSandboxes, await self._bus.request(subject, encode(msg), 10.0))

    async def stop(self, grace: float) -> None:
        for sub in self._subs:
            await sub.drain()
        await self.supervisor.close(0.1)  # the reconciler loops forever: cancel it
        if self.settings.destroy_on_exit and self.reconciler is not None:
            driver = self.reconciler.driver
            for sandbox_id in await driver.list():
                log.info("instance_destroyed_at_exit", sandbox=sandbox_id)
                await driver.destroy(sandbox_id)
            if self._node is not None:
                await self._node.shutdown()
        if self._leases is not None:
            await self._leases.release_all()

    # -- probes of a sandbox's execd -----------------------------------------------------------

    async def _ready(self, sandbox_id: str, timeout: float) -> bool:
        assert self._bus is not None
        subject = self.subjects.sandbox(sandbox_id, "sys", "ping")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                decode_reply(Pong, await self._bus.request(subject, encode(Empty()), 1.0))
                return True
            except SandpodError:
                await asyncio.sleep(0.02)
        return False

    async def _idle(self, sandbox_id: str) -> float | None:
        assert self._bus is not None
        subject = self.subjects.sandbox(sandbox_id, "sys", "activity")
        try:
            reply = decode_reply(Activity, await self._bus.request(subject, encode(Empty()), 2.0))
        except SandpodError:
            return None
        return max(reply.idle, 0.0)

    # -- API routing ---------------------------------------------------------------------------

    async def _on_message(self, msg: Inbound) -> None:
        if not msg.reply:
            return
        parsed = self.subjects.parse_api(msg.subject)
        op = _OPS.get(parsed) if parsed else None
        handler = self._routes.get(parsed) if parsed else None
        if op is None or handler is None:
            await self._reply(
                msg.reply, encode_error(UnknownSubject(f"no operation on {msg.subject}"))
            )
            return
        self.supervisor.spawn(
            self._handle(op.family + "." + op.verb, handler, op.request, msg), name="api"
        )

    async def _handle(self, name: str, handler: Callable[[Any], Awaitable[Message]],
                      request: type[Message], msg: Inbound) -> None:  # fmt: skip
        assert msg.reply is not None
        try:
            payload = encode(await handler(decode(request, msg.data)))
            code = "ok"
        except SandpodError as exc:
            payload, code = encode_error(exc), exc.code
        except Exception as exc:
            log.exception("api_handler_failed", op=name)
            payload, code = (
                encode_error(InternalError(f"{type(exc).__name__} in {name}")),
                "internal",
            )
        log.info("api_request", op=name, code=code)
        await self._reply(msg.reply, payload)

    async def _reply(self, subject: str, payload: bytes) -> None:
        assert self._bus is not None
        try:
            await self._bus.publish(subject, payload)
        except SandpodError as exc:
            log.warning("reply_failed", code=exc.code)
