"""The control-plane API (``<prefix>.api.sandboxes.*``, ``<prefix>.api.templates.*``; the
volumes' ``<prefix>.api.volumes.*`` is :mod:`sandpod_lifecycle.volumes`).

Handlers validate, apply safe defaults and write the store; the reconciler does the rest. Any
replica can answer any request (queue group): the store's optimistic concurrency keeps them
consistent. ``create`` and ``delete`` can wait for the outcome (Ready / gone) so a client gets a
usable sandbox, or a reason, in one call.

No request may set a reserved (``sandpod.dev/``) label or annotation or an owner reference
(:mod:`sandpod_contract.reserved`: other services trust them). On a tenant's subject
(``<prefix>.api.t.<tenant>.…``) every name is the tenant's and the service sets the tenant
label (:mod:`sandpod_service.scoping`); templates are then read-only.

A Sandbox's volumes (its own ``spec.volumes`` and its template's, resolved into its spec) are
claimed before it is written and released if the write fails (:class:`Volumes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from sandpod_contract.errors import (
    BadRequest,
    ResourceConflict,
    ResourceExists,
    ResourceInvalid,
    ResourceNotFound,
)
from sandpod_contract.messages.sandboxes import (
    PUBLIC_PORTS_ANNOTATION,
    Expose,
    NetworkState,
    NetworkUpdate,
    ObjectReply,
    ObjectRequest,
    ObjectsReply,
    Ref,
    Renew,
    Selection,
)
from sandpod_contract.network import NetworkPolicy, Rule
from sandpod_contract.reserved import refuse_reserved
from sandpod_contract.resources import (
    Condition,
    ConditionReason,
    ConditionType,
    OperatingMode,
    Phase,
    SandboxSpec,
    SandboxStatus,
    SandboxTemplateSpec,
)
from sandpod_contract.snapshots import SNAPSHOT_KIND, SnapshotPhase, SnapshotStatus
from sandpod_contract.tenancy import LIFECYCLE_NAMESPACE
from sandpod_contract.times import from_rfc3339, to_rfc3339
from sandpod_lifecycle.egress import wanted
from sandpod_lifecycle.events import Events
from sandpod_lifecycle.objects import (
    SANDBOX,
    TEMPLATE,
    apply_defaults,
    sandbox_from_map,
    template_from_map,
    with_condition,
)
from sandpod_lifecycle.volumes import Volumes, effective_mounts
from sandpod_service.clock import REAL, Clock
from sandpod_service.scoping import (
    scope,
    scoped_name,
    scoped_object,
    scoped_ref,
    scoped_selection,
    visible,
)
from sandpod_store import DELETE_ANNOTATION, EventType, Resource, SandboxView, Store
from sandpod_store.views import built_template

__all__ = ["LifecycleApi"]

MAX_LIST = 1000
WAKE_WAIT = 120.0  # seconds a wake waits for the restored instance when the request names none
MAX_CONFLICTS = 20


class LifecycleApi:
    def __init__(
        self,
        store: Store,
        events: Events,
        enqueue: asyncio.Queue[str] | None = None,
        *,
        clock: Clock = REAL,
        always_allowed: Sequence[Rule] = (),
        volumes: Volumes | None = None,
    ) -> None:
        self.store = store
        self.volumes = volumes or Volumes(store, None)  # SandboxVolumes: claims (volumes.py)
        self.events = events
        self.clock = clock
        self._always_allowed = tuple(always_allowed)  # SANDPOD_NET_ALWAYS_ALLOW

    async def template(self, namespace: str, name: str | None) -> SandboxTemplateSpec:
        """The named template's spec (the built-in default when ``name`` is None)."""
        if name is None:
            return SandboxTemplateSpec()
        try:
            obj = await self.store.get(TEMPLATE, namespace, name)
        except ResourceNotFound:
            raise ResourceInvalid(
                f"unknown template {name!r} in namespace {namespace!r}; create it first "
                "(sandpod template apply) or omit templateRef for the default",
                field="spec.templateRef.name",
            ) from None
        return built_template(obj)

    # -- sandboxes -----------------------------------------------------------------------------

    async def create(self, req: ObjectRequest) -> ObjectReply:
        refuse_reserved(req.object)
        raw = scoped_object(req.object, "sandbox", "sbx")
        raw = _scoped_snapshot_ref(raw)
        obj, spec = sandbox_from_map(raw)
        if (raw.get("metadata") or {}).get("name"):
            await self._name_free(obj.metadata.name)
        if spec.snapshot_ref is not None:
            obj, spec = await self._from_snapshot(obj, spec)
        template = await self.template(obj.metadata.namespace, spec.template_ref)
        obj = apply_defaults(obj, spec, template, self.clock.now())
        mounts = self.volumes.scoped_mounts(effective_mounts(template.volumes, spec.volumes))
        if mounts:  # the template's resolved in: what the driver binds, and what is released
            obj = dataclasses.replace(
                obj, spec={**obj.spec, "volumes": [m.to_dict() for m in mounts]}
            )
        SandboxSpec.from_dict(obj.spec)  # defaults must still satisfy the schema
        ns, name = obj.metadata.namespace, obj.metadata.name
        await self.volumes.claim(ns, name, mounts)
        try:
            created = await self.store.create(obj)
        except BaseException:
            await self.volumes.release(ns, name, [m.name for m in mounts])
            raise
        status = with_condition(
            SandboxStatus(
                phase=Phase.PENDING, shutdown_time=SandboxSpec.from_dict(created.spec).shutdown_time
            ),
            Condition(
                ConditionType.READY, "False", ConditionReason.CREATING, "waiting for the instance"
            ),
            self.clock.now(),
        )
        created = await self.store.update_status(
            dataclasses.replace(created, status=status.to_dict())
        )
        await self.events.publish(
            name=created.metadata.name,
            namespace=created.metadata.namespace,
            type_="created",
            phase=str(Phase.PENDING),
            generation=created.metadata.generation,
        )
        if req.wait_ready:
            created = await self.wait(created, req.wait_ready, _settled)
        return ObjectReply(object=created.to_dict())

    async def _from_snapshot(
        self, obj: Resource, spec: SandboxSpec
    ) -> tuple[Resource, SandboxSpec]:
        """A sandbox restored from a snapshot: the snapshot exists in its namespace (a tenant's
        names only its own), and without a template of its own it gets the snapshot's.

        Raises:
            ResourceInvalid: no such snapshot, or it failed.
        """
        field = "spec.snapshotRef.name"
        try:
            snap = await self.store.get(
                SNAPSHOT_KIND, obj.metadata.namespace, spec.snapshot_ref or ""
            )
        except ResourceNotFound:
            raise ResourceInvalid(
                f"unknown snapshot {spec.snapshot_ref!r}; take one first (sandpod snapshot create)",
                field=field,
            ) from None
        status = SnapshotStatus.from_dict(snap.status)
        if status.phase is SnapshotPhase.FAILED:
            raise ResourceInvalid(f"snapshot {spec.snapshot_ref!r} failed", field=field)
        if spec.template_ref is None and status.template:
            obj = _with_spec(obj, template_ref=status.template)
            spec = dataclasses.replace(spec, template_ref=status.template)
        return obj, spec

    async def _name_free(self, name: str) -> None:
        """A sandbox's name is its id on the data plane (``<prefix>.sbx.<name>.>``), so it is
        unique across namespaces, not only within one. Generated names never collide."""
        items, _ = await self.store.list(SANDBOX, None)
        taken = next((o for o in items if o.metadata.name == name), None)
        if taken is not None:
            raise ResourceExists(
                f"a Sandbox named {name!r} exists (namespace {taken.metadata.namespace!r}); "
                "sandbox names are unique across namespaces: choose another or omit the name",
                kind=SANDBOX,
                name=name,
            )

    async def get(self, req: Ref) -> ObjectReply:
        req = scoped_ref(req, SANDBOX)
        return ObjectReply(
            object=(await self.store.get(SANDBOX, req.namespace, req.name)).to_dict()
        )

    async def list(self, req: Selection) -> ObjectsReply:
        return visible(await self._list(SANDBOX, scoped_selection(req)))

    async def _mutate(
        self, kind: str, namespace: str, name: str, change: Callable[[Resource], Resource]
    ) -> Resource:
        """Read, change, write; on a conflict (the reconciler wrote status meanwhile) again."""
        for _ in range(MAX_CONFLICTS):
            obj = await self.store.get(kind, namespace, name)
            try:
                return await self.store.update(change(obj))
            except ResourceConflict:
                continue
        raise ResourceConflict(f"{kind} {namespace}/{name} keeps changing; retry", name=name)

    async def delete(self, req: Ref) -> ObjectReply:
        req = scoped_ref(req, SANDBOX)

        def mark(obj: Resource) -> Resource:
            annotations = {**obj.metadata.annotations, DELETE_ANNOTATION: "true"}
            return dataclasses.replace(
                obj, metadata=dataclasses.replace(obj.metadata, annotations=annotations)
            )

        obj = await self._mutate(SANDBOX, req.namespace, req.name, mark)
        if req.wait:
            obj = await self.wait(obj, req.wait, lambda o: o is None)
        return ObjectReply(object=obj.to_dict())

    async def renew(self, req: Renew) -> ObjectReply:
        req = scoped_ref(req, SANDBOX)
        obj = await self.store.get(SANDBOX, req.namespace, req.name)
        if SandboxSpec.from_dict(obj.spec).permanent:
            raise ResourceInvalid("a permanent sandbox has no lifetime to renew", field="spec")
        if req.seconds is not None:
            expiry = to_rfc3339(self.clock.now() + req.seconds)
        else:
            try:
                expiry = to_rfc3339(from_rfc3339(req.shutdown_time or ""))
            except ValueError as exc:
                raise ResourceInvalid(str(exc), field="shutdown_time") from exc
        obj = await self._mutate(
            SANDBOX,
            req.namespace,
            req.name,
            lambda o: _with_spec(o, shutdown_time=expiry),
        )
        phase = str(_phase(obj))
        await self.events.publish(
            name=req.name, namespace=req.namespace, type_="renewed", phase=phase, message=expiry
        )
        return ObjectReply(object=obj.to_dict())

    async def expose(self, req: Expose) -> ObjectReply:
        """Record ``req.port`` as public (or not) in the Sandbox's reserved annotation, which
        every gateway replica reads: the exposure outlives gateway restarts, and code in the
        sandbox (which has no control-plane credential) cannot set it."""
        req = scoped_ref(req, SANDBOX)

        def change(obj: Resource) -> Resource:
            annotations = dict(obj.metadata.annotations)
            ports = public_ports(annotations)
            ports = ports | {req.port} if req.public else ports - {req.port}
            if ports:
                annotations[PUBLIC_PORTS_ANNOTATION] = ",".join(map(str, sorted(ports)))
            else:
                annotations.pop(PUBLIC_PORTS_ANNOTATION, None)
            return dataclasses.replace(
                obj, metadata=dataclasses.replace(obj.metadata, annotations=annotations)
            )

        obj = await self._mutate(SANDBOX, req.namespace, req.name, change)
        return ObjectReply(object=obj.to_dict())

    async def pause(self, req: Ref) -> ObjectReply:
        return await self._mode(req, OperatingMode.PAUSED)

    async def resume(self, req: Ref) -> ObjectReply:
        obj = await self.store.get(SANDBOX, *_where(scoped_ref(req, SANDBOX)))
        if _phase(obj) in (Phase.HIBERNATING, Phase.HIBERNATED):
            return await self.wake(req)
        return await self._mode(req, OperatingMode.RUNNING)

    async def wake(self, req: Ref) -> ObjectReply:
        """Wake a hibernated sandbox (restore its instance) and wait until it runs, or
        ``req.wait`` seconds; a sandbox that is not hibernated answers as it is."""
        req = scoped_ref(req, SANDBOX)
        deadline = self.clock.now() + (req.wait or WAKE_WAIT)
        while True:
            obj = await self.store.get(SANDBOX, req.namespace, req.name)
            phase, left = _phase(obj), max(deadline - self.clock.now(), 0.0)
            if phase is Phase.HIBERNATING and left > 0:  # wake it once it has hibernated
                await self.wait(obj, left, _not_hibernating)
                continue
            if phase is not Phase.HIBERNATED:
                if _waking(obj) and left > 0:  # another caller woke it: wait for the same
                    obj = await self.wait(obj, left, _settled)
                return ObjectReply(object=obj.to_dict())
            status = with_condition(
                dataclasses.replace(SandboxStatus.from_dict(obj.status), phase=Phase.PENDING),
                Condition(ConditionType.READY, "False", ConditionReason.WAKING, "woken: restoring"),
                self.clock.now(),
            )
            try:
                obj = await self.store.update_status(
                    dataclasses.replace(obj, status=status.to_dict())
                )
            except ResourceConflict:
                continue  # changed meanwhile (another wake): look again
            await self.events.publish(
                name=obj.metadata.name,
                namespace=obj.metadata.namespace,
                type_="woken",
                phase=str(Phase.PENDING),
                reason=str(ConditionReason.WAKING),
            )
            return ObjectReply(object=(await self.wait(obj, left, _settled)).to_dict())

    async def _mode(self, req: Ref, mode: OperatingMode) -> ObjectReply:
        req = scoped_ref(req, SANDBOX)
        obj = await self._mutate(
            SANDBOX,
            req.namespace,
            req.name,
            lambda o: _with_spec(o, operating_mode=mode),
        )
        want = Phase.PAUSED if mode is OperatingMode.PAUSED else Phase.RUNNING
        obj = await self.wait(obj, req.wait or 10.0, lambda o: o is not None and _phase(o) is want)
        return ObjectReply(object=obj.to_dict())

    # -- network -------------------------------------------------------------------------------

    async def network(self, req: Ref) -> NetworkState:
        """A sandbox's egress policy: the one it should run under, and the one applied."""
        req = scoped_ref(req, SANDBOX)
        return await self._network_state(await self.store.get(SANDBOX, req.namespace, req.name))

    async def set_network(self, req: NetworkUpdate) -> NetworkState:
        """Replace the sandbox's own egress policy (or drop it: its template's applies). The
        same policy again changes nothing (no new generation); the reconciler applies a change
        to the running instance at once (it watches). Raises ResourceInvalid naming the field
        (``spec.network.allow[2]``), ResourceConflict when ``generation`` no longer matches."""
        req = scoped_ref(req, SANDBOX)
        policy = None if req.reset else NetworkPolicy.from_dict(req.policy, "spec.network")

        def change(obj: Resource) -> Resource:
            if req.generation is not None and obj.metadata.generation != req.generation:
                raise ResourceConflict(
                    f"Sandbox {req.name!r} is at generation {obj.metadata.generation}, not "
                    f"{req.generation}: read its network again and retry",
                    name=req.name,
                )
            return _with_spec(obj, network=policy)

        obj = await self.store.get(SANDBOX, req.namespace, req.name)
        if SandboxView.of(obj).spec.network != policy or req.generation is not None:
            obj = await self._mutate(SANDBOX, req.namespace, req.name, change)
        if req.wait:
            obj = await self.wait(obj, req.wait, _network_applied)
        return await self._network_state(obj)

    async def _network_state(self, obj: Resource) -> NetworkState:
        view = SandboxView.of(obj)
        template = await self.template(view.namespace, view.spec.template_ref)
        policy, source = wanted(view, template, self._always_allowed)
        applied = view.status.network
        return NetworkState(
            name=view.name,
            namespace=view.namespace,
            generation=obj.metadata.generation,
            source=source,
            policy=policy.to_dict(),
            applied=None if applied is None else applied.policy.to_dict(),
            applied_generation=0 if applied is None else applied.observed_generation,
            enforced=applied is not None and applied.enforced,
            reason="" if applied is None else applied.reason,
        )

    # -- templates -----------------------------------------------------------------------------

    async def template_apply(self, req: ObjectRequest) -> ObjectReply:
        _admin_only("apply")
        refuse_reserved(req.object)
        obj, _ = template_from_map(req.object)
        try:
            current = await self.store.get(TEMPLATE, obj.metadata.namespace, obj.metadata.name)
        except ResourceNotFound:
            return ObjectReply(object=(await self.store.create(obj)).to_dict())
        meta = obj.metadata.applied_over(current.metadata)
        return ObjectReply(
            object=(await self.store.update(dataclasses.replace(obj, metadata=meta))).to_dict()
        )

    async def template_get(self, req: Ref) -> ObjectReply:
        if scope() is not None:  # templates are shared: a tenant reads lifecycle's namespace
            req = dataclasses.replace(req, namespace=LIFECYCLE_NAMESPACE)
        return ObjectReply(
            object=(await self.store.get(TEMPLATE, req.namespace, req.name)).to_dict()
        )

    async def template_list(self, req: Selection) -> ObjectsReply:
        if scope() is not None:
            req = dataclasses.replace(req, namespace=LIFECYCLE_NAMESPACE)
        return await self._list(TEMPLATE, req)

    async def template_delete(self, req: Ref) -> ObjectReply:
        _admin_only("delete")
        obj = await self.store.get(TEMPLATE, req.namespace, req.name)
        await self.store.delete(TEMPLATE, req.namespace, req.name)
        return ObjectReply(object=obj.to_dict())

    # -- helpers -------------------------------------------------------------------------------

    async def _list(self, kind: str, req: Selection) -> ObjectsReply:
        items, revision = await self.store.list(kind, req.namespace, req.selector)
        limit = min(req.limit or MAX_LIST, MAX_LIST)
        return ObjectsReply(
            items=tuple(i.to_dict() for i in items[:limit]),
            revision=revision,
            truncated=len(items) > limit,
        )

    async def wait(
        self, obj: Resource, timeout: float, done: Callable[[Resource | None], bool]
    ) -> Resource:
        """Watch ``obj`` until ``done`` (None = deleted) or ``timeout``; the last state seen."""
        kind, ns, name = obj.key
        last: Resource | None = obj
        if done(last):
            return obj

        async def follow() -> None:
            nonlocal last
            revision = int(obj.metadata.resource_version)
            async for event in self.store.watch(kind, ns, revision, name=name):
                if event.name != name:
                    continue
                last = None if event.type is EventType.DELETED else event.resource
                if done(last):
                    return

        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(follow(), timeout)
        return last if last is not None else obj


