"""The claim reconciler: finish what a claim's handler left, and clean up after claims.

:class:`sandpod_pool.claims.Claims` binds on the hot path; this runs from the ``claims`` work
queue (every claim change, and the resync) and from the leader's orphan sweep:

    shutdownTime passed             -> release the claim and its sandbox
    no sandbox, younger than
      ``recover_after``             -> nothing yet (its handler may still be binding): look
                                       again when it is that old
    no sandbox, older               -> its handler died: adopt a sandbox already labelled for
                                       it, else bind anew (warm, or a cold create)
    its sandbox is gone             -> release the claim
    otherwise                       -> its status follows its sandbox; a second sandbox bound
                                       for it after a lost handler is deleted
    a sandbox labelled for a claim
      that does not exist           -> deleted once its bind is ``recover_after`` old

Every age is measured on the Claims' :class:`~sandpod_service.clock.Clock`.
"""

from __future__ import annotations

import dataclasses

import structlog

from sandpod_contract.errors import ResourceNotFound, SandpodError
from sandpod_contract.pooling import (
    CLAIM_LABEL,
    ClaimConditionType,
    ClaimPhase,
    ClaimReason,
    ClaimSpec,
    ClaimStatus,
)
from sandpod_contract.resources import Condition
from sandpod_contract.times import from_rfc3339
from sandpod_pool.claim_objects import BOUND_AS_ANNOTATION, CLAIM
from sandpod_pool.claims import Claims
from sandpod_pool.members import SANDBOX, age, is_deleting
from sandpod_store import ClaimView, Resource, bound_at, set_condition

__all__ = ["ClaimRecovery"]

log = structlog.get_logger("sandpod.pool.claims")


class ClaimRecovery:
    def __init__(self, claims: Claims) -> None:
        self._c = claims
        self.clock = claims.clock
        self.recover_after = claims.recover_after  # a Pending claim this old lost its handler

    async def reconcile(self, key: str) -> float | None:
        """Bring claim ``namespace/name`` in line with its sandbox; when to look again."""
        c = self._c
        namespace, _, name = key.partition("/")
        claim = c.claims.get(namespace, name)
        if claim is None:
            return None
        status = ClaimStatus.from_dict(claim.status)
        if status.shutdown_time and self._passed(status.shutdown_time):
            log.info("claim_expired", claim=key)
            await c.release(namespace, name)
            return None
        if status.sandbox is None:
            waited = age(claim, self.clock.now())
            if waited < self.recover_after:
                return self.recover_after - waited
            return await self._recover(claim)
        sandbox = c.sandboxes.get(namespace, status.sandbox)
        if sandbox is None:
            try:
                sandbox = await c.store.get(SANDBOX, namespace, status.sandbox)
            except ResourceNotFound:
                log.info("claim_sandbox_gone", claim=key, sandbox=status.sandbox)
                await c.release(namespace, name)
                return None
        bound = status.condition(ClaimConditionType.BOUND)
        reason = ClaimReason(bound.reason) if bound else ClaimReason.WARM
        await c.set_status(claim, sandbox, reason, status.shutdown_time or "")
        late = age(claim, self.clock.now()) > self.recover_after
        for extra in c.sandboxes_of(claim):  # a second bind after a lost handler
            if extra.metadata.name != status.sandbox and late:
                await c.delete_sandbox(extra)
        return None

    async def _recover(self, claim: Resource) -> float | None:
        """A claim whose handler died: adopt a sandbox already labelled for it, else bind."""
        c = self._c
        ns, name = claim.metadata.namespace, claim.metadata.name
        try:
            binding = await c.resolve(ns, ClaimSpec.from_dict(claim.spec))
        except SandpodError as exc:
            await self._fail(claim, str(exc))
            return None
        labelled = c.sandboxes_of(claim)
        if labelled:
            how = labelled[0].metadata.annotations.get(BOUND_AS_ANNOTATION, ClaimReason.WARM)
            reason = ClaimReason(how) if how in set(ClaimReason) else ClaimReason.WARM
            log.info("claim_adopted", claim=f"{ns}/{name}", sandbox=labelled[0].metadata.name)
            await c.set_status(claim, labelled[0], reason, binding.shutdown_time)
            return None
        log.info("claim_recovered", claim=f"{ns}/{name}")
        sandbox, reason = await c.bind_configured(claim, binding)
        await c.set_status(claim, sandbox, reason, binding.shutdown_time)
        return None

    async def _fail(self, claim: Resource, message: str) -> None:
        view = ClaimView.of(claim)
        unbound = Condition(ClaimConditionType.BOUND, "False", ClaimReason.POOL_NOT_FOUND, message)
        conds = set_condition(view.status.conditions, unbound, self.clock.now())
        status = dataclasses.replace(view.status, phase=ClaimPhase.FAILED, conditions=conds)
        self._c.claims.observe(await self._c.store.update_status(view.with_status(status)))

    async def orphans(self) -> None:
        """Delete sandboxes labelled for a claim that does not exist (its deletion raced a bind,
        or the service died between the two)."""
        c = self._c
        for sbx in c.sandboxes.values():
            claim = sbx.metadata.labels.get(CLAIM_LABEL)
            if claim is None or is_deleting(sbx) or self._bound_age(sbx) < self.recover_after:
                continue
            if c.claims.get(sbx.metadata.namespace, claim) is not None:
                continue
            try:
                await c.store.get(CLAIM, sbx.metadata.namespace, claim)
            except ResourceNotFound:
                log.warning("claim_orphan_sandbox_deleted", sandbox=sbx.metadata.name, claim=claim)
                await c.delete_sandbox(sbx)

    def _bound_age(self, sbx: Resource) -> float:
        """Seconds since a claim bound ``sbx`` (its creation for sandboxes bound before the
        annotation existed)."""
        now, stamp = self.clock.now(), bound_at(sbx)
        return now - stamp if stamp is not None else age(sbx, now)

    def _passed(self, stamp: str) -> bool:
        """Whether RFC 3339 time ``stamp`` has come (an unreadable one has)."""
        try:
            return from_rfc3339(stamp) <= self.clock.now()
        except ValueError:
            return True
