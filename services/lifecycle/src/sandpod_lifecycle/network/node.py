"""The node's network, assembled: the egress (links, firewall), the policy resolver on its
gateway address, and the refusal reports (events, metric).

:func:`start_node_network` is what lifecycle calls once its local runtime exists: it starts the
:class:`Egress`, then a :class:`NodeResolver` on ``(gateway, dns_port)`` whose ``lookup`` is the
firewall's view of sandboxes (source address -> sandbox id and the policy in force) and whose
``sink`` is the firewall's per-sandbox timed sets, then the :class:`DenialWatch` over the
sandboxes' drop counters (the metric) and the :class:`DenialLog` over the egress's NFLOG group
(each refused connection's destination; without a group the watch reports counts), and
(unless ``SANDPOD_NET_PROXY_PORT=off``) the :class:`EgressProxy` on ``(gateway, proxy_port)``
in its own thread (and on the v6 gateway address when sandboxes have IPv6, as the resolver),
where the firewall sends name-rule addresses on 80/443 and (any mode) those
the resolver answered for an ``inject`` domain (``FirewallSink.add_injected``): it checks each
connection's TLS SNI / HTTP Host against the policy and the resolver's record, and injects the
headers of ``policy.inject`` with secrets from the node's store. Refusals of all three become
``network.denied`` events through ``publish`` and count in
``sandpod_lifecycle_network_denied_total{kind}``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import CollectorRegistry

from sandpod_contract.network import NetworkPolicy, Rule
from sandpod_lifecycle.network.ca import CaError, InterceptionCA
from sandpod_lifecycle.network.denials import DenialLog, DenialWatch
from sandpod_lifecycle.network.dnssettings import ResolverSettings
from sandpod_lifecycle.network.egress import Egress
from sandpod_lifecycle.network.firewall import UnknownRule
from sandpod_lifecycle.network.metrics import NetworkMetrics
from sandpod_lifecycle.network.nft import NftError
from sandpod_lifecycle.network.proxy import EgressProxy
from sandpod_lifecycle.network.proxyconfig import ProxySettings
from sandpod_lifecycle.network.proxymetrics import ProxyMetrics
from sandpod_lifecycle.network.proxythread import ProxyThread, listen
from sandpod_lifecycle.network.resolver import NodeResolver, ResolverBindError
from sandpod_lifecycle.network.sandboxnet import Denial, SandboxNet
from sandpod_lifecycle.network.secretstore import FileSecretStore
from sandpod_lifecycle.network.trust import SandboxTrust, sandbox_trust
from sandpod_lifecycle.network.verdict import HardDenies

__all__ = ["FirewallSink", "NodeNetwork", "ProxyWiring", "start_node_network"]

log = structlog.get_logger("sandpod.lifecycle.network")

# (sandbox id, kind, destination, rule, count) -> publish a network.denied event
Publish = Callable[[str, str, str, str, int], Coroutine[Any, Any, None]]
Spawn = Callable[[Coroutine[Any, Any, None], str], None]


class FirewallSink:
    """The resolver's ``ResolvedSink``: resolved addresses into the sandbox's timed sets (a
    name rule's, or its injection set)."""

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

    async def add_injected(self, sandbox_id: str, addresses: Sequence[tuple[str, int]]) -> None:
        try:  # one nft batch, ~100 µs: no thread hop
            self._egress.add_injected(sandbox_id, [(a, float(t)) for a, t in addresses])
        except UnknownRule:  # no injection set (no proxy, or the policy changed meanwhile)
            log.debug("injected_without_set", sandbox_id=sandbox_id)
        except NftError as exc:
            log.warning("injected_not_added", sandbox_id=sandbox_id, error=str(exc))


@dataclasses.dataclass(frozen=True, slots=True)
class ProxyWiring:
    """What the egress proxy needs besides the egress: its settings, where the interception
    authorities (``egress-ca/``) and the secrets (``secrets/``) live, and the metrics registry.
    """

    settings: ProxySettings
    state_dir: Path
    installation_id: str
    registry: CollectorRegistry


@dataclasses.dataclass
class NodeNetwork:
    egress: Egress
    resolver: NodeResolver | None
    denials: DenialWatch
    proxy: ProxyThread | None = None
    ca: InterceptionCA | None = None
    log: DenialLog | None = None

    def trust(self, policy: NetworkPolicy) -> SandboxTrust:
        """What a sandbox under ``policy`` must trust and carry for its header injections
        (nothing when it injects none, or when this node runs no proxy)."""
        if self.ca is None or not policy.inject:
            return SandboxTrust("", {})
        return sandbox_trust(self.ca, policy)

    async def close(self) -> None:
        if self.log is not None:
            self.log.close()
        self.egress.close_log()
        if self.resolver is not None:
            await self.resolver.close()
        if self.proxy is not None:
            await asyncio.to_thread(self.proxy.stop)


async def start_node_network(
    egress: Egress,
    dns: ResolverSettings | None,
    metrics: NetworkMetrics,
    *,
    publish: Publish,
    spawn: Spawn,
    poll: float = 5.0,
    proxy: ProxyWiring | None = None,
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

    listen = [(str(egress.gateway), egress.settings.dns_port)]
    if egress.gateway6 is not None:  # the v6 port-53 DNAT's target
        listen.append((str(egress.gateway6), egress.settings.dns_port))
    server = NodeResolver(
        dns if dns is not None else ResolverSettings.from_env(),
        listen,
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

    reader = None
    if egress.log is not None and egress.firewall is not None:
        reader = DenialLog(egress.log, egress.firewall.sandbox_of_log, publish, metrics)
        spawn(reader.run(), "network-denied-log")
    denials = DenialWatch(egress.denied_counts, report if reader is None else None, metrics, poll)
    spawn(denials.run(), "network-denials")
    node = NodeNetwork(egress, resolver, denials, log=reader)
    if proxy is not None and egress.settings.proxy_port is not None:
        _start_proxy(node, proxy, lookup, on_denied, metrics)
    return node


def _start_proxy(
    node: NodeNetwork,
    wiring: ProxyWiring,
    lookup: Callable[[str], SandboxNet | None],
    on_denied: Callable[[Denial], None],
    metrics: NetworkMetrics,
) -> None:
    """The egress proxy in its thread, listening on (gateway, proxy_port). A proxy that cannot
    start leaves the firewall sending name-rule 80/443 traffic to a closed port: refused, never
    let through unchecked."""
    egress = node.egress
    port = egress.settings.proxy_port
    resolver = node.resolver

    def resolved_names(sandbox_id: str, address: str) -> set[str]:
        return set() if resolver is None else resolver.resolved_names(sandbox_id, address)

    try:
        ca = InterceptionCA(wiring.state_dir / "egress-ca", wiring.installation_id)
        server = EgressProxy(
            wiring.settings,
            lookup=lookup,
            resolved_names=resolved_names,
            on_denied=on_denied,
            forbidden=HardDenies(
                [egress.settings.pool, egress.settings.pool6, *egress.settings.hard_deny]
            ),
            ca=ca,
            secrets=FileSecretStore(wiring.state_dir / "secrets"),
            metrics=ProxyMetrics(wiring.registry, denied=metrics.denied),
            owner_loop=asyncio.get_running_loop(),
        )
        sockets = [listen(str(egress.gateway), port or 0)]
        if egress.gateway6 is not None:  # name rules' v6 addresses are DNAT'ed here
            sockets.append(listen(str(egress.gateway6), port or 0))
        thread = ProxyThread(server, sockets)
        thread.start()
    except (OSError, ValueError, RuntimeError, CaError) as exc:
        log.error("egress_proxy_unavailable", error=str(exc), port=port)
        return
    node.proxy, node.ca = thread, ca
    log.info("egress_proxy_ready", address=str(egress.gateway), port=port)