def public_ports(annotations: dict[str, str]) -> set[int]:
    """The ports :data:`PUBLIC_PORTS_ANNOTATION` lists (malformed entries ignored)."""
    raw = annotations.get(PUBLIC_PORTS_ANNOTATION, "")
    return {int(p) for p in raw.split(",") if p.strip().isdigit() and 0 < int(p) < 65536}


def _admin_only(verb: str) -> None:
    """Templates are an administrator's (a template names a root filesystem on the host)."""
    if scope() is not None:
        raise BadRequest(
            f"a tenant cannot {verb} templates: ask the administrator (sandpod template apply "
            "on the host)",
            field="subject",
        )


def _scoped_snapshot_ref(raw: Any) -> Any:
    """On a tenant's subject, ``spec.snapshotRef`` names one of the tenant's own snapshots."""
    s = scope()
    spec = raw.get("spec") if isinstance(raw, dict) else None
    ref = spec.get("snapshotRef") if isinstance(spec, dict) else None
    if s is None or not isinstance(spec, dict) or not isinstance(ref, dict):
        return raw
    name = scoped_name(s, "snapshot", str(ref.get("name", "")), "spec.snapshotRef.name")
    return {**raw, "spec": {**spec, "snapshotRef": {"name": name}}}


def _phase(obj: Resource) -> Phase:
    return SandboxStatus.from_dict(obj.status).phase


