"""What an SDK family needs from its sandbox: the small public protocol the families depend on.

The per-family clients (``exec``, ``fs``, ``proc``, ``session``, ``pty``, ``watch``, ``git``)
never see :class:`~sandpod.aio.AsyncSandbox`. Each is given a :class:`Channel`: request/reply
on the sandbox's own subjects with a typed reply and a deadline (:meth:`Channel.call`), a
fire-and-forget publish (:meth:`Channel.publish`), the subject of one verb
(:meth:`Channel.subject`), the transport's limits (:attr:`Channel.limits`) and the connection
itself for the inbox subscriptions of streams (:attr:`Channel.bus`). :class:`BusChannel` is
the implementation ``AsyncSandbox`` hands out; a test may pass any object with the same shape.

Data flow: family → ``call(family, verb, msg, Reply, timeout)`` → encode → NATS request on
``<prefix>.sandbox.<id>.<family>.<verb>`` → execd → decode into ``Reply`` or the contract's
typed error. The families import this module and the contract, never ``sandpod.aio`` (an
import-linter contract in pyproject.toml keeps it so).

The request timings every family shares live here too, so they cannot drift apart.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, TypeVar

from sandpod_bus import Bus
from sandpod_contract.codec import Message, decode_reply, encode
from sandpod_contract.errors import SandboxNotFound
from sandpod_contract.subjects import Subjects, validate_sandbox_id

__all__ = [
    "CONTROL_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "NO_DEADLINE",
    "REPLY_SLACK",
    "BusChannel",
    "Channel",
    "Limits",
]

R = TypeVar("R", bound=Message)

DEFAULT_TIMEOUT = 60.0  # a command's default run time
CONTROL_TIMEOUT = 5.0  # a control request (status, list, signal): execd answers at once
REPLY_SLACK = 10.0  # execd enforces the command timeout; the reply may take this much longer
NO_DEADLINE = 10 * 365 * 86400.0  # "no limit" for requests whose liveness is probed instead


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    """What one message may carry on this connection.

    Attributes:
        max_payload: the server's max payload in bytes; a request or reply above it fails,
            so chunked transfers size their chunks below it.
    """

    max_payload: int


class Channel(Protocol):
    """The requests a family sends to one sandbox (see the module docstring)."""

    @property
    def sandbox_id(self) -> str:
        """The sandbox's id (validated)."""
        ...

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
        """One request/reply; see :meth:`BusChannel.call`."""
        ...

    async def publish(self, family: str, verb: str, msg: Message) -> None:
        """One message with no reply; see :meth:`BusChannel.publish`."""
        ...


class BusChannel:
    """A :class:`Channel` over a :class:`~sandpod_bus.Bus`: what ``AsyncSandbox`` hands out."""

    def __init__(self, bus: Bus, subjects: Subjects, sandbox_id: str) -> None:
        self._bus = bus
        self._subjects = subjects
        self._id = validate_sandbox_id(sandbox_id)

    @property
    def sandbox_id(self) -> str:
        return self._id

    @property
    def bus(self) -> Bus:
        return self._bus

    @property
    def limits(self) -> Limits:
        return Limits(max_payload=self._bus.max_payload)

    def subject(self, family: str, verb: str) -> str:
        return self._subjects.sandbox(self._id, family, verb)

    async def call(self, family: str, verb: str, msg: Message, reply: type[R], timeout: float) -> R:
        """Send ``msg`` to ``family.verb`` and decode the answer as ``reply``.

        Raises:
            SandboxNotFound: no execd answers for this sandbox (the message says what to check).
            RequestTimeout, ConnectionLost, PayloadTooLarge: from the transport.
            SandpodError: the typed error execd answered with.
        """
        try:
            data = await self._bus.request(self.subject(family, verb), encode(msg), timeout)
        except SandboxNotFound as exc:
            raise SandboxNotFound(
                f"sandbox {self._id!r} has no execd answering; is it running (`sandpod up`)?",
                sandbox_id=self._id,
            ) from exc
        return decode_reply(reply, data)

    async def publish(self, family: str, verb: str, msg: Message) -> None:
        """Publish ``msg`` on ``family.verb`` (no reply; acks, keepalives).

        Raises:
            ConnectionLost, PayloadTooLarge: from the transport.
        """
        await self._bus.publish(self.subject(family, verb), encode(msg))
