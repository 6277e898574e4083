"""Keep every SandboxWarmPool at ``replicas`` ready, free members: the pool state machine.

One pass over one pool (under its lease, so one replica at a time acts on it):

    pool deleted               -> delete its free members                 (claimed ones stay)
    template missing           -> Ready=False/TemplateNotFound, nothing created
    member failed / stuck      -> delete it; count the failure; back off   (ReplicaFailure=True)
    stale members              -> per updateStrategy: Recreate deletes them now; RollingUpdate
                                  deletes one per fresh ready member beyond replicas (a bounded
                                  surge); OnClaim keeps them
    more free than replicas    -> delete the extra (stale, then unready, then newest)
    fewer than replicas        -> create the difference, at most ``create_rate`` per second, one
                                  at a time while members keep failing (no create/delete storm)
    status                     -> replicas / ready / available, selector, conditions (written
                                  only when changed)

Counting never over-creates: a member is in the mirror the moment its create returns
(:meth:`Mirror.observe` of the store's reply), before any watch event, and a replica that takes
over a pool starts from the store's full list.
"""

from __future__ import annotations

import dataclasses

import structlog

from sandpod_contract.errors import ResourceConflict, ResourceNotFound, SandpodError
from sandpod_contract.pooling import (
    HASH_LABEL,
    POOL_LABEL,
    PoolConditionType,
    PoolReason,
    UpdateStrategy,
    WarmPoolSpec,
    WarmPoolStatus,
)
from sandpod_contract.resources import Condition, SandboxTemplateSpec
from sandpod_pool.cache import Mirror
from sandpod_pool.members import (
    POOL_KIND,
    TEMPLATE,
    MemberState,
    age,
    failure_message,
    free_selector,
    is_member,
    member_object,
    member_state,
    owner_pool,
    request_delete,
    template_hash,
)
from sandpod_service.clock import REAL, Clock
from sandpod_service.leases import LeaseKeeper
from sandpod_store import Resource, Store, set_condition
from sandpod_store.views import built_template

__all__ = ["PoolReconciler"]

log = structlog.get_logger("sandpod.pool.pools")

MAX_BACKOFF = 60.0
FREE = (MemberState.READY, MemberState.STARTING, MemberState.FAILED)


def backoff(failures: int) -> float:
    """Seconds before creating again after ``failures`` failing passes in a row (2, 4 ... 60)."""
    return min(2.0 ** max(failures, 0), MAX_BACKOFF)


@dataclasses.dataclass
class _PoolState:
    """What one replica remembers about a pool between passes (rebuilt after failover).
    Times are the clock's monotonic reading."""

    refilled: float  # when the token bucket was last refilled
    tokens: float = 0.0  # create rate limit (token bucket)
    failures: int = 0
    last_failure: str = ""
    next_create: float = 0.0  # backoff after failures