def _network_applied(obj: Resource | None) -> bool:
    """The runtime applied the policy of ``obj``'s current generation (or it is gone)."""
    if obj is None:
        return True
    applied = SandboxStatus.from_dict(obj.status).network
    return applied is not None and applied.observed_generation >= obj.metadata.generation


def _waking(obj: Resource) -> bool:
    """Pending because a wake restores it (not a create, not a lost instance)."""
    if _phase(obj) is not Phase.PENDING:
        return False
    ready = SandboxView.of(obj).condition(ConditionType.READY)
    return ready is not None and ready.reason == ConditionReason.WAKING


def _not_hibernating(obj: Resource | None) -> bool:
    return obj is None or _phase(obj) is not Phase.HIBERNATING


def _where(req: Ref) -> tuple[str, str]:
    return req.namespace or "default", req.name


def _settled(obj: Resource | None) -> bool:
    return obj is None or _phase(obj) in (Phase.RUNNING, Phase.FAILED, Phase.PAUSED)


def _with_spec(obj: Resource, **changes: Any) -> Resource:
    """``obj`` with its (typed) spec changed: no spec map is edited by hand."""
    spec = dataclasses.replace(SandboxView.of(obj).spec, **changes)
    return dataclasses.replace(obj, spec=spec.to_dict())
