"""The network guard, assembled: the Pod's table, the policy resolver on 127.0.0.1, and the
watch that carries policy updates from the control plane.

    start   table with deny-all (+ NATS) in force --> resolver on 127.0.0.1:<dns_port>
            --> the watch's first answer applied --> ready file (the startup probe: the
            sandbox container starts only after it, under the Sandbox's policy as it is)
    watch   own Sandbox (sandpod_kube.guardwatch, the guard's own read-only credential)
            --status.network.policy changed--> PodFirewall.apply (one nft batch) --> the
            resolver's lookup returns the new policy from the next query on
    stop    SIGTERM/SIGINT: the watch and the resolver end; the table stays (the Pod's netns
            goes with the Pod, and a guard restarted by the kubelet replaces it at once)

The policy the guard enforces is ``status.network.policy``: what lifecycle resolved (the
sandbox's own or its template's) and applied; lifecycle is the only writer of a Sandbox's
status, sandbox code holds no credential at all, so it cannot change what the guard enforces.
Until a policy is known, and once the Sandbox is deleted, deny-all is in force (fail closed);
when the API server is unreachable the last policy stays in force while the watch retries.

execd's NATS connection is always allowed: the firewall accepts the NATS addresses and port
before any policy; and :func:`with_nats` adds the NATS host (when it is a name) and its
addresses as allow rules to the policy the resolver and the chain see, so execd can resolve
its URL's host even under deny-all and an allowlist's private-address screening.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import dns.asyncresolver
import dns.exception
import dns.resolver
import structlog
from prometheus_client import CollectorRegistry

from sandpod_contract.errors import ResourceInvalid, SandpodError, StoreError
from sandpod_contract.network import NetworkMode, NetworkPolicy, Rule
from sandpod_kube.guardreport import write_report
from sandpod_kube.guardwatch import watch_sandbox
from sandpod_lifecycle.network.firewall import UnknownRule
from sandpod_lifecycle.network.metrics import NetworkMetrics
from sandpod_lifecycle.network.nft import Nft, NftError
from sandpod_lifecycle.network.podguard.egress import GuardEgress
from sandpod_lifecycle.network.podguard.firewall import GuardTable, PodFirewall
from sandpod_lifecycle.network.podguard.report import GuardReporter
from sandpod_lifecycle.network.podguard.settings import GuardSettings
from sandpod_lifecycle.network.resolver import NodeResolver
from sandpod_lifecycle.network.sandboxnet import Denial, SandboxNet

__all__ = ["Guard", "policy_of", "with_nats"]

log = structlog.get_logger("sandpod.lifecycle.network.podguard")

DENY_ALL = NetworkPolicy(mode=NetworkMode.DENY_ALL)
RETRY_MIN, RETRY_MAX = 0.5, 10.0  # seconds between two watch attempts after a failure
SECRET_RETRY = 2.0  # seconds to the next read of a Secret the guard could not read


def with_nats(
    policy: NetworkPolicy, host: str, nets: Sequence[ipaddress.IPv4Network], port: int
) -> NetworkPolicy:
    """``policy`` plus allow rules for NATS (its host name, its networks, on ``port``); a
    deny-all policy becomes an allowlist of NATS alone (the same egress: nothing but NATS). A
    host that is an address, or no valid DNS name, adds no name rule (its networks decide)."""
    extra = [Rule.parse("nats", f"{net}:{port}") for net in nets]
    if host and not _is_address(host):
        try:
            extra.append(Rule.parse("nats", f"{host}:{port}"))
        except ResourceInvalid:
            log.warning("nats_host_not_a_rule", host=host)
    if policy.mode is NetworkMode.DENY_ALL:
        return NetworkPolicy(mode=NetworkMode.ALLOWLIST, allow=tuple(extra))
    known = {r.text for r in policy.allow}
    added = tuple(r for r in extra if r.text not in known)
    return dataclasses.replace(policy, allow=(*policy.allow, *added))


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def policy_of(sandbox: Mapping[str, Any] | None) -> NetworkPolicy:
    """The policy lifecycle applied to a Sandbox (``status.network.policy``); deny-all while
    there is none (or no Sandbox).

    Raises:
        ResourceInvalid: the status holds a malformed policy.
    """
    status = (sandbox or {}).get("status") or {}
    network = status.get("network") if isinstance(status, Mapping) else None
    if not isinstance(network, Mapping) or not isinstance(network.get("policy"), Mapping):
        return DENY_ALL
    return NetworkPolicy.from_dict(network["policy"], "status.network.policy")


class _Sink:
    """The resolver's sink: resolved addresses into the guard's timed sets (one nft batch)."""

    def __init__(self, firewall: PodFirewall) -> None:
        self._firewall = firewall

    async def add_resolved(
        self, sandbox_id: str, rule: Rule, addresses: Sequence[tuple[str, int]]
    ) -> None:
        try:
            self._firewall.add_resolved(rule, [(a, float(t)) for a, t in addresses])
        except UnknownRule:  # the policy changed meanwhile: the new one decides
            log.info("resolved_for_a_rule_no_longer_in_force", sandbox_id=sandbox_id)

    async def add_injected(self, sandbox_id: str, addresses: Sequence[tuple[str, int]]) -> None:
        try:  # an inject domain's addresses go to the guard's egress proxy
            self._firewall.add_injected([(a, float(t)) for a, t in addresses])
        except UnknownRule:  # no proxy, or the policy changed meanwhile
            log.debug("injected_without_set", sandbox_id=sandbox_id)


class Guard:
    """One Pod's network guard (module docstring). ``run`` until ``stop`` is set."""

    def __init__(
        self,
        settings: GuardSettings,
        nft: Nft | None = None,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """``nft``: the libnftables handle (None: a new one); ``sleep``: waits between two
        watch attempts (the clock, for tests)."""
        self.settings = settings
        self._nft = nft or Nft()
        self._sleep = sleep
        self._synced = asyncio.Event()  # the watch delivered the Sandbox once
        self.firewall: PodFirewall | None = None
        self._nats: tuple[ipaddress.IPv4Network, ...] = settings.nats_cidrs
        self._source: NetworkPolicy = DENY_ALL  # what the control plane says, unaugmented
        self.registry = CollectorRegistry()
        self.egress: GuardEgress | None = None
        self.refusals = 0  # refused lookups and connections (resolver, proxy)
        self.report: Callable[[Denial], None] | None = None

    def _effective(self, policy: NetworkPolicy) -> NetworkPolicy:
        s = self.settings
        return with_nats(policy, s.nats_host, self._nats, s.nats_port)

    async def _pin_nats(self) -> None:
        """NATS's addresses: configured, the URL's literal address, or its host resolved once
        through the upstreams (the Pod's resolv.conf names the guard itself)."""
        s = self.settings
        if self._nats or not s.nats_host:
            return
        try:
            self._nats = (ipaddress.IPv4Network(f"{ipaddress.IPv4Address(s.nats_host)}/32"),)
            return
        except ValueError:
            pass
        resolver = dns.asyncresolver.Resolver(configure=False)
        resolver.nameservers = [host for host, _ in s.dns.upstreams]
        resolver.port = s.dns.upstreams[0][1]
        try:
            answer = await resolver.resolve(s.nats_host, "A", lifetime=s.dns.deadline)
        except (dns.exception.DNSException, dns.resolver.NoNameservers) as exc:
            log.error("nats_unresolved", host=s.nats_host, error=str(exc))
            return
        self._nats = tuple(ipaddress.IPv4Network(f"{r.address}/32") for r in answer)

    async def run(self, stop: asyncio.Event) -> None:
        """Enforce until ``stop`` is set.

        Raises:
            NftError: the table could not be installed (the guard must not report ready).
            ResolverBindError: 127.0.0.1:<dns_port> is taken.
        """
        s = self.settings
        await self._pin_nats()
        table = GuardTable(s.dns_port, s.proxy_port, tuple((n, s.nats_port) for n in self._nats))
        self.firewall = firewall = PodFirewall(self._nft, table)
        firewall.setup(self._effective(DENY_ALL))

        def lookup(_address: str) -> SandboxNet | None:  # one sandbox per Pod
            return None if firewall.policy is None else SandboxNet(s.sandbox_id, firewall.policy)

        metrics = NetworkMetrics(self.registry)
        resolver = NodeResolver(
            s.dns,
            [("127.0.0.1", s.dns_port)],
            lookup=lookup,
            sink=_Sink(firewall),
            metrics=metrics,
            on_denied=self.on_denied,
        )
        await resolver.start()
        try:
            if s.proxy_port is not None:
                self.egress = GuardEgress(
                    s, lookup, resolver.resolved_names, self.on_denied, metrics.denied
                )
                self.egress.start()
            reporter = self._reporter(firewall)
            self.report = reporter.add
            async with asyncio.TaskGroup() as group:
                follow = group.create_task(self._follow(), name="guard-watch")
                refresh = group.create_task(self._refresh(), name="guard-secrets")
                reports = group.create_task(reporter.run(), name="guard-reports")
                stopping = group.create_task(stop.wait(), name="guard-stop")
                synced = group.create_task(self._synced.wait(), name="guard-synced")
                await asyncio.wait((stopping, synced), return_when=asyncio.FIRST_COMPLETED)
                if synced.done():  # ready = enforcing the Sandbox's policy as it is now
                    s.ready_file.parent.mkdir(parents=True, exist_ok=True)
                    s.ready_file.write_text("enforcing\n")
                    log.info(
                        "guard_ready", sandbox_id=s.sandbox_id, nats=[str(n) for n in self._nats]
                    )
                await stopping
                synced.cancel()
                follow.cancel()
                refresh.cancel()
                reports.cancel()
        finally:
            await resolver.close()
            if self.egress is not None:
                await self.egress.stop()

    async def _follow(self) -> None:
        """Watch the Sandbox forever, re-opening after a failure (backing off)."""
        s = self.settings
        delay = RETRY_MIN
        while True:
            try:
                async for sandbox in watch_sandbox(s.kube, s.namespace, s.sandbox_id):
                    if self.update(sandbox) and self.egress is not None:
                        await self.egress.follow(self._source)  # before ready: secrets, trust
                    self._synced.set()
                    delay = RETRY_MIN
            except StoreError as exc:  # forbidden, expired, unreachable: keep what is in force
                log.warning("guard_watch_failed", error=exc.message, retry_in=delay)
            await self._sleep(delay)
            delay = min(delay * 2, RETRY_MAX)

    def _reporter(self, firewall: PodFirewall) -> GuardReporter:
        """Refusals to the Sandbox's report ConfigMap (``report.py``); the table's drops
        (policy and IPv6) count as ``connect``."""
        s = self.settings

        async def write(text: str) -> None:
            await write_report(s.kube, s.namespace, s.sandbox_id, text)

        def counters() -> dict[str, int]:
            try:
                return {"connect": firewall.denied() + firewall.refused_ipv6()}
            except NftError as exc:
                log.warning("guard_counters_unreadable", error=str(exc))
                return {}

        return GuardReporter(write, counters, interval=s.report_interval, sleep=self._sleep)

    async def _refresh(self) -> None:
        """Re-read the injected Secrets now and then (a rotated value reaches the proxy)."""
        while True:
            secrets = None if self.egress is None else self.egress.secrets
            complete = secrets is None or secrets.complete
            await self._sleep(self.settings.secret_refresh if complete else SECRET_RETRY)
            if secrets is not None:
                await secrets.refresh(self._source)

    def on_denied(self, denial: Denial) -> None:
        """A refusal of the resolver or the proxy (rate-limited by them): logged, and handed
        to ``report`` (the channel to the sandbox's events, when one is wired)."""
        self.refusals += 1
        if self.report is not None:
            self.report(denial)

    def update(self, sandbox: Mapping[str, Any] | None) -> bool:
        """Apply the policy ``sandbox`` carries (deny-all for None) if it changed; whether it
        did."""
        try:
            policy = policy_of(sandbox)
        except SandpodError as exc:  # a malformed status: keep what is in force
            log.error("guard_policy_invalid", error=exc.message)
            return False
        if policy == self._source or self.firewall is None:
            return False
        try:
            self.firewall.apply(self._effective(policy))
        except NftError as exc:
            log.error("guard_policy_not_applied", error=str(exc), detail=exc.detail)
            return False
        self._source = policy
        log.info("guard_policy_applied", sandbox_id=self.settings.sandbox_id, mode=policy.mode)
        return True
