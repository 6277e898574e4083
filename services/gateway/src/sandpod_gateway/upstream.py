"""Requests the gateway makes on NATS for a client: the one place HTTP meets the bus.

``Upstream.sandbox(scope, name)`` resolves a tenant's sandbox name to its data-plane subjects
(or raises the uniform 404), ``Target.call`` sends one typed request to that sandbox's execd, and
``Upstream.api`` one control-plane request to lifecycle or pool on the tenant's own subject.
A sandbox nobody serves (NATS "no responders") and a name the tenant does not own raise the
same :class:`SandboxNotFound`, with the client's own name in the message and no internal
subject in the details.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from sandpod_bus import Bus
from sandpod_contract.codec import Message, decode_reply, encode
from sandpod_contract.errors import SandboxNotFound, SandboxUnavailable
from sandpod_contract.subjects import Subjects
from sandpod_gateway.errors import sandbox_not_found
from sandpod_gateway.tenancy import Scope

__all__ = ["Target", "Upstream"]

R = TypeVar("R", bound=Message)


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    """One sandbox of one tenant, resolved."""

    upstream: Upstream
    name: str  # the tenant's name for it
    sandbox_id: str

    def subject(self, family: str, verb: str) -> str:
        return self.upstream.subjects.sandbox(self.sandbox_id, family, verb)

    async def call(
        self, family: str, verb: str, msg: Message, reply: type[R], timeout: float | None = None
    ) -> R:
        """One request to the sandbox's execd; its typed reply.

        Raises:
            SandboxNotFound: nobody serves the sandbox.
            SandpodError: the typed error execd answered, or a transport error.
        """
        try:
            data = await self.upstream.bus.request(
                self.subject(family, verb), encode(msg), timeout or self.upstream.timeout
            )
        except SandboxNotFound:
            raise sandbox_not_found(self.name) from None
        return decode_reply(reply, data)

    async def publish(self, family: str, verb: str, msg: Message) -> None:
        await self.upstream.bus.publish(self.subject(family, verb), encode(msg))


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
        return Target(self, name, sid)

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
        except SandboxNotFound as exc:
            raise SandboxUnavailable("the control plane (lifecycle) is not answering") from exc
        return decode_reply(reply, data)
