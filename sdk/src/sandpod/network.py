"""The ``network`` family: a sandbox's egress policy, read and changed at runtime (``sbx.network``).

    sbx.network.get()                                   # NetworkView: mode, allow, deny, applied?
    sbx.network.update(mode="allowlist", allow=["api.example.com:443", "10.0.0.0/8"])
    sbx.network.update(deny=["evil.example.com"])       # other fields keep their value
    sbx.network.reset()                                 # back to the template's policy

Data flow: ``update`` reads the sandbox's effective policy (``<prefix>.api.sandboxes.network``),
replaces the fields given, checks the result with the contract's model (a bad rule is a typed
``ResourceInvalid`` naming the field, before anything is sent) and sends it
(``<prefix>.api.sandboxes.set_network``) with the generation it read, so two concurrent updates
never silently overwrite each other (the loser re-reads and retries). The lifecycle service
stores it in ``spec.network``; its reconciler applies it to the running instance and records
what the runtime made of it, which the returned view shows (``applied``, ``enforced``,
``reason``) once ``wait`` allowed it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from typing import Any

from sandpod._twins import iterate, twin
from sandpod.control import api_call, follow_events
from sandpod_bus import Bus
from sandpod_contract.errors import ResourceConflict
from sandpod_contract.messages.sandboxes import NetworkEvent, NetworkState, NetworkUpdate, Ref
from sandpod_contract.network import NetworkPolicy
from sandpod_contract.subjects import Subjects

__all__ = ["AsyncNetwork", "Network", "NetworkView"]

APPLY_WAIT = 10.0  # seconds an update waits for the runtime to apply it, by default
MAX_RACES = 5  # concurrent updates lost in a row before giving up with ResourceConflict


@dataclasses.dataclass(frozen=True, slots=True)
class NetworkView:
    """A sandbox's egress policy: the one it should run under (``policy``: its own, or its
    template's per ``source``) and what its runtime made of it."""

    sandbox: str
    policy: NetworkPolicy
    source: str  # "sandbox" (set on it) or "template" (its template's)
    generation: int  # the Sandbox's generation
    applied: bool  # the runtime applied ``policy`` for this generation
    enforced: bool  # ... and enforces all of it
    reason: str  # what is not enforced and why

    @property
    def mode(self) -> str:
        return self.policy.mode.value

    @property
    def allow(self) -> tuple[str, ...]:
        return tuple(r.text for r in self.policy.allow)

    @property
    def deny(self) -> tuple[str, ...]:
        return tuple(r.text for r in self.policy.deny)

    @property
    def limits(self) -> dict[str, int]:
        return self.policy.limits.to_dict()

    def to_dict(self) -> dict[str, Any]:
        """The view as plain data (what ``sandpod network -o json`` prints)."""
        return {
            "sandbox": self.sandbox,
            **self.policy.to_dict(),
            "source": self.source,
            "generation": self.generation,
            "applied": self.applied,
            "enforced": self.enforced,
            "reason": self.reason,
        }

    @classmethod
    def of(cls, state: NetworkState, sandbox: str) -> NetworkView:
        policy = NetworkPolicy.from_dict(state.policy)
        applied = (
            state.applied is not None
            and state.applied_generation >= state.generation
            and NetworkPolicy.from_dict(state.applied) == policy
        )
        return cls(
            sandbox=sandbox,
            policy=policy,
            source=state.source,
            generation=state.generation,
            applied=applied,
            enforced=applied and state.enforced,
            reason=state.reason if applied else "not applied yet",
        )


def merged(
    current: NetworkPolicy,
    *,
    mode: str | None = None,
    allow: Iterable[str] | None = None,
    deny: Iterable[str] | None = None,
    limits: Mapping[str, int] | None = None,
    inject: Iterable[Mapping[str, str]] | None = None,
) -> NetworkPolicy:
    """``current`` with the given fields replaced. Raises ResourceInvalid naming the field."""
    wire = current.to_dict()
    for key, value in (("allow", allow), ("deny", deny), ("inject", inject)):
        if value is not None:
            wire[key] = [dict(v) if isinstance(v, Mapping) else v for v in value]
    if mode is not None:
        wire["mode"] = mode  # checked below, with the field named
    if limits is not None:
        wire["limits"] = dict(limits)
    return NetworkPolicy.from_dict(wire, "spec.network")


