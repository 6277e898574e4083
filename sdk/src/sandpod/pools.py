"""Warm pools and claims in the SDK: manage ``SandboxWarmPool`` objects and read claims.

Claiming a sandbox is :meth:`sandpod.AsyncSandbox.claim` / :meth:`sandpod.Sandbox.claim` (whose
request is :func:`claim_sandbox`); otherwise this module is the administration side::

    async with await AsyncPools.connect() as pools:
        await pools.create("python", template="python", replicas=20)
        print(await pools.list())
        await pools.scale("python", 50)
"""

from __future__ import annotations

import builtins
import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Self

from sandpod._loop import run
from sandpod._twins import twin
from sandpod.config import (
    resolve_inbox_prefix,
    resolve_nats_creds,
    resolve_nats_url,
    resolve_prefix,
    resolve_tenant,
)
from sandpod.control import api_call
from sandpod_bus import Bus, BusSettings
from sandpod_contract.errors import SandboxError
from sandpod_contract.messages.pools import Scale
from sandpod_contract.messages.sandboxes import (
    ObjectReply,
    ObjectRequest,
    ObjectsReply,
    Ref,
    Selection,
)
from sandpod_contract.reserved import refuse_reserved
from sandpod_contract.resources import API_VERSION
from sandpod_contract.subjects import Subjects

__all__ = ["AsyncPools", "ClaimInfo", "PoolInfo", "Pools", "claim_object", "claim_sandbox"]


def _condition(status: Mapping[str, Any], type_: str) -> Mapping[str, Any]:
    return next((c for c in status.get("conditions") or () if c.get("type") == type_), {})


