"""Requests the gateway makes on NATS for a client: the one place HTTP meets the bus.

``Upstream.sandbox(scope, name)`` resolves a tenant's sandbox name to a :class:`Target`: the
protocol client's :class:`~sandpod_client.Channel` to that sandbox's execd (what the exec,
stream and file handlers hand to :mod:`sandpod_client`), and ``Target.call`` for one typed
request. ``Upstream.api`` sends one control-plane request to lifecycle or pool on the tenant's
own subject. A sandbox nobody serves (NATS "no responders", mapped by the channel) and a name
the tenant does not own raise the same :class:`SandboxNotFound`, with the client's own name in
the message and no internal subject in the details.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from sandpod_bus import Bus, NoResponders
from sandpod_client import Channel
from sandpod_client.channel import hibernated
from sandpod_contract.codec import Message, decode_reply, encode
from sandpod_contract.errors import SandboxUnavailable, SandpodError
from sandpod_contract.messages.sandboxes import ObjectReply, Ref
from sandpod_contract.resources import Phase
from sandpod_contract.subjects import Subjects
from sandpod_gateway.errors import sandbox_not_found
from sandpod_gateway.tenancy import LIFECYCLE_NAMESPACE, Scope

__all__ = ["Target", "Upstream"]
WAKE_WAIT = 120.0  # seconds a call waits for its hibernated sandbox to wake
POOL_KINDS = frozenset({"pools", "claims"})  # the kinds the pool service answers, not lifecycle

R = TypeVar("R", bound=Message)


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    """One sandbox of one tenant, resolved."""

    upstream: Upstream
    name: str  # the tenant's name for it
    sandbox_id: str
    channel: Channel

    async def call(
        self, family: str, verb: str, msg: Message, reply: type[R], timeout: float | None = None
    ) -> R:
        """One request to the sandbox's execd; its typed reply.

        Raises:
            SandboxNotFound: nobody serves the sandbox.
            SandpodError: the typed error execd answered, or a transport error.
        """
        return await self.channel.call(family, verb, msg, reply, timeout or self.upstream.timeout)


class Upstream:
    def __init__(self, bus: Bus, subjects: Subjects, timeout: float) -> None:
        self.bus = bus
        self.subjects = subjects
        self.timeout = timeout

    def sandbox(self, scope: Scope, name: str) -> Target:
        """The tenant's sandbox ``name``. Raises SandboxNotFound if the tenant cannot own it."""
        sid = scope.sandbox_id(name)
        if sid is None:
            raise sandbox_not_found(name)
        # "no responders" says only the tenant's own name: no id, no internal subject.

        async def wake(_: str) -> bool:
            """A hibernated sandbox answers after the lifecycle woke it (on the tenant's
            subject: only its own sandbox can be woken)."""
            ref = Ref(name=sid, namespace=LIFECYCLE_NAMESPACE)
            try:  # a cheap look first: only a hibernated sandbox is worth a (long) wake
                got = await self.api("sandboxes", "get", ref, ObjectReply, tenant=scope.tenant)
                if not hibernated(got.object):
                    return False
                woken = await self.api(
                    "sandboxes",
                    "wake",
                    Ref(name=sid, namespace=LIFECYCLE_NAMESPACE, wait=WAKE_WAIT),
                    ObjectReply,
                    WAKE_WAIT + 10,
                    tenant=scope.tenant,
                )
            except SandpodError:
                return False
            return bool((woken.object.get("status") or {}).get("phase") == Phase.RUNNING)

        channel = Channel(
            self.bus, self.subjects, sid, not_found=lambda _: sandbox_not_found(name), wake=wake
        )
        return Target(self, name, sid, channel)

    async def api(
        self,
        kind: str,
        verb: str,
        msg: Message,
        reply: type[R],
        timeout: float | None = None,
        *,
        tenant: str,
    ) -> R:
        """One control-plane request, on ``tenant``'s subject (``<prefix>.api.t.<tenant>.…``):
        the service acts for that tenant whatever the request says.

        Raises:
            ResourceNotFound: lifecycle does not know the object.
            SandboxUnavailable: no lifecycle replica answers.
        """
        try:
            data = await self.bus.request(
                self.subjects.api_tenant(tenant, kind, verb), encode(msg), timeout or self.timeout
            )
        except NoResponders as exc:
            service = "pool service" if kind in POOL_KINDS else "control plane (lifecycle)"
            raise SandboxUnavailable(f"the {service} is not answering; retry shortly") from exc
        return decode_reply(reply, data)
