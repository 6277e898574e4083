"""What an SDK family needs from its sandbox: the small public protocol the families depend on.

The per-family clients (``exec``, ``fs``, ``proc``, ``session``, ``pty``, ``watch``, ``git``)
never see :class:`~sandpod.aio.AsyncSandbox`. Each is given a :class:`Channel`: request/reply
on the sandbox's own subjects with a typed reply and a deadline (:meth:`Channel.call`), a
fire-and-forget publish (:meth:`Channel.publish`), the subject of one verb
(:meth:`Channel.subject`), the transport's limits (:attr:`Channel.limits`) and the connection
itself for the inbox subscriptions of streams (:attr:`Channel.bus`). That is the protocol
client's :class:`sandpod_client.Link` plus the sandbox id, so a family hands its channel
straight to :mod:`sandpod_client` (one-shot exec, streams, transfers: one copy shared with the
gateway). :func:`bus_channel` builds the implementation ``AsyncSandbox`` hands out (the
protocol client's :class:`sandpod_client.Channel`, worded for SDK users); a test may pass any
object with the same shape.

Data flow: family → ``call(family, verb, msg, Reply, timeout)`` → encode → NATS request on
``<prefix>.sandbox.<id>.<family>.<verb>`` → execd → decode into ``Reply`` or the contract's
typed error. The families import this module and the contract, never ``sandpod.aio`` (an
import-linter contract in pyproject.toml keeps it so).

The request timings every family shares are here too (the protocol client's, so the SDK and
the gateway cannot drift apart).
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from sandpod_bus import Bus
from sandpod_client import CONTROL_TIMEOUT, NO_DEADLINE, REPLY_SLACK, Limits, Link
from sandpod_client import Channel as WireChannel
from sandpod_client.channel import hibernated
from sandpod_contract.codec import Message, decode_reply, encode
from sandpod_contract.errors import SandboxNotFound
from sandpod_contract.subjects import Subjects, validate_sandbox_id

__all__ = [
    "CONTROL_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "NO_DEADLINE",
    "REPLY_SLACK",
    "Channel",
    "Limits",
    "bus_channel",
]

R = TypeVar("R", bound=Message)

DEFAULT_TIMEOUT = 60.0  # a command's default run time
WAKE_WAIT = 120.0  # seconds a call waits for its hibernated sandbox to wake


class Channel(Link, Protocol):
    """The requests a family sends to one sandbox (see the module docstring): the protocol
    client's :class:`~sandpod_client.Link` (one definition of ``bus``, ``limits``, ``subject``,
    ``call`` and ``publish``) plus the sandbox's id."""

    @property
    def sandbox_id(self) -> str:
        """The sandbox's id (validated)."""
        ...


def bus_channel(bus: Bus, subjects: Subjects, sandbox_id: str) -> WireChannel:
    """The :class:`Channel` ``AsyncSandbox`` hands its families: the protocol client's, with
    "no execd answers" worded for an SDK user (which sandbox, and the likely fix).

    Raises:
        BadRequest: ``sandbox_id`` is not a valid sandbox id.
    """
    sid = validate_sandbox_id(sandbox_id)

    async def wake(name: str) -> bool:
        """Ask the lifecycle to wake ``name`` if it hibernated (True: it runs now)."""
        from sandpod_contract.errors import SandpodError
        from sandpod_contract.messages.sandboxes import ObjectReply, Ref  # lazy: rare path
        from sandpod_contract.resources import Phase

        try:  # a cheap look first: only a hibernated sandbox is worth a (long) wake
            data = await bus.request(
                subjects.api("sandboxes", "get"), encode(Ref(name=name)), CONTROL_TIMEOUT
            )
            if not hibernated(decode_reply(ObjectReply, data).object):
                return False
            data = await bus.request(
                subjects.api("sandboxes", "wake"),
                encode(Ref(name=name, wait=WAKE_WAIT)),
                WAKE_WAIT + REPLY_SLACK,
            )
            woken = decode_reply(ObjectReply, data)
        except SandpodError:
            return False  # no such sandbox, no lifecycle: the caller's not-found stands
        return bool((woken.object.get("status") or {}).get("phase") == Phase.RUNNING)

    return WireChannel(bus, subjects, sid, not_found=_not_found, wake=wake)


def _not_found(sandbox_id: str) -> SandboxNotFound:
    return SandboxNotFound(
        f"sandbox {sandbox_id!r} has no execd answering; is it running (`sandpod up`)?",
        sandbox_id=sandbox_id,
    )
