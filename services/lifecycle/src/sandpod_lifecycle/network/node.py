"""The node's network, assembled: the egress (links, firewall), the policy resolver on its
gateway address, and the refusal reports (events, metric).

:func:`start_node_network` is what lifecycle calls once its local runtime exists: it starts the
:class:`Egress`, then a :class:`NodeResolver` on ``(gateway, dns_port)`` whose ``lookup`` is the
firewall's view of sandboxes (source address -> sandbox id and the policy in force) and whose
``sink`` is the firewall's per-sandbox timed sets, then the :class:`DenialWatch` over the
sandboxes' drop counters. Refusals of both become ``network.denied`` events through
``publish`` and count in ``sandpod_lifecycle_network_denied_total{kind}``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import structlog

from sandpod_contract.network import Rule
from sandpod_lifecycle.network.denials import DenialWatch
from sandpod_lifecycle.network.dnssettings import ResolverSettings
from sandpod_lifecycle.network.egress import Egress
from sandpod_lifecycle.network.firewall import UnknownRule
from sandpod_lifecycle.network.metrics import NetworkMetrics
from sandpod_lifecycle.network.nft import NftError
from sandpod_lifecycle.network.resolver import NodeResolver, ResolverBindError
from sandpod_lifecycle.network.sandboxnet import Denial, SandboxNet

__all__ = ["FirewallSink", "NodeNetwork", "start_node_network"]

log = structlog.get_logger("sandpod.lifecycle.network")

# (sandbox id, kind, destination, rule, count) -> publish a network.denied event
Publish = Callable[[str, str, str, str, int], Coroutine[Any, Any, None]]
Spawn = Callable[[Coroutine[Any, Any, None], str], None]


class FirewallSink:
    """The resolver's ``ResolvedSink``: resolved addresses into the sandbox's timed set."""

    def __init__(self, egress: Egress) -> None:
        self._egress = egress

    async def add_resolved(
        self, sandbox_id: str, rule: Rule, addresses: Sequence[tuple[str, int]]
    ) -> None:
        try:  # one nft batch, ~100 µs: no thread hop
            self._egress.add_resolved(sandbox_id, rule, [(a, float(t)) for a, t in addresses])
        except UnknownRule:  # the policy changed meanwhile: the new one decides, nothing opens
            log.info("resolved_for_a_rule_no_longer_in_force", sandbox_id=sandbox_id)
        except NftError as exc:
            log.warning("resolved_not_added", sandbox_id=sandbox_id, error=str(exc))


@dataclasses.dataclass
class NodeNetwork:
    egress: Egress
    resolver: NodeResolver | None
    denials: DenialWatch

    async def close(self) -> None:
        if self.resolver is not None:
            await self.resolver.close()


async def start_node_network(
    egress: Egress,
    dns: ResolverSettings | None,
    metrics: NetworkMetrics,
    *,
    publish: Publish,
    spawn: Spawn,
    poll: float = 5.0,
) -> NodeNetwork:
    """Start the egress, the resolver on its gateway address and the refusal watch (spawned
    through ``spawn``, owned by the caller's supervisor).

    Raises:
        NftError, LinkError, PoolExhausted, OSError, ValueError: no egress on this node.
    """
    await egress.start()

    def lookup(address: str) -> SandboxNet | None:
        found = egress.sandbox_by_address(address)
        return None if found is None else SandboxNet(*found)

    def on_denied(denial: Denial) -> None:
        spawn(
            publish(denial.sandbox_id, str(denial.kind), denial.destination, denial.rule, 1),
            "network-denied-event",
        )

    server = NodeResolver(
        dns if dns is not None else ResolverSettings.from_env(),
        [(str(egress.gateway), egress.settings.dns_port)],
        lookup=lookup,
        sink=FirewallSink(egress),
        metrics=metrics,
        on_denied=on_denied,
    )
    resolver: NodeResolver | None = server
    try:
        await server.start()
    except ResolverBindError as exc:  # sandboxes then get no DNS answers (never unfiltered)
        log.error("resolver_unavailable", error=str(exc))
        resolver = None

    async def report(sandbox_id: str, kind: str, count: int) -> None:
        await publish(sandbox_id, kind, "", "policy", count)

    denials = DenialWatch(egress.denied_counts, report, metrics, poll)
    spawn(denials.run(), "network-denials")
    return NodeNetwork(egress, resolver, denials)