@dataclasses.dataclass(frozen=True, slots=True)
class PoolInfo:
    """A SandboxWarmPool (the printer columns, and the raw object)."""

    name: str
    namespace: str
    template: str | None
    replicas: int  # desired
    free: int  # free members (ready or not)
    ready: int  # free and ready
    available: int  # free, ready and of the current template
    status: str  # the Ready condition's reason (AllReplicasReady, Filling, MembersFailing...)
    message: str
    object: Mapping[str, Any]

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> PoolInfo:
        meta, spec, status = obj.get("metadata", {}), obj.get("spec", {}), obj.get("status", {})
        ready = _condition(status, "Ready")
        return cls(
            name=meta.get("name", ""),
            namespace=meta.get("namespace", "default"),
            template=(spec.get("templateRef") or {}).get("name"),
            replicas=int(spec.get("replicas", 0)),
            free=int(status.get("replicas", 0)),
            ready=int(status.get("readyReplicas", 0)),
            available=int(status.get("availableReplicas", 0)),
            status=str(ready.get("reason", "")),
            message=str(ready.get("message", "")),
            object=obj,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimInfo:
    """A SandboxClaim: which sandbox it holds and how it got it."""

    name: str
    namespace: str
    phase: str
    sandbox: str | None
    pool: str | None
    bound_reason: str  # WarmPoolBind | PoolExhausted | NoPool | PoolNotFound
    ready: bool
    shutdown_time: str | None
    object: Mapping[str, Any]

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> ClaimInfo:
        meta, spec, status = obj.get("metadata", {}), obj.get("spec", {}), obj.get("status", {})
        return cls(
            name=meta.get("name", ""),
            namespace=meta.get("namespace", "default"),
            phase=status.get("phase", "Pending"),
            sandbox=status.get("sandbox"),
            pool=(spec.get("poolRef") or {}).get("name"),
            bound_reason=str(_condition(status, "Bound").get("reason", "")),
            ready=_condition(status, "Ready").get("status") == "True",
            shutdown_time=status.get("shutdownTime"),
            object=obj,
        )

    @property
    def warm(self) -> bool:
        """Bound to a sandbox that was already warm (no cold start)."""
        return self.bound_reason == "WarmPoolBind"


def claim_object(
    *,
    pool: str | None,
    template: str | None,
    name: str | None,
    timeout: float | None,
    idle_timeout: int | None,
    labels: Mapping[str, str] | None,
    env: Mapping[str, str] | None,
) -> dict[str, Any]:
    """The SandboxClaim object for a claim request. Raises BadRequest for a reserved
    (``sandpod.dev/``) label, as the pool service would."""
    refuse_reserved({"spec": {"labels": dict(labels or {})}}, spec_labels=True)
    spec: dict[str, Any] = {}
    if pool:
        spec["poolRef"] = {"name": pool}
    if template:
        spec["templateRef"] = {"name": template}
    if timeout is not None:
        spec["lifetimeSeconds"] = math.ceil(timeout)  # the service refuses < 1 with the field
    if idle_timeout is not None:
        spec["idleTimeoutSeconds"] = idle_timeout
    if labels:
        spec["labels"] = dict(labels)
    if env:
        spec["env"] = [{"name": k, "value": v} for k, v in env.items()]
    meta: dict[str, Any] = {"name": name} if name else {}
    return {"apiVersion": API_VERSION, "kind": "SandboxClaim", "metadata": meta, "spec": spec}


async def claim_sandbox(
    bus: Bus,
    subjects: Subjects,
    *,
    pool: str | None,
    template: str | None,
    name: str | None,
    timeout: float | None,
    idle_timeout: int | None,
    labels: Mapping[str, str] | None,
    env: Mapping[str, str] | None,
    wait: float,
) -> tuple[ClaimInfo, str]:
    """Claim a sandbox (arguments as :func:`claim_object`); returns once it is bound and ready.

    Returns:
        The claim, and the name of the sandbox bound to it.

    Raises:
        PoolNotFound: no such pool.
        ClaimFailed: the sandbox failed to start (the reason is in the message).
        ClaimTimeout: not ready within ``wait`` seconds (the claim stays and may bind).
        ResourceInvalid: bad arguments or unknown template.
        SandboxError: no pool service answers.
    """
    obj = claim_object(
        pool=pool,
        template=template,
        name=name,
        timeout=timeout,
        idle_timeout=idle_timeout,
        labels=labels,
        env=env,
    )
    reply = await api_call(
        bus,
        subjects,
        "claims",
        "create",
        ObjectRequest(object=obj, wait_ready=wait),
        ObjectReply,
        timeout=wait + 10,
    )
    info = ClaimInfo.of(reply.object)
    if info.sandbox is None:  # a bound claim always names one: a server bug otherwise
        raise SandboxError(f"claim {info.name} replied without a sandbox")
    return info, info.sandbox


class AsyncPools:
    """Pool and claim administration over the pool service's API."""

    def __init__(self, bus: Bus, subjects: Subjects, *, owns_bus: bool, namespace: str) -> None:
        self.bus = bus
        self.subjects = subjects
        self.namespace = namespace
        self._owns_bus = owns_bus

    @classmethod
    async def connect(
        cls,
        *,
        nats_url: str | None = None,
        prefix: str | None = None,
        namespace: str = "default",
        bus: Bus | None = None,
    ) -> AsyncPools:
        """Connect (or share ``bus``). Raises ConnectionLost: NATS is unreachable."""
        subjects = Subjects(resolve_prefix(prefix), tenant=resolve_tenant())
        if bus is not None:
            return cls(bus, subjects, owns_bus=False, namespace=namespace)
        settings = BusSettings(
            url=resolve_nats_url(nats_url),
            name="sandpod-sdk:pools",
            creds=resolve_nats_creds(),
            inbox_prefix=resolve_inbox_prefix(),
        )
        return cls(await Bus.connect(settings), subjects, owns_bus=True, namespace=namespace)

    async def _call(self, kind: str, verb: str, msg: Any, reply: type[Any]) -> Any:
        return await api_call(self.bus, self.subjects, kind, verb, msg, reply)

    async def create(
        self,
        name: str,
        *,
        template: str | None = None,
        replicas: int = 1,
        strategy: str = "RollingUpdate",
    ) -> PoolInfo:
        """Create or update pool ``name`` keeping ``replicas`` warm sandboxes of ``template``.

        ``strategy``: what a template change does to free members (RollingUpdate, Recreate,
        OnClaim). Returns at once; members become ready in the background (see :meth:`get`).
        Raises ResourceInvalid.
        """
        spec: dict[str, Any] = {"replicas": replicas, "updateStrategy": {"type": strategy}}
        if template:
            spec["templateRef"] = {"name": template}
        obj = {
            "apiVersion": API_VERSION,
            "kind": "SandboxWarmPool",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": spec,
        }
        reply = await self._call("pools", "apply", ObjectRequest(object=obj), ObjectReply)
        return PoolInfo.of(reply.object)

    async def get(self, name: str) -> PoolInfo:
        reply = await self._call(
            "pools", "get", Ref(name=name, namespace=self.namespace), ObjectReply
        )
        return PoolInfo.of(reply.object)

    async def list(self) -> list[PoolInfo]:
        reply = await self._call("pools", "list", Selection(namespace=self.namespace), ObjectsReply)
        return [PoolInfo.of(o) for o in reply.items]

    async def scale(self, name: str, replicas: int) -> PoolInfo:
        """Set the pool's replicas (what an autoscaler does through the scale subresource)."""
        msg = Scale(name=name, namespace=self.namespace, replicas=replicas)
        return PoolInfo.of((await self._call("pools", "scale", msg, ObjectReply)).object)

    async def delete(self, name: str) -> PoolInfo:
        """Delete the pool and its free members (claimed sandboxes stay with their claims)."""
        reply = await self._call(
            "pools", "delete", Ref(name=name, namespace=self.namespace), ObjectReply
        )
        return PoolInfo.of(reply.object)

    async def claims(self, labels: str | None = None) -> builtins.list[ClaimInfo]:
        msg = Selection(namespace=self.namespace, selector=labels)
        return [
            ClaimInfo.of(o) for o in (await self._call("claims", "list", msg, ObjectsReply)).items
        ]

    async def get_claim(self, name: str) -> ClaimInfo:
        reply = await self._call(
            "claims", "get", Ref(name=name, namespace=self.namespace), ObjectReply
        )
        return ClaimInfo.of(reply.object)

    async def release(self, name: str) -> ClaimInfo:
        """Delete claim ``name`` and its sandbox."""
        reply = await self._call(
            "claims", "delete", Ref(name=name, namespace=self.namespace), ObjectReply
        )
        return ClaimInfo.of(reply.object)

    async def close(self) -> None:
        if self._owns_bus:
            await self.bus.drain()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()


class Pools:
    """Blocking twin of :class:`AsyncPools`."""

    def __init__(self, inner: AsyncPools) -> None:
        self._inner = inner

    @property
    def namespace(self) -> str:
        return self._inner.namespace

    @classmethod
    def connect(
        cls, *, nats_url: str | None = None, prefix: str | None = None, namespace: str = "default"
    ) -> Pools:
        return cls(run(AsyncPools.connect(nats_url=nats_url, prefix=prefix, namespace=namespace)))

    create = twin(AsyncPools.create)
    get = twin(AsyncPools.get)
    list = twin(AsyncPools.list)
    scale = twin(AsyncPools.scale)
    delete = twin(AsyncPools.delete)
    claims = twin(AsyncPools.claims)
    get_claim = twin(AsyncPools.get_claim)
    release = twin(AsyncPools.release)
    close = twin(AsyncPools.close)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