class AsyncNetwork:
    """The egress policy of one sandbox (``AsyncSandbox.network``)."""

    def __init__(self, bus: Bus, subjects: Subjects, sandbox_id: str) -> None:
        self._bus = bus
        self._subjects = subjects
        self._id = sandbox_id

    async def _state(self) -> NetworkState:
        ref = Ref(name=self._id)
        state: NetworkState = await api_call(
            self._bus, self._subjects, "sandboxes", "network", ref, NetworkState
        )
        return state

    def events(self) -> AsyncIterator[NetworkEvent]:
        """Live network events of this sandbox, until the iteration is left: ``denied`` (a
        refused lookup or connection: ``kind`` dns/rebinding/connect/sni, ``destination`` such
        as ``203.0.113.9:443/tcp`` or a name, ``count`` of refusals it stands for; rate-limited
        per sandbox) and ``updated`` (a policy applied)."""
        return follow_events(self._bus, self._subjects, self._id, "network", NetworkEvent)

    async def get(self) -> NetworkView:
        """The sandbox's effective egress policy and whether its runtime applied it.

        Raises:
            ResourceNotFound: no such sandbox (or not this tenant's).
        """
        return NetworkView.of(await self._state(), self._id)

    async def update(
        self,
        *,
        mode: str | None = None,
        allow: Iterable[str] | None = None,
        deny: Iterable[str] | None = None,
        limits: Mapping[str, int] | None = None,
        inject: Iterable[Mapping[str, str]] | None = None,
        wait: float = APPLY_WAIT,
    ) -> NetworkView:
        """Change the sandbox's egress policy now; fields not given keep their value.

        Args:
            mode: ``public``, ``allowlist`` or ``deny-all``.
            allow, deny: the rule lists (replaced): names (``example.com``,
                ``*.example.com``), addresses or CIDRs, each with an optional ``:port`` or
                ``:low-high``; deny beats allow.
            limits: ``bandwidthBytesPerSecond``, ``maxConnections``.
            inject: header injections (``domain``, ``secret``, ``header``, ``format``).
            wait: seconds to wait for the runtime to apply it (0: do not wait).

        Raises:
            ResourceInvalid: a bad mode or rule, naming the field (``spec.network.allow[1]``).
            ResourceNotFound: no such sandbox (or not this tenant's).
            ResourceConflict: other updates kept winning the race.
        """
        for _ in range(MAX_RACES):
            state = await self._state()
            policy = merged(
                NetworkPolicy.from_dict(state.policy),
                mode=mode,
                allow=allow,
                deny=deny,
                limits=limits,
                inject=inject,
            )
            req = NetworkUpdate(
                name=self._id,
                policy=policy.to_dict(),
                generation=state.generation,
                wait=wait or None,
            )
            try:
                return await self._send(req, wait)
            except ResourceConflict:
                continue  # someone else changed it between our read and write: read again
        raise ResourceConflict(
            f"the network policy of {self._id!r} keeps changing; retry", name=self._id
        )

    async def reset(self, wait: float = APPLY_WAIT) -> NetworkView:
        """Drop the sandbox's own policy: its template's applies again."""
        return await self._send(NetworkUpdate(name=self._id, reset=True, wait=wait or None), wait)

    async def _send(self, req: NetworkUpdate, wait: float) -> NetworkView:
        state: NetworkState = await api_call(
            self._bus,
            self._subjects,
            "sandboxes",
            "set_network",
            req,
            NetworkState,
            timeout=wait + 10,
        )
        return NetworkView.of(state, self._id)


class Network:
    """Blocking twin of :class:`AsyncNetwork` (``Sandbox.network``)."""

    def __init__(self, inner: AsyncNetwork) -> None:
        self._inner = inner

    def events(self) -> Iterator[NetworkEvent]:
        """See :meth:`AsyncNetwork.events` (blocking; break out of the loop to stop)."""
        return iterate(self._inner.events())

    get = twin(AsyncNetwork.get)
    update = twin(AsyncNetwork.update)
    reset = twin(AsyncNetwork.reset)
