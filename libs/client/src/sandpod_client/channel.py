"""One sandbox's data plane as a client sees it: typed requests to its execd, errors mapped.

The protocol pieces (one-shot exec, streams, transfers) need only a :class:`Link`: typed
request/reply and publish on the sandbox's subjects, the connection (for a stream's inbox) and
its limits. The SDK's families hand theirs in (the SDK's ``sandpod.channel.Channel`` has that
shape); a test may pass any object with it. :class:`Channel` is the implementation: (bus,
subjects, sandbox id) plus how this client names a missing sandbox, so the transport's "no
responders" becomes the contract's ``sandbox.not_found`` in one place (the contract: no execd
answers for the sandbox, it does not exist or is not ready yet), worded for whoever asked: the
SDK names the sandbox id and suggests ``sandpod up``, the gateway says only the tenant's own
name and no subject.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

from sandpod_bus import Bus, Handler, NoResponders, Subscription
from sandpod_contract.codec import Message, decode_reply, encode
from sandpod_contract.errors import ExecNotFound, SandboxNotFound
from sandpod_contract.messages.exec import ExecRef, ExecStatus
from sandpod_contract.resources import ConditionReason, ConditionType, Phase
from sandpod_contract.subjects import Subjects

__all__ = [
    "CONTROL_TIMEOUT",
    "NO_DEADLINE",
    "Channel",
    "Limits",
    "Link",
    "NotFound",
    "exec_status",
    "hibernated",
    "status_probe",
    "subscribe_inbox",
]

R = TypeVar("R", bound=Message)
NotFound = Callable[[str], SandboxNotFound]  # sandbox id -> the error this client raises
# sandbox id -> whether a hibernated sandbox was woken (then the request is sent again)
Wake = Callable[[str], Awaitable[bool]]

CONTROL_TIMEOUT = 5.0  # a small control request (status, cancel, resume, ack-like calls)
NO_DEADLINE = 10 * 365 * 86400.0  # a request that may wait as long as it likes: liveness ends it


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    """What one message may carry on this connection.

    Attributes:
        max_payload: the server's max payload in bytes; a request or reply above it fails,
            so chunked transfers size their chunks below it.
    """

    max_payload: int


class Link(Protocol):
    """What the protocol pieces need of a sandbox's data plane (see the module docstring)."""

    @property
    def bus(self) -> Bus:
        """The connection, for a stream's own inbox subscription."""
        ...

    @property
    def limits(self) -> Limits:
        """The transport's limits now (the server may differ after a reconnect)."""
        ...

    def subject(self, family: str, verb: str) -> str:
        """The subject of ``family.verb`` on this sandbox."""
        ...

    async def call(self, family: str, verb: str, msg: Message, reply: type[R], timeout: float) -> R:
        """One request/reply with a typed reply; the contract's typed errors."""
        ...

    async def publish(self, family: str, verb: str, msg: Message) -> None:
        """One message with no reply (acks, keepalives)."""
        ...


def hibernated(sandbox: Mapping[str, Any]) -> bool:
    """Whether a Sandbox object (a ``sandboxes.get`` reply) is hibernated, hibernating or
    being woken: a call that found no execd should wake it and wait, not fail."""
    status = sandbox.get("status") or {}
    phase = status.get("phase")
    if phase in (Phase.HIBERNATED, Phase.HIBERNATING):
        return True
    ready: Mapping[str, Any] = next(
        (c for c in status.get("conditions") or () if c.get("type") == ConditionType.READY), {}
    )
    return bool(phase == Phase.PENDING and ready.get("reason") == ConditionReason.WAKING)


def status_probe(link: Link, exec_id: str) -> Callable[[], Awaitable[ExecStatus | None]]:
    """The liveness probe of a running exec (see ``liveness.watch``): its status; None (alive)
    when execd does not know it but the sandbox was woken from hibernation meanwhile -- the
    request that started it is being sent again to the woken execd."""
    woke = getattr(link, "wakes", 0)

    async def probe() -> ExecStatus | None:
        try:
            return await exec_status(link, exec_id)
        except ExecNotFound:
            if getattr(link, "wakes", 0) != woke:
                return None
            raise

    return probe


async def exec_status(link: Link, exec_id: str, timeout: float = CONTROL_TIMEOUT) -> ExecStatus:
    """``exec.status`` of ``exec_id``: the liveness probe of a one-shot exec."""
    return await link.call("exec", "status", ExecRef(exec_id=exec_id), ExecStatus, timeout)


async def subscribe_inbox(
    link: Link, handler: Handler, *, pending_msgs: int, pending_bytes: int
) -> tuple[str, Subscription]:
    """A fresh private inbox (where execd delivers stream frames) and its subscription."""
    inbox = link.bus.new_inbox()
    sub = await link.bus.subscribe(
        inbox, handler, pending_msgs=pending_msgs, pending_bytes=pending_bytes
    )
    return inbox, sub


def _not_found(sandbox_id: str) -> SandboxNotFound:
    return SandboxNotFound(f"sandbox {sandbox_id!r} has no execd answering", sandbox_id=sandbox_id)


@dataclasses.dataclass(frozen=True, slots=True)
class Channel:
    """Requests and publishes on one sandbox's subjects.

    Attributes:
        bus: the connection.
        subjects: the installation's subject names (prefix, tenant).
        sandbox_id: the sandbox's id (its subjects' token).
        not_found: builds the error for "no execd answers" (the caller's wording).
    """

    bus: Bus
    subjects: Subjects
    sandbox_id: str
    not_found: NotFound = _not_found
    wake: Wake | None = None
    _woken: list[int] = dataclasses.field(default_factory=lambda: [0], compare=False, repr=False)

    @property
    def wakes(self) -> int:
        """How many times a call found the sandbox hibernated and began to wake it (liveness
        probes compare it: an exec unknown since a wake began is being sent again, not lost)."""
        return self._woken[0]

    def subject(self, family: str, verb: str) -> str:
        return self.subjects.sandbox(self.sandbox_id, family, verb)

    @property
    def limits(self) -> Limits:
        """The transport's limits now."""
        return Limits(max_payload=self.bus.max_payload)

    async def call(self, family: str, verb: str, msg: Message, reply: type[R], timeout: float) -> R:
        """One request to the sandbox's execd; its typed reply.

        A sandbox that hibernated has no execd: with ``wake`` set, the request waits while the
        lifecycle wakes it (restores its instance), then is sent again -- the caller sees a
        slower answer, never a lost request.

        Raises:
            SandboxNotFound: no execd serves the sandbox (``not_found``'s error).
            RequestTimeout, ConnectionLost, PayloadTooLarge: the transport's.
            SandpodError: the typed error execd answered.
        """
        subject, data = self.subject(family, verb), encode(msg)
        try:
            answer = await self.bus.request(subject, data, timeout)
        except NoResponders as exc:
            if self.wake is None:
                raise self.not_found(self.sandbox_id) from exc
            # Counted before the wake returns: the woken execd may answer a liveness probe
            # ("exec unknown") while this request still waits to be sent again to it.
            self._woken[0] += 1
            if not await self.wake(self.sandbox_id):
                raise self.not_found(self.sandbox_id) from exc
            try:
                answer = await self.bus.request(subject, data, timeout)
            except NoResponders as again:
                raise self.not_found(self.sandbox_id) from again
        return decode_reply(reply, answer)

    async def publish(self, family: str, verb: str, msg: Message) -> None:
        """Fire and forget (acks). Raises ConnectionLost, PayloadTooLarge."""
        await self.bus.publish(self.subject(family, verb), encode(msg))