class PoolReconciler:
    def __init__(
        self,
        *,
        store: Store,
        leases: LeaseKeeper,
        pools: Mirror,
        sandboxes: Mirror,
        templates: Mirror,
        create_rate: float,
        member_grace: float,
        clock: Clock = REAL,
    ) -> None:
        self.store = store
        self.leases = leases
        self.pools = pools
        self.sandboxes = sandboxes
        self.templates = templates
        self.create_rate = create_rate
        self.member_grace = member_grace
        self.clock = clock
        self._state: dict[str, _PoolState] = {}
        self.created = 0  # members created by this replica (tests, metrics)

    async def reconcile(self, key: str) -> float | None:
        """One pass over pool ``namespace/name``; seconds until it is due again (None: on
        change only)."""
        namespace, _, name = key.partition("/")
        lease = f"{POOL_KIND}.{namespace}.{name}"
        if not await self.leases.acquire(lease):
            return None  # another replica has it; the resync asks again
        pool = self.pools.get(namespace, name)
        # Ours by ownership (the pool service's owner reference), never by labels alone: a
        # Sandbox someone else labelled for this pool is not counted, bound or deleted here.
        owned = [
            m
            for m in self.sandboxes.values()
            if m.metadata.namespace == namespace
            and m.metadata.labels.get(POOL_LABEL) == name
            and owner_pool(m, name) is not None
        ]
        members = [m for m in owned if pool is not None and is_member(m, pool)]
        for m in owned:  # owned by a deleted pool of this name (or by an earlier one)
            if m not in members and member_state(m) in FREE:
                await self._delete(m, "pool deleted")
        if pool is None:
            self._state.pop(key, None)
            await self.leases.release(lease)
            return None
        try:
            return await self._step(key, pool, members)
        except ResourceConflict:
            return 0.05  # someone wrote meanwhile: read the mirror again shortly

    async def _template(self, namespace: str, name: str | None) -> SandboxTemplateSpec | None:
        if name is None:
            return SandboxTemplateSpec()
        try:
            template = built_template(await self.store.get(TEMPLATE, namespace, name))
        except ResourceNotFound:
            return None
        if template.build is not None and not template.build.result:
            return None  # being built (or failed): members wait for a result to run on
        return template

    async def _step(self, key: str, pool: Resource, members: list[Resource]) -> float | None:
        spec = WarmPoolSpec.from_dict(pool.spec)
        namespace = pool.metadata.namespace
        state = self._state.get(key)
        if state is None:
            state = _PoolState(refilled=self.clock.monotonic(), tokens=self.create_rate)
            self._state[key] = state
        template = await self._template(namespace, spec.template_ref)
        if template is None:
            await self._status(pool, spec, members, "", template_missing=True, state=state)
            return 5.0
        digest = template_hash(spec, template)
        free = [m for m in members if member_state(m) in FREE]
        now = self.clock.now()
        failed = [
            m
            for m in free
            if member_state(m) is MemberState.FAILED
            or (member_state(m) is MemberState.STARTING and age(m, now) > self.member_grace)
        ]
        if failed:  # one step of backoff per pass, however many failed together
            state.failures += 1
            state.last_failure = failure_message(failed[0])
            state.next_create = self.clock.monotonic() + backoff(state.failures)
        for m in failed:
            log.warning(
                "pool_member_failed",
                pool=key,
                member=m.metadata.name,
                failures=state.failures,
                reason=state.last_failure,
            )
            await self._delete(m, "failed")
        healthy = [m for m in free if m not in failed]
        if any(member_state(m) is MemberState.READY for m in healthy):
            state.failures = 0  # the template works: a later failure starts a fresh backoff
        current = [m for m in healthy if m.metadata.labels.get(HASH_LABEL) == digest]
        stale = [m for m in healthy if m.metadata.labels.get(HASH_LABEL) != digest]
        stale = await self._roll(spec, current, stale)
        # Scale down: the extra free members go (stale first, then unready, then newest).
        extra = len(current) + len(stale) - spec.replicas
        if spec.update_strategy is UpdateStrategy.ROLLING_UPDATE and stale:
            extra = len(current) - spec.replicas  # stale ones leave through _roll
        if extra > 0:
            order = sorted(current, key=_removal_order)
            for m in (stale + order)[:extra]:
                await self._delete(m, "scale down")
                if m in stale:
                    stale.remove(m)
                else:
                    current.remove(m)
        due = await self._fill(key, spec, pool, template, digest, current, stale, state)
        await self._status(pool, spec, current + stale, digest, state=state)
        return due

    async def _roll(
        self, spec: WarmPoolSpec, current: list[Resource], stale: list[Resource]
    ) -> list[Resource]:
        """Apply the update strategy to stale members; the stale ones that stay."""
        if not stale or spec.update_strategy is UpdateStrategy.ON_CLAIM:
            return stale
        if spec.update_strategy is UpdateStrategy.RECREATE:
            for m in stale:
                await self._delete(m, "template changed (Recreate)")
            return []
        ready_current = sum(member_state(m) is MemberState.READY for m in current)
        surplus = ready_current + len(stale) - spec.replicas  # RollingUpdate
        if surplus <= 0:
            return stale
        ordered = sorted(stale, key=_removal_order)
        for m in ordered[:surplus]:
            await self._delete(m, "template changed (RollingUpdate)")
        return ordered[surplus:]

    async def _fill(  # noqa: PLR0917 - one pool's whole picture
        self,
        key: str,
        spec: WarmPoolSpec,
        pool: Resource,
        template: SandboxTemplateSpec,
        digest: str,
        current: list[Resource],
        stale: list[Resource],
        state: _PoolState,
    ) -> float | None:
        """Create what is missing within the rate and backoff limits; when to look again."""
        if spec.update_strategy is UpdateStrategy.ROLLING_UPDATE and stale:
            surge = max(1, spec.replicas // 4)
            want = min(
                spec.replicas - len(current), spec.replicas + surge - len(current) - len(stale)
            )
        else:
            want = spec.replicas - len(current) - len(stale)
        if want <= 0:
            return None
        t = self.clock.monotonic()
        if t < state.next_create:
            return state.next_create - t
        if state.failures:
            starting = sum(member_state(m) is MemberState.STARTING for m in current)
            want = min(want, 1 - starting)  # probe with one member until one works
            if want <= 0:
                return 1.0
        state.tokens = min(self.create_rate, state.tokens + (t - state.refilled) * self.create_rate)
        state.refilled = t
        n = min(want, int(state.tokens))
        for _ in range(n):
            obj = member_object(pool, spec, template, digest, self.clock.now())
            try:
                created = await self.store.create(obj)
            except SandpodError as exc:
                log.warning("pool_member_create_failed", pool=key, error=exc.message)
                return 1.0
            state.tokens -= 1
            self.created += 1
            self.sandboxes.observe(created)  # counted now, before any watch event
            current.append(created)
        log.info("pool_members_created", pool=key, count=n, want=want)
        return None if n >= want else 1.0 / self.create_rate

    async def _delete(self, member: Resource, why: str) -> None:
        """Mark a member for deletion, unless a claim took it meanwhile (no longer ours)."""
        if await request_delete(self.store, self.sandboxes, member, unless=_claimed):
            log.info("pool_member_deleted", member=member.metadata.name, why=why)

    async def _status(
        self,
        pool: Resource,
        spec: WarmPoolSpec,
        free: list[Resource],
        digest: str,
        *,
        state: _PoolState,
        template_missing: bool = False,
    ) -> None:
        name = pool.metadata.name
        ready = [m for m in free if member_state(m) is MemberState.READY]
        available = [m for m in ready if m.metadata.labels.get(HASH_LABEL) == digest]
        old = WarmPoolStatus.from_dict(pool.status)
        if template_missing:
            reason = PoolReason.TEMPLATE_NOT_FOUND
            msg = f"template {spec.template_ref!r} not found, or not built yet (its build runs)"
        elif len(available) >= spec.replicas:
            reason, msg = PoolReason.ALL_READY, ""
        elif len(available) < len(ready):
            reason, msg = PoolReason.ROLLING, "replacing members of an older template"
        elif state.failures:
            reason, msg = PoolReason.MEMBERS_FAILING, state.last_failure
        else:
            reason, msg = PoolReason.FILLING, f"{len(available)}/{spec.replicas} ready"
        ok = "True" if reason is PoolReason.ALL_READY else "False"
        now = self.clock.now()
        conds = set_condition(
            old.conditions, Condition(PoolConditionType.READY, ok, reason, msg), now
        )
        failing = (
            Condition(
                PoolConditionType.REPLICA_FAILURE,
                "True",
                PoolReason.MEMBERS_FAILING,
                state.last_failure,
            )
            if state.failures
            else Condition(PoolConditionType.REPLICA_FAILURE, "False", PoolReason.NO_FAILURES)
        )
        status = WarmPoolStatus(
            replicas=len(free),
            ready_replicas=len(ready),
            available_replicas=len(available),
            observed_generation=pool.metadata.generation,
            selector=free_selector(name),
            template_hash=digest,
            conditions=set_condition(conds, failing, now),
        )
        if pool.status and _same(status, old):
            return
        updated = dataclasses.replace(pool, status=status.to_dict())
        self.pools.observe(await self.store.update_status(updated))


def _claimed(m: Resource) -> bool:
    return member_state(m) is MemberState.CLAIMED


def _removal_order(m: Resource) -> tuple[int, str]:
    """Unready before ready, then newest first (the oldest ready members are kept)."""
    ready = member_state(m) is MemberState.READY
    return (1 if ready else 0, _neg(m.metadata.creation_timestamp))


def _neg(stamp: str) -> str:
    return "".join(chr(0x10FFFF - ord(c)) for c in stamp)


def _same(a: WarmPoolStatus, b: WarmPoolStatus) -> bool:
    """Equal but for condition timestamps and order (no status write when nothing changed)."""

    def strip(s: WarmPoolStatus) -> tuple[WarmPoolStatus, frozenset[Condition]]:
        conds = frozenset(dataclasses.replace(c, last_transition_time="") for c in s.conditions)
        return dataclasses.replace(s, conditions=()), conds

    return strip(a) == strip(b)
