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
The claim reconciler (:mod:`sandpod_pool.claim_recovery`) finishes claims whose handler died
(adopting a sandbox already labelled for the claim, else binding anew), deletes claims whose
sandbox is gone or whose lifetime is over, and deletes sandboxes labelled for a claim that no
longer exists; the claim's objects and status are built in :mod:`sandpod_pool.claim_objects`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
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
)
from sandpod_contract.pooling import (
    CLAIM_LABEL,
    ClaimConditionType,
    ClaimPhase,
    ClaimReason,
    ClaimSpec,
    ClaimStatus,
    WarmPoolSpec,
)
from sandpod_contract.resources import SandboxTemplateSpec
from sandpod_contract.times import to_rfc3339
from sandpod_pool.cache import Mirror
from sandpod_pool.claim_objects import (
    CLAIM,
    Binding,
    Bound,
    bind_annotations,
    claim_from_map,
    claim_status,
    cold_object,
    member_state_of,
    running,
)
from sandpod_pool.members import (
    POOL_KIND,
    SANDBOX,
    TEMPLATE,
    MemberState,
    failure_reason,
    is_member,
    member_state,
    request_delete,
)
from sandpod_service.clock import REAL, Clock
from sandpod_store import ClaimView, Resource, SandboxView, Store

__all__ = ["CLAIM", "Binding", "Claims"]  # the claim reconciler: sandpod_pool.claim_recovery

log = structlog.get_logger("sandpod.pool.claims")

Configure = Callable[[str, dict[str, str], int], Awaitable[bool]]


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
            self.store.create(obj), self.bind_configured(obj, binding), return_exceptions=True
        )
        if isinstance(created, BaseException):
            if not isinstance(bound, BaseException):
                await self.delete_sandbox(bound[0])  # no claim to hold it: give it back
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
                self.set_status(claim, sandbox, reason, binding.shutdown_time), name="claim-status"
            )
            shutdown, now = binding.shutdown_time, self.clock.now()
            projected = claim_status(claim, sandbox, reason, shutdown, now)
            return dataclasses.replace(claim, status=projected.to_dict())
        claim = await self.set_status(claim, sandbox, reason, binding.shutdown_time)
        name = ClaimStatus.from_dict(claim.status).sandbox or sandbox.metadata.name
        current = self.sandboxes.get(claim.metadata.namespace, name)
        if current is None or member_state_of(current) is not Bound.READY:
            current = await self.sandboxes.wait_for(claim.metadata.namespace, name, running, wait)
            claim = await self.set_status(claim, current, reason, binding.shutdown_time)
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

    async def bind_configured(self, claim: Resource, b: Binding) -> tuple[Resource, ClaimReason]:
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
        sandbox = await self.store.create(cold_object(claim, b, self.clock.now()))
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
            **bind_annotations(claim, ClaimReason.WARM, self.clock.now()),
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

    async def set_status(
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
                await self.delete_sandbox(sandbox)
                return claim
            status = claim_status(claim, sandbox, reason, shutdown, self.clock.now())
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
        for sbx in self.sandboxes_of(claim):
            await self.delete_sandbox(sbx)
        sandbox = ClaimStatus.from_dict(claim.status).sandbox
        if sandbox is not None and self.sandboxes.get(namespace, sandbox) is None:
            with contextlib.suppress(ResourceNotFound):
                await self.delete_sandbox(await self.store.get(SANDBOX, namespace, sandbox))
        with contextlib.suppress(ResourceNotFound):
            await self.store.delete(CLAIM, namespace, name)
        self.claims.forget(namespace, name)
        log.info("claim_released", claim=f"{namespace}/{name}")
        return claim

    def sandboxes_of(self, claim: Resource) -> list[Resource]:
        return [
            s
            for s in self.sandboxes.values()
            if s.metadata.namespace == claim.metadata.namespace
            and s.metadata.labels.get(CLAIM_LABEL) == claim.metadata.name
        ]

    async def delete_sandbox(self, sbx: Resource) -> None:
        await request_delete(self.store, self.sandboxes, sbx, unless=lambda _: False)
