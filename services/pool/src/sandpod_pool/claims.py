"""Binding claims to sandboxes, and keeping claims and their sandboxes consistent.

The hot path (``claims.create``), in this order so a crash anywhere leaves something the
reconciler can finish:

    1. write the SandboxClaim (Pending)                      - the claim exists before any bind
    2. bind: update a free, ready warm member from the mirror at its resourceVersion, setting
       the claim label, the claim's lifetime, idle timeout, labels and env          (atomic step)
       - a conflict means another claim (any replica, any process) took it: try the next one
       - none left: create a Sandbox for the claim instead, reason PoolExhausted (or NoPool)
    3. warm: ``sys.configure`` the claim's env (if any) straight to the sandbox's execd (its new
       commands get it); the bind's ``bound-at`` annotation starts its idle clock; cold: wait
       until the lifecycle reports it Ready
    4. write the claim's status: Bound (reason), Ready, the sandbox, its shutdownTime

Two claims can never hold one sandbox: step 2 is a compare-and-set on the sandbox object, and
the label it sets is what every later reader trusts (a ``sandpod.dev/`` label: no client can
set one). Step 2 binds only a member of the claim's own pool, same namespace, controlled by that
pool's uid (:func:`sandpod_pool.members.is_member`), and hands it over: the pool's owner
reference goes (a claimed sandbox outlives its pool), the claim label marks its new owner.
The reconciler (``reconcile``) finishes claims whose handler died (adopting a sandbox already
labelled for the claim, else binding anew), deletes claims whose sandbox is gone or whose
lifetime is over, and deletes sandboxes labelled for a claim that no longer exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import random
import secrets
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

import structlog

from sandpod_contract.errors import (
    ClaimFailed,
    ClaimTimeout,
    PoolNotFound,
    ResourceConflict,
    ResourceInvalid,
    ResourceNotFound,
    SandpodError,
)
from sandpod_contract.pooling import (
    BOUND_AT_ANNOTATION,
    CLAIM_LABEL,
    POOL_LABEL,
    ClaimConditionType,
    ClaimPhase,
    ClaimReason,
    ClaimSpec,
    ClaimStatus,
    WarmPoolSpec,
)
from sandpod_contract.resources import API_VERSION, Condition, SandboxSpec, SandboxTemplateSpec
from sandpod_contract.times import from_rfc3339, to_rfc3339
from sandpod_pool.cache import Mirror
from sandpod_pool.members import (
    POOL_KIND,
    SANDBOX,
    TEMPLATE,
    MemberState,
    age,
    failure_reason,
    is_deleting,
    is_member,
    is_ready,
    member_state,
    request_delete,
)
from sandpod_service.clock import REAL, Clock
from sandpod_store import ClaimView, ObjectMeta, Resource, SandboxView, Store, set_condition

__all__ = ["CLAIM", "Binding", "Claims"]

log = structlog.get_logger("sandpod.pool.claims")

CLAIM = "SandboxClaim"
CLAIM_ANNOTATION = "sandpod.dev/claimed-by"
BOUND_AS_ANNOTATION = "sandpod.dev/bound-as"  # the claim's Bound reason, for adoption
Configure = Callable[[str, dict[str, str], int], Awaitable[bool]]
BOUND_MESSAGES = {
    ClaimReason.WARM: "bound a ready warm sandbox",
    ClaimReason.POOL_EXHAUSTED: "no free warm sandbox: created one (cold start)",
    ClaimReason.NO_POOL: "no pool named: created one (cold start)",
}


@dataclasses.dataclass(frozen=True, slots=True)
class Binding:
    """What a claim needs to bind: resolved from its spec, its pool and its template."""

    spec: ClaimSpec
    pool: str | None
    template_ref: str | None
    template: SandboxTemplateSpec
    shutdown_time: str
    idle_timeout: int
    pool_obj: Resource | None = None  # the pool (its uid decides membership)


class Bound(enum.Enum):
    """Where a claimed sandbox stands (labels aside; unlike a free member, a retried create is
    still ``STARTING``: the claim waits for it)."""

    READY = "ready"
    STARTING = "starting"
    FAILED = "failed"


def _running(obj: Resource | None) -> bool:
    return obj is None or member_state_of(obj) is not Bound.STARTING


def member_state_of(obj: Resource) -> Bound:
    """How a claimed sandbox stands, from the lifecycle's status and the delete mark."""
    if is_ready(obj):
        return Bound.READY
    if SandboxView.of(obj).ended or is_deleting(obj):
        return Bound.FAILED
    return Bound.STARTING


