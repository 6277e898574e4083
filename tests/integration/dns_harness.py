"""The node resolver on real loopback sockets, a real authoritative server behind it.

Each harness puts a :class:`NodeResolver` on a random 127.x.y.z address and a free port, with
a test authoritative server (``dnsauth.AuthServer``) as its only upstream; "sandboxes" are
other random 127.x.y.z addresses a client binds its query socket to, so the resolver tells
them apart by source address exactly as it does veth addresses in production.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Sequence
from typing import Any

import dns.asyncquery
import dns.edns
import dns.message
import dns.rcode
from prometheus_client import CollectorRegistry

from dnsauth import AuthServer
from sandpod_contract.network import NetworkPolicy, Rule
from sandpod_lifecycle.network.metrics import NetworkMetrics
from sandpod_lifecycle.network.resolver import NodeResolver, ResolverSettings
from sandpod_lifecycle.network.sandboxnet import Denial, SandboxNet

__all__ = ["FakeClock", "FakeSink", "Harness", "ede_of", "loopback", "policy", "rcode"]


def loopback() -> str:
    """A random loopback address (all of 127/8 is local on Linux): no clash with neighbours."""
    return f"127.{random.randint(1, 254)}.{random.randint(0, 255)}.{random.randint(1, 254)}"


def policy(
    mode: str = "public", allow: Sequence[str] = (), deny: Sequence[str] = ()
) -> NetworkPolicy:
    return NetworkPolicy.from_dict({"mode": mode, "allow": list(allow), "deny": list(deny)})


def ede_of(response: dns.message.Message) -> tuple[int, str | None] | None:
    for option in response.options:
        if isinstance(option, dns.edns.EDEOption):
            return int(option.code), option.text
    return None


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeSink:
    """Records ``add_resolved`` (and ``add_injected``) calls; ``gate`` (when set) holds each
    ``add_resolved`` until it is set."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Rule, list[tuple[str, int]]]] = []
        self.injected: list[tuple[str, list[tuple[str, int]]]] = []  # add_injected calls
        self.called = asyncio.Event()
        self.gate: asyncio.Event | None = None
        self.fail = False

    async def add_resolved(
        self, sandbox_id: str, rule: Rule, addresses: Sequence[tuple[str, int]]
    ) -> None:
        self.calls.append((sandbox_id, rule, list(addresses)))
        self.called.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise OSError("firewall unavailable")

    async def add_injected(self, sandbox_id: str, addresses: Sequence[tuple[str, int]]) -> None:
        self.injected.append((sandbox_id, list(addresses)))
        if self.fail:
            raise OSError("firewall unavailable")


@dataclasses.dataclass
class Harness:
    auth: AuthServer
    resolver: NodeResolver
    sink: Any
    registry: CollectorRegistry
    clock: FakeClock
    sandboxes: dict[str, SandboxNet] = dataclasses.field(default_factory=dict)
    denials: list[Denial] = dataclasses.field(default_factory=list)

    @property
    def host(self) -> str:
        return self.resolver.addresses[0][0]

    @property
    def port(self) -> int:
        return self.resolver.addresses[0][1]

    def sandbox(self, pol: NetworkPolicy, sandbox_id: str | None = None) -> str:
        """A new sandbox under ``pol``; returns its (source) address."""
        source = loopback()
        while source in self.sandboxes or source == self.host:
            source = loopback()
        self.sandboxes[source] = SandboxNet(sandbox_id or f"sbx-{source}", pol)
        return source

    async def ask(
        self,
        source: str,
        name: str,
        rdtype: str = "A",
        tcp: bool = False,
        timeout: float = 10.0,
    ) -> dns.message.Message:
        query = dns.message.make_query(name, rdtype, use_edns=0)
        if tcp:
            return await dns.asyncquery.tcp(
                query, self.host, timeout=timeout, port=self.port, source=source
            )
        return await dns.asyncquery.udp(
            query, self.host, timeout=timeout, port=self.port, source=source
        )

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    async def close(self) -> None:
        await self.resolver.close()
        await self.auth.close()

    @classmethod
    async def start(
        cls,
        sink: Any = None,
        upstreams: tuple[tuple[str, int], ...] | None = None,
        **settings: Any,
    ) -> Harness:
        auth = AuthServer()
        await auth.start()
        registry = CollectorRegistry()
        clock = FakeClock()
        sandboxes: dict[str, SandboxNet] = {}
        denials: list[Denial] = []
        sink = sink if sink is not None else FakeSink()
        defaults: dict[str, Any] = {"attempt_timeout": 1.0, "deadline": 2.0, "max_ttl": 3600}
        resolver = NodeResolver(
            ResolverSettings(upstreams=upstreams or (auth.address,), **{**defaults, **settings}),
            [(loopback(), 0)],
            lookup=sandboxes.get,
            sink=sink,
            metrics=NetworkMetrics(registry),
            on_denied=denials.append,
            clock=clock,
        )
        try:
            await resolver.start()
        except BaseException:
            await auth.close()
            raise
        harness = cls(auth, resolver, sink, registry, clock)
        harness.sandboxes = sandboxes
        harness.denials = denials
        return harness


def rcode(response: dns.message.Message) -> str:
    return dns.rcode.to_text(response.rcode())
