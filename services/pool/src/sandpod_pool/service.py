"""Pool-service wiring: mirrors of pools, claims and pooled sandboxes; the pool and claim work
queues; the API in the ``sandpod-pool`` queue group.

Data flow: the three mirrors follow the store (list + watch). A change to a pool, or to a
sandbox carrying a pool label, queues that pool; a change to a claim, or to a sandbox carrying a
claim label, queues that claim. A resync queues everything every ``resync`` seconds (lease
renewal, failover, timers that a crash lost) and sweeps orphaned claimed sandboxes. Any replica
answers any request; pool passes run under per-pool leases, one replica per pool at a time.

The store is the JetStream KV bucket (``SANDPOD_STORE=kv``) or the CRDs on an API server (``kube``;
``sandpod_kube`` is imported only then). Pool leases follow the store: per pool in a NATS KV
bucket (kv), or one leader elected on the Lease ``<prefix>-pool`` for all pools (kube); a replica
that becomes leader resyncs at once, and only the leader sweeps orphans.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import structlog

from sandpod_bus import Bus, NoResponders
from sandpod_contract.codec import decode_reply, encode
from sandpod_contract.errors import InternalError, SandpodError
from sandpod_contract.messages.pools import POOL_PLANE
from sandpod_contract.messages.system import Configure, Configured
from sandpod_contract.pooling import CLAIM_LABEL, POOL_LABEL, WarmPoolSpec
from sandpod_contract.subjects import Subjects
from sandpod_kube import open_store
from sandpod_pool.api import PoolApi
from sandpod_pool.cache import Key, Mirror
from sandpod_pool.claim_recovery import ClaimRecovery
from sandpod_pool.claims import CLAIM, Claims
from sandpod_pool.members import POOL_KIND, SANDBOX, TEMPLATE
from sandpod_pool.pools import PoolReconciler
from sandpod_pool.settings import PoolSettings
from sandpod_service import Supervisor
from sandpod_service.api import ApiServer
from sandpod_service.clock import REAL, Clock
from sandpod_service.leases import LeaseKeeper, Leases
from sandpod_service.workqueue import WorkQueue
from sandpod_store import Resource

__all__ = ["PoolService"]

log = structlog.get_logger("sandpod.pool")

QUEUE_GROUP = "sandpod-pool"
CONFIGURE_TIMEOUT = 2.0


class PoolService:
    name = "pool"

    def __init__(self, settings: PoolSettings, *, clock: Clock = REAL) -> None:
        self.settings = settings
        self.clock = clock  # every time rule below reads this one (tests pass a fake)
        self.subjects = Subjects(settings.prefix)
        self.supervisor = Supervisor("pool", 512)
        self._bus: Bus | None = None
        self._api: ApiServer | None = None
        self._leases: LeaseKeeper | None = None
        self._elect: Callable[[], Coroutine[Any, Any, None]] | None = (
            None  # kube: the election loop
        )
        self._closers: list[Callable[[], Awaitable[None]]] = []
        self._resync_now = asyncio.Event()
        self.pools_queue: WorkQueue | None = None
        self.claims_queue: WorkQueue | None = None
        self.claims: Claims | None = None
        self.recovery: ClaimRecovery | None = None
        self.reconciler: PoolReconciler | None = None
        self._close_store: Callable[[], Awaitable[None]] | None = None

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        store, self._close_store = await open_store(
            bus, self.subjects.storage("resources"), self.settings.kube
        )
        self._leases = await self._lease_keeper(bus)
        pools = Mirror(store, POOL_KIND, on_change=self._pool_changed)
        claims = Mirror(store, CLAIM, on_change=self._claim_changed)
        templates = Mirror(store, TEMPLATE, on_change=self._template_changed)
        sandboxes = Mirror(
            store,
            SANDBOX,
            on_change=self._sandbox_changed,
            keep=lambda o: POOL_LABEL in o.metadata.labels or CLAIM_LABEL in o.metadata.labels,
        )
        self.reconciler = PoolReconciler(
            store=store,
            leases=self._leases,
            pools=pools,
            sandboxes=sandboxes,
            templates=templates,
            create_rate=self.settings.create_rate,
            member_grace=self.settings.member_grace,
            clock=self.clock,
        )
        self.claims = Claims(
            store=store,
            pools=pools,
            sandboxes=sandboxes,
            claims=claims,
            templates=templates,
            configure=self._configure,
            recover_after=self.settings.recover_after,
            background=self.supervisor.spawn,
            clock=self.clock,
        )
        self.pools_queue = WorkQueue(
            "pools", self.reconciler.reconcile, workers=4, clock=self.clock
        )
        self.recovery = ClaimRecovery(self.claims)
        self.claims_queue = WorkQueue(
            "claims", self.recovery.reconcile, workers=4, clock=self.clock
        )
        self._mirrors = (pools, claims, sandboxes)
        for mirror in (*self._mirrors, templates):
            self.supervisor.spawn(mirror.run(), name=f"mirror-{mirror.kind}")
        await asyncio.gather(*(m.synced.wait() for m in (*self._mirrors, templates)))
        self.supervisor.spawn(self.pools_queue.run(), name="pools")
        self.supervisor.spawn(self.claims_queue.run(), name="claims")
        self.supervisor.spawn(self._resync(), name="resync")
        if self._elect is not None:
            self.supervisor.spawn(self._elect(), name="leader-election")
        api = PoolApi(
            store,
            pools,
            self.claims,
            claim_wait=self.settings.claim_wait,
            on_pool_change=lambda ns, name: self._pool_changed((ns, name), None),
        )
        self._api = ApiServer(
            bus,
            self.subjects,
            queue=QUEUE_GROUP,
            operations=POOL_PLANE,
            routes=api.routes(),
            supervisor=self.supervisor,
        )
        await self._api.start()
        log.info("pool_ready", replica=self.settings.replica_id)

    async def _lease_keeper(self, bus: Bus) -> LeaseKeeper:
        """KV leases per pool (kv store), or leader election on a Lease (kube store)."""
        kube = self.settings.kube
        if kube is None:
            return await Leases.open(
                bus,
                self.settings.replica_id,
                self.settings.lease_ttl,
                bucket=self.subjects.storage("leases"),
                clock=self.clock,
            )
        from sandpod_kube import elect

        leases, self._elect, close = elect(
            kube,
            self.settings.leader,
            prefix=self.settings.prefix,
            service="pool",
            identity=self.settings.replica_id,
            on_change=self._leadership,
        )
        self._closers.append(close)
        return leases

    def _leadership(self, leading: bool) -> None:
        """Won: queue every pool and claim now. Lost: acquire() refuses every pool at once."""
        log.info("leadership_changed", leading=leading, replica=self.settings.replica_id)
        if leading:
            self._resync_now.set()

    async def stop(self, grace: float) -> None:
        if self._api is not None:
            await self._api.stop()
        await self.supervisor.close(min(grace, 1.0))
        if self._leases is not None:
            await self._leases.release_all()
        for close in reversed(self._closers):
            await close()
        self._closers.clear()
        if self._close_store is not None:
            await self._close_store()
            self._close_store = None

    # -- change routing ------------------------------------------------------------------------

    def _pool_changed(self, key: Key, _: Resource | None) -> None:
        if self.pools_queue is not None:
            self.pools_queue.add(f"{key[0]}/{key[1]}")

    def _template_changed(self, key: Key, _: Resource | None) -> None:
        """A template change may make pool members stale: look at the pools using it."""
        if self.pools_queue is None:
            return
        for pool in self._mirrors[0].values():
            if pool.metadata.namespace != key[0]:
                continue
            try:
                ref = WarmPoolSpec.from_dict(pool.spec).template_ref
            except SandpodError:
                continue  # the API validated it: a malformed one is nobody's to refill
            if ref == key[1]:
                self.pools_queue.add(f"{key[0]}/{pool.metadata.name}")

    def _claim_changed(self, key: Key, obj: Resource | None) -> None:
        if self.claims_queue is not None and obj is not None:
            self.claims_queue.add(f"{key[0]}/{key[1]}")

    def _sandbox_changed(self, key: Key, obj: Resource | None) -> None:
        if obj is None:  # gone: its pool refills, its claim notices at the next resync
            return
        pool = obj.metadata.labels.get(POOL_LABEL)
        if pool is not None and self.pools_queue is not None:
            # A member changed (claimed, ready, failed): refill a moment later, so a burst of
            # claims is one pass, and a claimant's first round trips do not compete with the
            # refill's create for the CPU.
            self.pools_queue.add_after(f"{key[0]}/{pool}", self.settings.refill_delay)
        claim = obj.metadata.labels.get(CLAIM_LABEL)
        if claim is not None and self.claims_queue is not None:
            self.claims_queue.add(f"{key[0]}/{claim}")

    async def _resync(self) -> None:
        pools, claims, sandboxes = self._mirrors
        if (
            self.pools_queue is None
            or self.claims_queue is None
            or self.recovery is None
            or self._leases is None
        ):
            raise InternalError("the pool service resyncs only once started")
        while True:
            await self.clock.wait(self._resync_now, self.settings.resync)
            self._resync_now.clear()
            try:
                await self._leases.renew_all()
                for obj in pools.values():
                    self.pools_queue.add(f"{obj.metadata.namespace}/{obj.metadata.name}")
                for obj in sandboxes.values():  # pools deleted while we were away
                    pool = obj.metadata.labels.get(POOL_LABEL)
                    if pool is not None and pools.get(obj.metadata.namespace, pool) is None:
                        self.pools_queue.add(f"{obj.metadata.namespace}/{pool}")
                for obj in claims.values():
                    self.claims_queue.add(f"{obj.metadata.namespace}/{obj.metadata.name}")
                if self._leases.active():  # a standby leaves sweeping to the leader
                    await self.recovery.orphans()
            except SandpodError as exc:
                log.warning("resync_failed", error=exc.message)

    # -- the sandbox's execd -------------------------------------------------------------------

    async def _configure(self, sandbox_id: str, env: dict[str, str], generation: int) -> bool:
        if self._bus is None:  # set by start, before any reconcile
            return False
        subject = self.subjects.sandbox(sandbox_id, "sys", "configure")
        try:
            data = await self._bus.request(
                subject, encode(Configure(env=env, generation=generation)), CONFIGURE_TIMEOUT
            )
            decode_reply(Configured, data)
        except NoResponders:  # the transport's word: here, the sandbox's execd is not up (yet)
            log.warning("configure_failed", sandbox=sandbox_id, error="no execd answers")
            return False
        except SandpodError as exc:
            log.warning("configure_failed", sandbox=sandbox_id, error=exc.message)
            return False
        return True