class Claims:
    def __init__(
        self,
        *,
        store: Store,
        pools: Mirror,
        sandboxes: Mirror,
        claims: Mirror,
        templates: Mirror,
        configure: Configure,
        recover_after: float,
        background: Callable[[Coroutine[Any, Any, Any], str], None],
        clock: Clock = REAL,
    ) -> None:
        self.store = store
        self.pools = pools
        self.sandboxes = sandboxes
        self.claims = claims
        self.templates = templates
        self._configure = configure
        self.recover_after = recover_after  # a Pending claim this old lost its handler
        self._spawn = background
        self.clock = clock
        self.warm_binds = 0
        self.cold_creates = 0

    # -- the API -------------------------------------------------------------------------------

    async def resolve(self, namespace: str, spec: ClaimSpec) -> Binding:
        """The pool, template and lifetimes a claim binds with. Raises PoolNotFound,
        ResourceInvalid (unknown template)."""
        pool = None
        pool_obj: Resource | None = None
        template_ref = spec.template_ref
        if spec.pool_ref is not None:
            pool_obj = self.pools.get(namespace, spec.pool_ref)
            if pool_obj is None:
                try:
                    pool_obj = await self.store.get(POOL_KIND, namespace, spec.pool_ref)
                except ResourceNotFound:
                    raise PoolNotFound(
                        f"no SandboxWarmPool {spec.pool_ref!r} in namespace {namespace!r}; "
                        "create it (sandpod pool create) or claim by template",
                        pool=spec.pool_ref,
                    ) from None
            pool = spec.pool_ref
            template_ref = WarmPoolSpec.from_dict(pool_obj.spec).template_ref
        template = SandboxTemplateSpec()
        if template_ref is not None:
            try:
                cached = self.templates.get(namespace, template_ref)
                obj = cached or await self.store.get(TEMPLATE, namespace, template_ref)
                template = SandboxTemplateSpec.from_dict(obj.spec)
            except ResourceNotFound:
                raise ResourceInvalid(
                    f"unknown template {template_ref!r} in namespace {namespace!r}",
                    field="spec.templateRef.name",
                ) from None
        lifetime = spec.lifetime_seconds or template.default_lifetime_seconds
        idle = (
            spec.idle_timeout_seconds
            if spec.idle_timeout_seconds is not None
            else template.idle_timeout_seconds
        )
        shutdown = to_rfc3339(self.clock.now() + lifetime)
        return Binding(spec, pool, template_ref, template, shutdown, idle, pool_obj)

    async def claim(self, raw: Mapping[str, Any], wait: float) -> Resource:
        """Create a claim and bind it; the claim once Ready (or as it is after ``wait``).

        Raises ResourceInvalid, PoolNotFound, ClaimFailed (the sandbox failed to start),
        ClaimTimeout (not ready within ``wait``; the claim stays and may still bind).
        """
        t0 = self.clock.monotonic()
        obj = claim_from_map(raw)
        binding = await self.resolve(obj.metadata.namespace, ClaimSpec.from_dict(obj.spec))
        # The claim's write runs alongside the bind and the env's configuration. A crash between
        # them leaves either a claim without a sandbox (the reconciler binds it) or a sandbox
        # labelled for a claim that never appeared (deleted as an orphan once its bind is older
        # than recover_after; the client never got a reply for it).
        created, bound = await asyncio.gather(
            self.store.create(obj), self._bind_configured(obj, binding), return_exceptions=True
        )
        if isinstance(created, BaseException):
            if not isinstance(bound, BaseException):
                await self._delete_sandbox(bound[0])  # no claim to hold it: give it back
            raise created
        self.claims.observe(created)
        if isinstance(bound, BaseException):
            await self.release(created.metadata.namespace, created.metadata.name)
            raise bound
        t1 = self.clock.monotonic()
        claim = await self._bind_and_wait(created, binding, wait, bound)
        log.info(
            "claim_bound",
            claim=claim.metadata.name,
            sandbox=ClaimStatus.from_dict(claim.status).sandbox,
            bind_ms=round((t1 - t0) * 1000, 3),
            ready_ms=round((self.clock.monotonic() - t1) * 1000, 3),
        )
        return claim

    async def _bind_and_wait(
        self,
        claim: Resource,
        binding: Binding,
        wait: float,
        bound: tuple[Resource, ClaimReason],
    ) -> Resource:
        sandbox, reason = bound
        if reason is ClaimReason.WARM and member_state_of(sandbox) is Bound.READY:
            # The hot path (env already configured by _bind_configured): the claim's status is
            # written in the background (the reply carries exactly what is written); if this
            # replica dies first, the reconciler adopts the sandbox labelled for the claim.
            self._background(
                self._set(claim, sandbox, reason, binding.shutdown_time), name="claim-status"
            )
            projected = self._status_for(claim, sandbox, reason, binding.shutdown_time)
            return dataclasses.replace(claim, status=projected.to_dict())
        claim = await self._set(claim, sandbox, reason, binding.shutdown_time)
        name = ClaimStatus.from_dict(claim.status).sandbox or sandbox.metadata.name
        current = self.sandboxes.get(claim.metadata.namespace, name)
        if current is None or member_state_of(current) is not Bound.READY:
            current = await self.sandboxes.wait_for(claim.metadata.namespace, name, _running, wait)
            claim = await self._set(claim, current, reason, binding.shutdown_time)
        status = ClaimStatus.from_dict(claim.status)
        ready = status.condition(ClaimConditionType.READY)
        name = f"{claim.metadata.namespace}/{claim.metadata.name}"  # for messages
        if status.phase is ClaimPhase.FAILED:
            raise ClaimFailed(
                f"claim {name}: {ready.message if ready else 'its sandbox failed'}",
                claim=claim.metadata.name,
                reason=ClaimReason.SANDBOX_FAILED,
            )
        if ready is None or ready.status != "True":
            sandbox_now = self.sandboxes.get(claim.metadata.namespace, status.sandbox or "")
            why = (
                "" if sandbox_now is None else f" (last: {failure_reason(sandbox_now, 'deleted')})"
            )
            raise ClaimTimeout(
                f"claim {name} bound {status.sandbox} ({reason}) but it was not ready within "
                f"{wait:g}s{why}; the claim stays: get it later or delete it",
                claim=claim.metadata.name,
                reason=str(reason),
            )
        return claim

    async def _bind_configured(self, claim: Resource, b: Binding) -> tuple[Resource, ClaimReason]:
        """Bind, and put the claimant's env into a warm sandbox's execd before anyone is told
        (its new commands get it). Without env there is nothing to tell execd: the bind's
        ``bound-at`` annotation starts the sandbox's idle clock (the lifecycle counts it)."""
        sandbox, reason = await self._bind(claim, b)
        if reason is ClaimReason.WARM and b.spec.env:
            await self._configure_env(sandbox)
        return sandbox, reason

    async def _bind(self, claim: Resource, b: Binding) -> tuple[Resource, ClaimReason]:
        """Take a warm member, else create a sandbox: (the sandbox, how it was bound)."""
        if b.pool is not None and b.pool_obj is not None:
            pool = b.pool_obj
            candidates = [
                m
                for m in self.sandboxes.values()
                if m.metadata.namespace == claim.metadata.namespace
                and is_member(m, pool)
                and member_state(m) is MemberState.READY
            ]
            random.shuffle(candidates)  # concurrent claims (any replica) rarely collide
            for member in candidates:
                bound = await self._take(member, claim, b)
                if bound is not None:
                    self.warm_binds += 1
                    return bound, ClaimReason.WARM
        sandbox = await self.store.create(self._cold_object(claim, b))
        self.sandboxes.observe(sandbox)
        self.cold_creates += 1
        reason = ClaimReason.POOL_EXHAUSTED if b.pool is not None else ClaimReason.NO_POOL
        log.info(
            "claim_cold_create",
            claim=claim.metadata.name,
            sandbox=sandbox.metadata.name,
            reason=str(reason),
        )
        return sandbox, reason

    async def _take(self, member: Resource, claim: Resource, b: Binding) -> Resource | None:
        """The compare-and-set that binds: None if someone else changed the member first."""
        labels = {**member.metadata.labels, **b.spec.labels, CLAIM_LABEL: claim.metadata.name}
        annotations = {
            **member.metadata.annotations,
            BOUND_AS_ANNOTATION: str(ClaimReason.WARM),
            BOUND_AT_ANNOTATION: f"{self.clock.now():.3f}",
            CLAIM_ANNOTATION: f"{CLAIM}/{claim.metadata.name}",
        }
        old = SandboxView.of(member).spec
        spec = dataclasses.replace(
            old,
            shutdown_time=b.shutdown_time,
            permanent=False,
            idle_timeout_seconds=b.idle_timeout,
            env=b.spec.env or old.env,
        ).to_dict()
        meta = dataclasses.replace(
            member.metadata, labels=labels, annotations=annotations, owner_references=()
        )  # the claim owns it now (its label): no longer the pool's, not deleted with it
        try:
            bound = await self.store.update(dataclasses.replace(member, metadata=meta, spec=spec))
        except (ResourceConflict, ResourceNotFound):
            return None
        self.sandboxes.observe(bound)
        return bound

    def _background(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        """Run ``coro`` after the reply, owned by the service's supervisor."""
        self._spawn(coro, name)

    async def _configure_env(self, sandbox: Resource) -> bool:
        """The claimant's env, now: the lifecycle would only get there on its
        next pass. Failing is not fatal: the lifecycle pushes the same generation again."""
        env = {e.name: e.value for e in SandboxView.of(sandbox).spec.env}
        return await self._configure(sandbox.metadata.name, env, sandbox.metadata.generation)

    def _cold_object(self, claim: Resource, b: Binding) -> Resource:
        reason = ClaimReason.POOL_EXHAUSTED if b.pool is not None else ClaimReason.NO_POOL
        spec = SandboxSpec(
            template_ref=b.template_ref,
            shutdown_time=b.shutdown_time,
            idle_timeout_seconds=b.idle_timeout,
            env=b.spec.env,
        ).to_dict()
        labels = {**b.spec.labels, CLAIM_LABEL: claim.metadata.name}
        if b.pool is not None:
            labels[POOL_LABEL] = b.pool
        meta = ObjectMeta(
            # Named after the claim: a prefix naming the owner (the gateway's tenant) carries over.
            name=f"{claim.metadata.name[:40].rstrip('-')}-{secrets.token_hex(5)}",
            namespace=claim.metadata.namespace,
            labels=labels,
            annotations={
                CLAIM_ANNOTATION: f"{CLAIM}/{claim.metadata.name}",
                BOUND_AS_ANNOTATION: str(reason),
                BOUND_AT_ANNOTATION: f"{self.clock.now():.3f}",
            },
        )
        return Resource(api_version=API_VERSION, kind=SANDBOX, metadata=meta, spec=spec)

    async def _set(
        self, claim: Resource, sandbox: Resource | None, reason: ClaimReason, shutdown: str
    ) -> Resource:
        """Write the claim's status from its sandbox (conflicts: re-read and write again).

        The first sandbox recorded in a claim's status wins: if another writer (the recovery
        of a claim whose handler seemed lost) recorded a different one meanwhile, ours is
        deleted and the claim is returned as it is, naming theirs.
        """
        for _ in range(10):
            recorded = ClaimStatus.from_dict(claim.status).sandbox
            if sandbox is not None and recorded not in (None, sandbox.metadata.name):
                log.warning(
                    "claim_bound_twice",
                    claim=claim.metadata.name,
                    kept=recorded,
                    dropped=sandbox.metadata.name,
                )
                await self._delete_sandbox(sandbox)
                return claim
            status = self._status_for(claim, sandbox, reason, shutdown)
            if claim.status and status == ClaimStatus.from_dict(claim.status):
                return claim
            try:
                claim = await self.store.update_status(ClaimView.of(claim).with_status(status))
                self.claims.observe(claim)
                return claim
            except ResourceConflict:
                claim = await self.store.get(CLAIM, claim.metadata.namespace, claim.metadata.name)
        raise ResourceConflict(f"claim {claim.metadata.name} keeps changing; retry")

    async def release(self, namespace: str, name: str) -> Resource:
        """Delete a claim and its sandbox. Raises ResourceNotFound."""
        claim = await self.store.get(CLAIM, namespace, name)
        for sbx in self._sandboxes_of(claim):
            await self._delete_sandbox(sbx)
        sandbox = ClaimStatus.from_dict(claim.status).sandbox
        if sandbox is not None and self.sandboxes.get(namespace, sandbox) is None:
            with contextlib.suppress(ResourceNotFound):
                await self._delete_sandbox(await self.store.get(SANDBOX, namespace, sandbox))
        with contextlib.suppress(ResourceNotFound):
            await self.store.delete(CLAIM, namespace, name)
        self.claims.forget(namespace, name)
        log.info("claim_released", claim=f"{namespace}/{name}")
        return claim

    def _sandboxes_of(self, claim: Resource) -> list[Resource]:
        return [
            s
            for s in self.sandboxes.values()
            if s.metadata.namespace == claim.metadata.namespace
            and s.metadata.labels.get(CLAIM_LABEL) == claim.metadata.name
        ]

    async def _delete_sandbox(self, sbx: Resource) -> None:
        await request_delete(self.store, self.sandboxes, sbx, unless=lambda _: False)

    # -- the reconciler ------------------------------------------------------------------------

    async def reconcile(self, key: str) -> float | None:
        """Bring claim ``namespace/name`` in line with its sandbox; when to look again."""
        namespace, _, name = key.partition("/")
        claim = self.claims.get(namespace, name)
        if claim is None:
            return None
        status = ClaimStatus.from_dict(claim.status)
        if status.shutdown_time and self._passed(status.shutdown_time):
            log.info("claim_expired", claim=key)
            await self.release(namespace, name)
            return None
        if status.sandbox is None:
            waited = age(claim, self.clock.now())
            if waited < self.recover_after:
                return self.recover_after - waited
            return await self._recover(claim)
        sandbox = self.sandboxes.get(namespace, status.sandbox)
        if sandbox is None:
            try:
                sandbox = await self.store.get(SANDBOX, namespace, status.sandbox)
            except ResourceNotFound:
                log.info("claim_sandbox_gone", claim=key, sandbox=status.sandbox)
                await self.release(namespace, name)
                return None
        bound = status.condition(ClaimConditionType.BOUND)
        reason = ClaimReason(bound.reason) if bound else ClaimReason.WARM
        await self._set(claim, sandbox, reason, status.shutdown_time or "")
        for extra in self._sandboxes_of(claim):  # a second bind after a lost handler
            late = age(claim, self.clock.now()) > self.recover_after
            if extra.metadata.name != status.sandbox and late:
                await self._delete_sandbox(extra)
        return None

    async def _recover(self, claim: Resource) -> float | None:
        """A claim whose handler died: adopt a sandbox already labelled for it, else bind."""
        ns, name = claim.metadata.namespace, claim.metadata.name
        try:
            binding = await self.resolve(ns, ClaimSpec.from_dict(claim.spec))
        except SandpodError as exc:
            await self._fail(claim, str(exc))
            return None
        labelled = self._sandboxes_of(claim)
        if labelled:
            how = labelled[0].metadata.annotations.get(BOUND_AS_ANNOTATION, ClaimReason.WARM)
            reason = ClaimReason(how) if how in set(ClaimReason) else ClaimReason.WARM
            log.info("claim_adopted", claim=f"{ns}/{name}", sandbox=labelled[0].metadata.name)
            await self._set(claim, labelled[0], reason, binding.shutdown_time)
            return None
        log.info("claim_recovered", claim=f"{ns}/{name}")
        sandbox, reason = await self._bind_configured(claim, binding)
        await self._set(claim, sandbox, reason, binding.shutdown_time)
        return None

    async def _fail(self, claim: Resource, message: str) -> None:
        view = ClaimView.of(claim)
        unbound = Condition(ClaimConditionType.BOUND, "False", ClaimReason.POOL_NOT_FOUND, message)
        conds = set_condition(view.status.conditions, unbound, self.clock.now())
        status = dataclasses.replace(view.status, phase=ClaimPhase.FAILED, conditions=conds)
        self.claims.observe(await self.store.update_status(view.with_status(status)))

    async def orphans(self) -> None:
        """Delete sandboxes labelled for a claim that does not exist (its deletion raced a bind,
        or the service died between the two)."""
        for sbx in self.sandboxes.values():
            claim = sbx.metadata.labels.get(CLAIM_LABEL)
            if claim is None or is_deleting(sbx) or self._bound_age(sbx) < self.recover_after:
                continue
            if self.claims.get(sbx.metadata.namespace, claim) is not None:
                continue
            try:
                await self.store.get(CLAIM, sbx.metadata.namespace, claim)
            except ResourceNotFound:
                log.warning("claim_orphan_sandbox_deleted", sandbox=sbx.metadata.name, claim=claim)
                await self._delete_sandbox(sbx)

    def _bound_age(self, sbx: Resource) -> float:
        """Seconds since a claim bound ``sbx`` (its creation for sandboxes bound before the
        annotation existed)."""
        stamp = sbx.metadata.annotations.get(BOUND_AT_ANNOTATION)
        now = self.clock.now()
        try:
            return now - float(stamp) if stamp else age(sbx, now)
        except ValueError:
            return age(sbx, now)

    def _passed(self, stamp: str) -> bool:
        """Whether RFC 3339 time ``stamp`` has come (an unreadable one has)."""
        try:
            return from_rfc3339(stamp) <= self.clock.now()
        except ValueError:
            return True

    def _status_for(
        self, claim: Resource, sandbox: Resource | None, reason: ClaimReason, shutdown: str
    ) -> ClaimStatus:
        """The claim's status as its sandbox makes it: Bound (how), Ready, the phase."""
        now = self.clock.now()
        state = Bound.FAILED if sandbox is None else member_state_of(sandbox)
        bound = Condition(ClaimConditionType.BOUND, "True", reason, BOUND_MESSAGES.get(reason, ""))
        conds = set_condition(ClaimStatus.from_dict(claim.status).conditions, bound, now)
        phase = ClaimPhase.BOUND
        if state is Bound.READY:
            ready = Condition(ClaimConditionType.READY, "True", ClaimReason.SANDBOX_READY)
        elif state is Bound.FAILED:
            why = "" if sandbox is None else failure_reason(sandbox, "deleted")
            ready = Condition(ClaimConditionType.READY, "False", ClaimReason.SANDBOX_FAILED, why)
            phase = ClaimPhase.FAILED
        else:
            ready = Condition(ClaimConditionType.READY, "False", ClaimReason.SANDBOX_STARTING)
        return ClaimStatus(
            phase=phase,
            sandbox=None if sandbox is None else sandbox.metadata.name,
            shutdown_time=shutdown or None,
            observed_generation=claim.metadata.generation,
            conditions=set_condition(conds, ready, now),
        )


def claim_from_map(raw: Mapping[str, Any]) -> Resource:
    """A SandboxClaim from a client's map, validated (name generated if absent).

    Raises ResourceInvalid."""
    if not isinstance(raw, Mapping):
        raise ResourceInvalid("object must be a map")
    if raw.get("kind", CLAIM) != CLAIM or raw.get("apiVersion", API_VERSION) != API_VERSION:
        raise ResourceInvalid(f"expected {API_VERSION} {CLAIM}", field="kind")
    obj = Resource.from_dict({**raw, "apiVersion": API_VERSION, "kind": CLAIM, "status": {}})
    if not obj.metadata.name:
        meta = dataclasses.replace(obj.metadata, name=f"claim-{secrets.token_hex(5)}")
        obj = dataclasses.replace(obj, metadata=meta)
    obj.validate()
    ClaimSpec.from_dict(obj.spec)
    return obj
