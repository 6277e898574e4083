"""A node's egress: one installation's address slice, gateway link and table, and its sandboxes.

:class:`Egress` is what the local runtime calls (all ``async``; the blocking work runs in a
thread): ``start`` claims the slice, enables forwarding, creates the gateway link and the table,
and cleans what a crashed run left (links, chains and records of sandboxes that are gone);
``attach`` gives a sandbox whose holder runs its veth, address and chain; ``apply`` swaps its
policy (one nft batch); ``detach`` removes all of it; ``stop`` removes the table and the gateway
link. The resolver and the proxy use :attr:`gateway`, :meth:`sandbox_by_address`,
:meth:`add_resolved` and :meth:`add_injected`.

IPv6 (``EgressSettings.ipv6``: None = when the host has it): ``start`` also claims a /64 of the
v6 pool, enables IPv6 forwarding (``ipv6.enable_forwarding``: router advertisements kept where
they were accepted) and puts the v6 gateway address on the gateway link; each sandbox then gets
a /127 next to its /31 and the IPv6 twin of its chain. When the host cannot, or the setting is
off, :attr:`ipv6_off` says why (a note at start, each sandbox's ``egress_ipv6`` protection)
and every IPv6 packet of a sandbox is refused.

``start`` also binds the installation's NFLOG group (``nflog.py``: the first free one from a
number derived from the installation id, or ``log_group``) before any chain is written, since
every sandbox chain logs its refusals to it; :attr:`log` is that socket (None: refusals are
only counted, noted at start), read by ``denials.DenialLog``, closed by :meth:`close_log` and
:meth:`stop`.

Each attached sandbox has a record (``records.py``), written before its link exists, so a
restarted lifecycle knows every link and chain that is its own. While started, an installation
holds a shared lock on ``<registry dir>/net-alive/<id>.lock`` (``liveness.py``): another
installation starting on the host removes the table and links of one whose state dir is gone, or
whose lock nobody holds and which has no sandbox link left (a crash, or a stop that kept its
state dir), gives back its slices so the pool never runs out of dead installations' claims, and
never touches a running one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path

import structlog

from sandpod_contract.network import NetworkPolicy, Rule
from sandpod_lifecycle.network import ipv6, link, liveness
from sandpod_lifecycle.network.addressing import (
    DEFAULT_POOL,
    DEFAULT_POOL6,
    DEFAULT_REGISTRY,
    AddressPlan,
    SandboxAddresses,
    claim_slice,
    claim_slice6,
    claimed_ids,
    release,
    release_stale,
)
from sandpod_lifecycle.network.firewall import Firewall, FirewallConfig
from sandpod_lifecycle.network.nflog import NflogSocket, NflogUnavailable, preferred_group
from sandpod_lifecycle.network.nft import Nft, NftError
from sandpod_lifecycle.network.records import NetRecord, Records

__all__ = ["Egress", "EgressSettings"]

log = structlog.get_logger("sandpod.lifecycle.network")

IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
REAP_BATCH = 64  # dead installations judged per batch (each holds a lock descriptor)


@dataclasses.dataclass(frozen=True, slots=True)
class EgressSettings:
    """The node's egress settings (``SANDPOD_NET_*``, see ``settings.py``).

    Attributes:
        enabled: give local sandboxes a network at all (off: loopback only).
        pool: the host-wide pool installations take /20 slices of.
        registry: where slices are claimed host-wide (None: the preferred slice, unrecorded).
        gateway_uid: the host uid that may open connections into sandboxes (the API
            gateway's); None: the lifecycle's own uid.
        dns_port: the resolver's port on the gateway address.
        proxy_port: the egress proxy's port there (None: no proxy).
        hard_deny: networks no policy can open (the platform's own, when on other hosts).
        log_denials: log refused packets to an NFLOG group (their destination in events).
        log_group: the first NFLOG group to try (None: derived from the installation id).
        ipv6: give sandboxes IPv6 egress (None: when the host has IPv6; False: never).
        pool6: the host-wide IPv6 pool installations take /64 slices of.
    """

    enabled: bool = True
    pool: ipaddress.IPv4Network = DEFAULT_POOL
    registry: Path | None = DEFAULT_REGISTRY
    gateway_uid: int | None = None
    dns_port: int = 53
    proxy_port: int | None = None
    hard_deny: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    log_denials: bool = True
    log_group: int | None = None
    ipv6: bool | None = None
    pool6: ipaddress.IPv6Network = DEFAULT_POOL6


class Egress:
    """One installation's egress on this node (see the module docstring)."""

    def __init__(
        self,
        settings: EgressSettings,
        installation_id: str,
        state_dir: Path,
        records: Path,
        nft: Nft | None = None,
    ) -> None:
        self.settings = settings
        self.installation_id = installation_id
        self._state_dir = state_dir
        self._records = Records(records)
        self._nft = nft
        self.links = link.LinkNames.of(installation_id)
        self.firewall: Firewall | None = None
        self.notes: list[str] = []
        self._alive: int | None = None  # the liveness lock's descriptor while started
        self.log: NflogSocket | None = None  # the NFLOG group refusals are logged to
        self.ipv6_off: str | None = None  # why sandboxes get no IPv6 (None: they do)
        # sandbox -> the policy its chain (and bandwidth) was last built from, successfully
        self._in_force: dict[str, NetworkPolicy] = {}

    # -- the installation ----------------------------------------------------------------------

    @property
    def plan(self) -> AddressPlan:
        return self._firewall().config.plan

    @property
    def gateway(self) -> ipaddress.IPv4Address:
        """The address the node's resolver (port ``dns_port``) and proxy listen on."""
        return self.plan.gateway

    @property
    def gateway6(self) -> ipaddress.IPv6Address | None:
        """The v6 address the resolver and proxy listen on too (None: no IPv6)."""
        return self.plan.gateway6

    @property
    def table(self) -> str:
        return f"sandpod_{self.installation_id}"

    async def start(self) -> list[str]:
        """Set the node up (idempotent) and clean a crashed run's leftovers; returns notes
        for people (host settings changed, host filtering that may interfere).

        Raises:
            NftError, LinkError, PoolExhausted, OSError: the node cannot give egress.
        """
        return await asyncio.to_thread(self._start)

    def _start(self) -> list[str]:
        s = self.settings
        if s.registry is not None:
            if self._alive is None:
                self._alive = liveness.hold(s.registry.parent / "net-alive", self.installation_id)
            self._reap(s.registry)
        plan = claim_slice(
            self.installation_id, self._state_dir, s.pool, s.registry, link.host_networks()
        )
        notes = self._bind_log()
        self.ipv6_off = "off on this node (SANDPOD_NET_IPV6=off)" if s.ipv6 is False else None
        if s.ipv6 is not False:
            self.ipv6_off = ipv6.host_support()
        if self.ipv6_off is None:
            slice6 = claim_slice6(
                self.installation_id, self._state_dir, s.pool6, s.registry, link.host_networks6()
            )
            plan = dataclasses.replace(plan, slice6=slice6, pool6=s.pool6)
            notes += ipv6.enable_forwarding()
            if (no_route := ipv6.route_note()) is not None:
                notes.append(no_route)
        else:
            notes.append(f"sandboxes get IPv4 egress only: {self.ipv6_off}")
        nft = self._nft or Nft()
        self._nft = nft
        uid = s.gateway_uid if s.gateway_uid is not None else os.geteuid()
        config = FirewallConfig(
            self.installation_id,
            plan,
            uid,
            s.dns_port,
            s.proxy_port,
            s.hard_deny,
            log_group=self.log.group if self.log is not None else None,
        )
        self.firewall = Firewall(nft, config)
        if IP_FORWARD.read_text().strip() != "1":
            IP_FORWARD.write_text("1")
            notes.append("net.ipv4.ip_forward was 0: set to 1 (sandbox egress is routed)")
        notes += self._host_filters()
        try:
            self.links.ensure_gateway(plan.gateway, plan.gateway6)
            self.firewall.setup()
            self._recover()
        except BaseException:
            self.close_log()  # no egress: nobody reads it
            raise
        log.info(
            "egress_ready",
            slice=str(plan.slice),
            gateway=str(plan.gateway),
            slice6=str(plan.slice6),
            table=self.table,
        )
        self.notes = notes
        for note in notes:
            log.warning("egress_host_note", note=note)
        return notes

    def _bind_log(self) -> list[str]:
        """Bind the NFLOG group (kept across a repeated start); a note when there is none."""
        s = self.settings
        if not s.log_denials or self.log is not None:
            return []
        first = s.log_group if s.log_group is not None else preferred_group(self.installation_id)
        try:
            self.log = NflogSocket.bind(first)
        except NflogUnavailable as exc:
            return [f"refused connections are counted without their destination: {exc}"]
        log.info("egress_log_group", group=self.log.group)
        return []

    def close_log(self) -> None:
        """Close the NFLOG socket (idempotent; rules logging to its group then log nowhere)."""
        if self.log is not None:
            self.log.close()
            self.log = None

    def _reap(self, registry: Path) -> None:
        """Remove what dead installations left: the table and links of one whose state dir is
        gone, and of one that nobody runs and that has no sandbox link left (a crash, or a stop
        that kept its state dir: its slices are given back too, while its liveness lock is
        held exclusively, so it cannot start meanwhile). One look at the host's links and
        tables serves every installation judged."""
        alive = registry.parent / "net-alive"
        names = link.host_links()
        tables = {
            str(i.get("table", {}).get("name"))
            for i in self._firewall_nft().json("list tables inet")
        }
        for ident in release_stale(registry):
            self._remove_installation(ident, names, tables)
        others = {*claimed_ids(registry), *liveness.lock_ids(alive)} - {self.installation_id}
        judged = sorted(i for i in others if i.isalnum())
        for start in range(0, len(judged), REAP_BATCH):  # each batch's locks held till released
            with contextlib.ExitStack() as held:
                dead = set()
                for ident in judged[start : start + REAP_BATCH]:
                    if not held.enter_context(liveness.claim_dead(alive, ident)):
                        continue
                    if link.LinkNames.of(ident).links(names):
                        continue  # its sandboxes run on: the next start of it adopts them
                    self._remove_installation(ident, names, tables)
                    dead.add(ident)
                for ident in release(registry, dead):
                    log.info("egress_slices_released", installation=ident)
                for ident in dead:
                    liveness.forget(alive, ident)

    def _remove_installation(self, ident: str, names: list[str], tables: set[str]) -> None:
        """Remove the table and links of a dead installation (``names``: the host's links,
        ``tables``: its nftables tables, both looked at just before)."""
        if not ident.isalnum():
            return
        if f"sandpod_{ident}" in tables:
            with contextlib.suppress(NftError):  # another installation starting removed it
                self._firewall_nft().run(f"delete table inet sandpod_{ident}")
        ln = link.LinkNames.of(ident)
        gone = [n for n in [*ln.links(names), ln.gateway] if n in names]
        for name in gone:
            link.delete(name)
        if gone or f"sandpod_{ident}" in tables:
            log.info("egress_stale_installation_removed", installation=ident)

    def _host_filters(self) -> list[str]:
        """Other tables whose forward chains drop by default: they may drop our traffic too
        (every table's base chains see each packet); reported, never changed."""
        nft = self._firewall_nft()
        notes = []
        for item in nft.json("list chains"):
            chain = item.get("chain")
            if not isinstance(chain, dict) or chain.get("table") == self.table:
                continue
            if chain.get("hook") == "forward" and chain.get("policy") == "drop":
                notes.append(
                    f"nftables table {chain.get('family')} {chain.get('table')} chain "
                    f"{chain.get('name')} drops forwarded packets by default: sandbox egress "
                    f"needs an accept there for interfaces {self.links.sandbox_prefix}*"
                )
        return notes

    def _firewall_nft(self) -> Nft:
        if self._nft is None:
            self._nft = Nft()
        return self._nft

    def _firewall(self) -> Firewall:
        if self.firewall is None:
            raise RuntimeError("egress is not started")
        return self.firewall

    async def stop(self) -> None:
        """Remove the table and the gateway link (sandboxes still attached lose egress)."""
        await asyncio.to_thread(self._stop)

    async def stop_if_unused(self) -> bool:
        """:meth:`stop` unless a sandbox is still attached (sandboxes outlive a lifecycle
        stopped without destroying them: their network stays, the next start adopts it).
        Returns whether it stopped."""
        if self._records.all():
            return False
        await self.stop()
        return True

    def _stop(self) -> None:
        self._in_force.clear()
        if self.firewall is not None:
            self.firewall.remove()
        self.close_log()
        self.links.remove_gateway()
        if self._alive is not None:
            os.close(self._alive)
            self._alive = None
        log.info("egress_removed", table=self.table)

    def _recover(self) -> None:
        """Re-adopt sandboxes whose link survived; remove every other trace."""
        fw = self._firewall()
        records = self._records.all()
        live = set(self.links.links())
        for sandbox_id, record in records.items():
            name = self.links.sandbox(record.index)
            if name in live:
                fw.apply(sandbox_id, self.plan.sandbox(record.index), name, record.policy)
                self._in_force[sandbox_id] = record.policy
                continue
            fw.drop_index(record.index, name)
            self._records.remove(sandbox_id)
            log.info("egress_leftover_removed", sandbox_id=sandbox_id, link=name)
        known = {self.links.sandbox(r.index) for r in records.values()}
        for name in live - known:
            link.delete(name)
            log.info("egress_leftover_removed", link=name)
        indexes = {r.index for r in records.values()}
        for index in fw.chains():
            if index not in indexes:
                fw.drop_index(index, self.links.sandbox(index))

    # -- sandboxes -----------------------------------------------------------------------------

    async def attach(
        self, sandbox_id: str, holder_pid: int, policy: NetworkPolicy
    ) -> SandboxAddresses:
        """Give the sandbox (its holder is ``holder_pid``) its link, address and chain.

        Raises:
            PoolExhausted, LinkError, NftError: nothing is left behind but the record, which
            :meth:`detach` removes with the rest.
        """
        return await asyncio.to_thread(self._attach, sandbox_id, holder_pid, policy)

    def _attach(self, sandbox_id: str, holder_pid: int, policy: NetworkPolicy) -> SandboxAddresses:
        fw = self._firewall()
        self._in_force.pop(sandbox_id, None)  # a new link: nothing is in force on it yet
        with self._records.lock():
            indexes = self._records.indexes()
            if sandbox_id in indexes:
                index = indexes[sandbox_id]
            else:
                index = self.plan.free_index(indexes.values())
            self._records.put(sandbox_id, NetRecord(index, policy, holder_pid))
        addrs = self.plan.sandbox(index)
        name = self.links.create(addrs, holder_pid)
        fw.apply(sandbox_id, addrs, name, policy)
        if policy.limits.bandwidth_bytes_per_second is not None:
            link.set_bandwidth(name, holder_pid, policy.limits.bandwidth_bytes_per_second)
        self._in_force[sandbox_id] = policy
        return addrs

    async def apply(self, sandbox_id: str, policy: NetworkPolicy) -> None:
        """Swap the sandbox's policy in one nft batch (effective for new connections at once).

        Raises:
            KeyError: the sandbox is not attached.
            NftError: refused; the previous policy is still in force.
        """
        await asyncio.to_thread(self._apply, sandbox_id, policy)

    def _apply(self, sandbox_id: str, policy: NetworkPolicy) -> None:
        record = self._records.get(sandbox_id)
        if record is None:
            raise KeyError(sandbox_id)
        if self._in_force.get(sandbox_id) == policy:
            return  # built from this very policy (a create applies it once more: Ready's rule)
        addrs = self.plan.sandbox(record.index)
        name = self.links.sandbox(record.index)
        self._firewall().apply(sandbox_id, addrs, name, policy)
        self._records.put(sandbox_id, dataclasses.replace(record, policy=policy))
        bandwidth = policy.limits.bandwidth_bytes_per_second
        if record.policy.limits.bandwidth_bytes_per_second != bandwidth:
            link.set_bandwidth(name, record.holder, bandwidth)
        self._in_force[sandbox_id] = policy

    async def detach(self, sandbox_id: str) -> None:
        """Remove the sandbox's link, chain, sets and record (idempotent)."""
        await asyncio.to_thread(self._detach, sandbox_id)

    def _detach(self, sandbox_id: str) -> None:
        record = self._records.get(sandbox_id)
        if record is None:
            return
        self._in_force.pop(sandbox_id, None)
        name = self.links.sandbox(record.index)
        link.delete(name)
        if self.firewall is not None:
            self.firewall.forget(sandbox_id, self.plan.sandbox(record.index), name)
        self._records.remove(sandbox_id)

    def address(self, sandbox_id: str) -> str | None:
        """The sandbox's own address (None: not attached)."""
        record = self._records.get(sandbox_id)
        if record is None or self.firewall is None:
            return None
        return str(self.plan.sandbox(record.index).sandbox)

    def link(self, sandbox_id: str) -> str | None:
        """The host end of the sandbox's veth (None: not attached)."""
        record = self._records.get(sandbox_id)
        return None if record is None else self.links.sandbox(record.index)

    def address6(self, sandbox_id: str) -> str | None:
        """The sandbox's own IPv6 address (None: not attached, or no IPv6)."""
        record = self._records.get(sandbox_id)
        if record is None or self.firewall is None:
            return None
        own = self.plan.sandbox(record.index).sandbox6
        return None if own is None else str(own)

    def policy(self, sandbox_id: str) -> NetworkPolicy | None:
        record = self._records.get(sandbox_id)
        return None if record is None else record.policy

    # -- for the resolver and the proxy --------------------------------------------------------

    def sandbox_by_address(self, address: str) -> tuple[str, NetworkPolicy] | None:
        """(sandbox id, policy in force) of the sandbox whose address is ``address``."""
        return self._firewall().sandbox_by_address(address)

    def add_resolved(
        self,
        sandbox_id: str,
        rule: Rule | str,
        addresses: Sequence[tuple[str | ipaddress.IPv4Address | ipaddress.IPv6Address, float]],
    ) -> int:
        """See :meth:`Firewall.add_resolved` (blocking, ~100 µs: one nft batch)."""
        return self._firewall().add_resolved(sandbox_id, rule, addresses)

    def add_injected(
        self,
        sandbox_id: str,
        addresses: Sequence[tuple[str | ipaddress.IPv4Address | ipaddress.IPv6Address, float]],
    ) -> int:
        """See :meth:`Firewall.add_injected` (blocking, ~100 µs: one nft batch)."""
        return self._firewall().add_injected(sandbox_id, addresses)

    def denied(self, sandbox_id: str) -> int:
        return self._firewall().denied(sandbox_id)

    def denied_counts(self) -> dict[str, int]:
        """sandbox id -> packets its chain refused so far, every sandbox in one nft call."""
        return self._firewall().denied_counts()
