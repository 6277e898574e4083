"""One installation's nftables table: NAT, hard denies, and a chain per sandbox from its policy.

Table ``inet sandpod_<installation id>`` (nobody else's table is ever touched), for sandbox
links named ``sp<tag>-<n>`` (``link.py``) and the installation's slice of addresses
(``addressing.py``)::

    prerouting  (nat)     every port-53 packet of a sandbox -> the gateway address :53 (the
                          node's resolver answers, even a hard-coded 8.8.8.8); per sandbox,
                          name-rule addresses and the injection set's (``j<n>``: the
                          addresses of its ``inject`` domains, :meth:`add_injected`) on
                          80/443 -> the egress proxy (when one is set)
    forward     (filter)  into a sandbox: only established/related (nobody opens a connection
                          to a sandbox through this host); out of one: hard denies first (the
                          metadata service, the whole pool = every installation's sandboxes,
                          extra platform networks; IPv6: all of it without a v6 range, else
                          ``hard6``), then ``jump sbx_<n>`` by interface
    sbx_<n>               the sandbox's policy: spoofed source -> drop; hard denies again
                          (counted); established under this policy -> accept; connection
                          limit; deny rules; allow CIDR rules; name-rule sets
                          (``n<n>_<hash>``, ``flags timeout``, filled by :meth:`add_resolved`);
                          then the mode (public: special ranges drop, rest accept; others drop)
    input       (filter)  from a sandbox to this host: only the gateway address's service ports
                          (resolver 53, proxy) and replies; everything else of the host (its
                          addresses, the platform's ports) is dropped; IPv6 neighbour discovery
                          (solicit/advert, hop limit 255) is accepted, other link-scope
                          multicast (MLD reports a kernel sends on its own) dropped unlogged
    output      (filter)  from this host into a sandbox: new connections only from the
                          gateway's uid (``meta skuid``: preview URLs); replies always
    postrouting (nat)     masquerade the slice (and the v6 slice: NAT66) to wherever it leaves

IPv6 (the plan has a v6 slice): ``hard6`` holds fd00:ec2::254, the whole v6 pool of every
installation, link-local ``fe80::/10``, multicast ``ff00::/8``, ``::``/``::1``, IPv4-mapped
``::ffff:0:0/96`` and the v6 ``hard_deny`` networks; ``special6`` the v6 special ranges; the
resolver's and proxy's ports are on the v6 gateway address too (port-53 and name-rule DNAT
work the same); every sandbox chain has the IPv6 twin of each rule (``rules.py``).

Every change to a sandbox is one batch (``Nft.run``): a policy update flushes and refills its
chain in one kernel transaction, so no packet ever sees half a policy, and nothing restarts.
Drops of a sandbox's packets (its chain's, the forward chain's hard denies and IPv6, and the
input chain's: the host refused) all go to its chain ``deny_<n>`` (the base chains find it
through the map ``deny``): logged to the installation's NFLOG group at a bounded rate per
sandbox with the prefix ``sandpod_<id>:<n>`` (``rules.py``; read by ``nflog.py``), then counted
in its named counter ``denied_<n>`` (:meth:`denied`, exact) and dropped.

A policy update also reaches connections already open: each accept marks the connection with
the policy's generation (``ct mark``), and only packets of connections marked with the current
generation skip the rules; an older connection's next packet from the sandbox is judged by the
new policy (re-marked if still allowed, dropped if not). Its replies are not re-judged, so a
revoked TCP stream stalls at once (the sandbox's ACKs are dropped); a revoked UDP flow's
inbound datagrams run until its conntrack entry times out.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import time
from collections.abc import Sequence

from sandpod_contract.network import (
    METADATA_ADDRESSES,
    SPECIAL_RANGES,
    NetworkPolicy,
    Rule,
)
from sandpod_lifecycle.network.addressing import AddressPlan, SandboxAddresses
from sandpod_lifecycle.network.ipv6 import base_chains6
from sandpod_lifecycle.network.link import LinkNames
from sandpod_lifecycle.network.nft import Nft, NftError
from sandpod_lifecycle.network.rules import (
    Address,
    compile_sandbox,
    elements,
    inject_set,
    injects,
    set_name,
    set_name6,
    timed_elements,
)

__all__ = ["Firewall", "FirewallConfig", "UnknownRule"]

GENERATIONS = 0x7FFFFFFF  # ct mark values a policy generation takes (never 0: unmarked)


class UnknownRule(Exception):
    """``add_resolved`` for a rule the sandbox's current policy does not have (it was updated
    meanwhile) or a sandbox this firewall does not know: nothing was added."""

    code = "network.unknown_rule"
    retryable = False


@dataclasses.dataclass(frozen=True, slots=True)
class FirewallConfig:
    """What the table is compiled from.

    Attributes:
        installation_id: names the table ``sandpod_<id>``.
        plan: the installation's slice and gateway address.
        gateway_uid: the only host uid allowed to open connections into sandboxes (the API
            gateway's, for preview URLs); None: nobody.
        dns_port: the resolver's port on the gateway address.
        proxy_port: the egress proxy's port there (None: no proxy; name rules then open their
            resolved addresses directly).
        hard_deny: more networks no rule can open (where the platform's services live).
        log_group: the NFLOG group refused packets are logged to (``nflog.py`` bound it),
            None: counted only.
    """

    installation_id: str
    plan: AddressPlan
    gateway_uid: int | None = None
    dns_port: int = 53
    proxy_port: int | None = None
    hard_deny: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    log_group: int | None = None

    @property
    def ipv6(self) -> bool:
        return self.plan.slice6 is not None

    @property
    def table(self) -> str:
        return f"sandpod_{self.installation_id}"

    @property
    def links(self) -> LinkNames:
        return LinkNames.of(self.installation_id)


@dataclasses.dataclass(frozen=True, slots=True)
class _Sandbox:
    addrs: SandboxAddresses
    ifname: str
    policy: NetworkPolicy
    injects: bool = False  # has an injection set (``add_injected``)


class Firewall:
    """The installation's table (see the module docstring). Methods block (one batch each)."""

    def __init__(self, nft: Nft, config: FirewallConfig) -> None:
        self.nft = nft
        self.config = config
        self._sandboxes: dict[str, _Sandbox] = {}
        # index -> its sets as this process last wrote them (None: unknown, list the table):
        # a create or update then costs no listing of the whole table (O(sandboxes))
        self._index_sets: dict[int, set[str]] = {}
        # policy generations (ct marks): from the clock, so a restarted lifecycle never
        # reuses one that open connections may still carry
        self._generation = int(time.time() * 16) & GENERATIONS

    # -- the table -----------------------------------------------------------------------------

    def setup(self) -> None:
        """Create the table, or refresh its base chains (idempotent: sandbox chains and maps
        of a table left by a previous run are kept for :meth:`prune`)."""
        c, t = self.config, self.config.table
        pre = c.links.sandbox_prefix
        gw = c.plan.gateway
        hard = [
            *(a for a in METADATA_ADDRESSES if a.version == 4),
            c.plan.pool,
            *(n for n in c.hard_deny if n.version == 4),
        ]
        special = elements(SPECIAL_RANGES)
        ports = ", ".join(str(p) for p in (c.dns_port, c.proxy_port) if p is not None)
        v6 = base_chains6(
            t, pre, plan=c.plan, ports=ports, dns_port=c.dns_port, hard_deny=c.hard_deny
        )
        inbound = (
            f'add rule inet {t} output oifname "{pre}*" meta skuid {c.gateway_uid} accept\n'
            if c.gateway_uid is not None
            else ""
        )
        script = f"""
add table inet {t}
add set inet {t} hard4 {{ type ipv4_addr; flags interval; }}
add set inet {t} special4 {{ type ipv4_addr; flags interval; }}
add set inet {t} hard6 {{ type ipv6_addr; flags interval; auto-merge; }}
add set inet {t} special6 {{ type ipv6_addr; flags interval; auto-merge; }}
add map inet {t} dispatch {{ type ifname : verdict; }}
add map inet {t} natdispatch {{ type ifname : verdict; }}
add map inet {t} deny {{ type ifname : verdict; }}
flush set inet {t} hard4
flush set inet {t} special4
flush set inet {t} hard6
flush set inet {t} special6
add element inet {t} hard4 {{ {", ".join(str(h) for h in hard)} }}
add element inet {t} special4 {{ {special} }}
add chain inet {t} forward {{ type filter hook forward priority filter; policy accept; }}
add chain inet {t} input {{ type filter hook input priority filter; policy accept; }}
add chain inet {t} output {{ type filter hook output priority filter; policy accept; }}
add chain inet {t} prerouting {{ type nat hook prerouting priority dstnat; policy accept; }}
add chain inet {t} postrouting {{ type nat hook postrouting priority srcnat; policy accept; }}
flush chain inet {t} forward
flush chain inet {t} input
flush chain inet {t} output
flush chain inet {t} prerouting
flush chain inet {t} postrouting
add map inet {t} denycount {{ type ifname : counter; }}
delete map inet {t} denycount
add rule inet {t} forward oifname "{pre}*" ct state established,related accept
add rule inet {t} forward oifname "{pre}*" counter drop
{v6["forward"]}add rule inet {t} forward iifname "{pre}*" ip daddr @hard4 iifname vmap @deny
add rule inet {t} forward iifname "{pre}*" ip daddr @hard4 counter drop
add rule inet {t} forward iifname "{pre}*" iifname vmap @dispatch
add rule inet {t} forward iifname "{pre}*" counter drop
add rule inet {t} input iifname "{pre}*" ct state established,related accept
add rule inet {t} input iifname "{pre}*" ip daddr {gw} meta l4proto {{ tcp, udp }} th dport {{ {ports} }} accept
{v6["input"]}add rule inet {t} input iifname "{pre}*" iifname vmap @deny
add rule inet {t} input iifname "{pre}*" counter drop
add rule inet {t} output oifname "{pre}*" ct state established,related accept
{v6["output"]}{inbound}add rule inet {t} output oifname "{pre}*" counter drop
add rule inet {t} prerouting iifname "{pre}*" meta l4proto {{ tcp, udp }} th dport 53 dnat ip to {gw}:{c.dns_port}
{v6["prerouting"]}add rule inet {t} prerouting iifname "{pre}*" iifname vmap @natdispatch
add rule inet {t} postrouting ip saddr {c.plan.slice} oifname != "{pre}*" masquerade
{v6["postrouting"]}"""  # noqa: E501 -- nft's own syntax, one rule a line
        self.nft.run(script)

    def remove(self) -> None:
        """Delete the whole table (idempotent)."""
        if self.exists():
            self.nft.run(f"delete table inet {self.config.table}")
        self._sandboxes.clear()

    def exists(self) -> bool:
        tables = self.nft.json("list tables inet")
        return any(i.get("table", {}).get("name") == self.config.table for i in tables)

    def chains(self) -> list[int]:
        """Indexes of the sandbox chains in the table now."""
        names = self._objects().get("chain", set())
        return sorted(int(n[4:]) for n in names if n.startswith("sbx_") and n[4:].isdigit())

    def _objects(self) -> dict[str, set[str]]:
        """kind (chain, set, map, counter) -> names of the table's objects ({}: no table)."""
        if not self.exists():
            return {}
        out: dict[str, set[str]] = {}
        for item in self.nft.json(f"list table inet {self.config.table}"):
            for kind in ("chain", "set", "map", "counter"):
                body = item.get(kind)
                if isinstance(body, dict) and body.get("table") == self.config.table:
                    out.setdefault(kind, set()).add(str(body.get("name", "")))
        return out

    # -- sandboxes -----------------------------------------------------------------------------

    def apply(
        self, sandbox_id: str, addrs: SandboxAddresses, ifname: str, policy: NetworkPolicy
    ) -> None:
        """Install or replace sandbox ``sandbox_id``'s chain from ``policy``: one batch.

        Raises:
            NftError: nftables refused it; the previous chain (if any) is still in force.
        """
        proxy = (
            f"{self.config.plan.gateway}:{self.config.proxy_port}"
            if self.config.proxy_port is not None
            else None
        )
        v6 = addrs.sandbox6 is not None
        gw6 = self.config.plan.gateway6
        proxy6 = (
            f"[{gw6}]:{self.config.proxy_port}"
            if self.config.proxy_port is not None and gw6 is not None
            else None
        )
        keep = {set_name(addrs.index, r) for r in policy.name_rules}
        if v6:
            keep |= {set_name6(addrs.index, r) for r in policy.name_rules}
        if policy.limits.max_connections is not None:
            keep.add(f"cl{addrs.index}" if v6 else f"cc{addrs.index}")
        injecting = injects(policy, proxy)
        if injecting:
            keep.add(inject_set(addrs.index))
            if v6:
                keep.add(f"{inject_set(addrs.index)}_6")
        known = self._index_sets.get(addrs.index)
        stale = (set(self._sets(addrs.index)) if known is None else known) - keep
        self._generation = self._generation % GENERATIONS + 1
        script = compile_sandbox(
            self.config.table,
            addrs,
            ifname,
            policy,
            generation=self._generation,
            proxy=proxy,
            proxy6=proxy6,
            log_group=self.config.log_group,
        )
        script += "".join(f"delete set inet {self.config.table} {s}\n" for s in sorted(stale))
        self.nft.run(script)
        self._sandboxes[sandbox_id] = _Sandbox(addrs, ifname, policy, injecting)
        self._index_sets[addrs.index] = keep

    def forget(self, sandbox_id: str, addrs: SandboxAddresses, ifname: str) -> None:
        """Remove a sandbox's chain, sets, counter and map entries (idempotent). What this
        process installed goes in one batch without listing the table; anything else (a
        previous run's, a partial one) through :meth:`drop_index`."""
        self._sandboxes.pop(sandbox_id, None)
        known = self._index_sets.pop(addrs.index, None)
        if known is not None:
            t, n = self.config.table, addrs.index
            script = "".join(
                f'delete element inet {t} {m} {{ "{ifname}" }}\n'
                for m in ("dispatch", "natdispatch", "deny")
            )
            script += "".join(
                f"flush chain inet {t} {c}\ndelete chain inet {t} {c}\n"
                for c in (f"sbx_{n}", f"nat_{n}", f"deny_{n}")  # deny_<n> once unreferenced
            )
            script += "".join(f"delete set inet {t} {name}\n" for name in sorted(known))
            script += f"delete counter inet {t} denied_{n}\n"
            try:
                self.nft.run(script)
                self._index_sets[addrs.index] = set()  # known empty: a reuse lists nothing
                return
            except NftError:
                pass  # not all of it exists (any more): remove what does, by listing
        self.drop_index(addrs.index, ifname)
        self._index_sets[addrs.index] = set()

    def drop_index(self, index: int, ifname: str) -> None:
        """Remove everything of sandbox chain ``index`` (a leftover of a crashed run too)."""
        objects = self._objects()
        if not objects:
            return
        t = self.config.table
        script = ""
        for name in ("dispatch", "natdispatch", "deny"):
            if ifname in self._map_keys(name):
                script += f'delete element inet {t} {name} {{ "{ifname}" }}\n'
        for chain in (f"sbx_{index}", f"nat_{index}", f"deny_{index}"):
            if chain in objects.get("chain", set()):
                script += f"flush chain inet {t} {chain}\ndelete chain inet {t} {chain}\n"
        for s in self._sets(index):
            script += f"delete set inet {t} {s}\n"
        if f"denied_{index}" in objects.get("counter", set()):
            script += f"delete counter inet {t} denied_{index}\n"
        if script:
            self.nft.run(script)

    def policy(self, sandbox_id: str) -> NetworkPolicy | None:
        entry = self._sandboxes.get(sandbox_id)
        return entry.policy if entry is not None else None

    def sandbox_of_log(self, prefix: str) -> str | None:
        """The sandbox whose refusals are logged with ``prefix`` (``rules.log_prefix``), None:
        another installation's prefix, or a sandbox gone since."""
        table, _, index = prefix.rpartition(":")
        if table != self.config.table or not index.isdigit():
            return None
        number = int(index)
        return next((sid for sid, e in self._sandboxes.items() if e.addrs.index == number), None)

    def sandbox_by_address(self, address: str) -> tuple[str, NetworkPolicy] | None:
        """(sandbox id, its policy) of the sandbox whose own address is ``address``."""
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return None
        for sandbox_id, entry in self._sandboxes.items():
            if ip in (entry.addrs.sandbox, entry.addrs.sandbox6):
                return sandbox_id, entry.policy
        return None

    def add_resolved(
        self,
        sandbox_id: str,
        rule: Rule | str,
        addresses: Sequence[tuple[Address, float]],
    ) -> int:
        """Open ``addresses`` (each with its TTL in seconds, clamped to 1..86400) for the
        name rule ``rule`` of the sandbox's current policy, until the TTL runs out (IPv6 ones
        into the rule's v6 set; skipped when the sandbox has no IPv6). Returns how many were
        added.

        Raises:
            UnknownRule: the sandbox or the rule is not (or no longer) in force.
            NftError: nftables refused the batch.
            ValueError: an address is not an IP address.
        """
        entry = self._sandboxes.get(sandbox_id)
        text = rule.text if isinstance(rule, Rule) else rule
        found = (
            None
            if entry is None
            else next((r for r in entry.policy.name_rules if r.text == text), None)
        )
        if entry is None or found is None:
            raise UnknownRule(f"sandbox {sandbox_id!r} has no name rule {text!r} in force")
        six = set_name6(entry.addrs.index, found) if entry.addrs.sandbox6 is not None else None
        return self._add_timed(set_name(entry.addrs.index, found), addresses, six)

    def add_injected(
        self,
        sandbox_id: str,
        addresses: Sequence[tuple[Address, float]],
    ) -> int:
        """Send ``addresses`` (each with its TTL, as :meth:`add_resolved`) of the sandbox's
        ``inject`` domains to the egress proxy on 80/443 until the TTL runs out: its injection
        set. Returns how many were added.

        Raises:
            UnknownRule: the sandbox is unknown, or has no injection set (its policy injects
                nothing, is deny-all, or this node runs no proxy).
            NftError: nftables refused the batch.
            ValueError: an address is not an IP address.
        """
        entry = self._sandboxes.get(sandbox_id)
        if entry is None or not entry.injects:
            raise UnknownRule(f"sandbox {sandbox_id!r} has no injection set in force")
        name = inject_set(entry.addrs.index)
        six = f"{name}_6" if entry.addrs.sandbox6 is not None else None
        return self._add_timed(name, addresses, six)

    def _add_timed(
        self, name: str, addresses: Sequence[tuple[Address, float]], name6: str | None
    ) -> int:
        """Add ``addresses`` to timed set ``name`` (IPv6 ones to ``name6``; None: skipped),
        each for its TTL (one batch)."""
        script, added = timed_elements(self.config.table, name, addresses, name6)
        if script:
            self.nft.run(script)
        return added

    def denied(self, sandbox_id: str) -> int:
        """Packets the sandbox's chain dropped so far (0: unknown sandbox)."""
        entry = self._sandboxes.get(sandbox_id)
        if entry is None:
            return 0
        t = self.config.table
        try:
            out = self.nft.json(f"list counter inet {t} denied_{entry.addrs.index}")
        except NftError:
            return 0
        for item in out:
            counter = item.get("counter")
            if isinstance(counter, dict):
                return int(counter.get("packets", 0))
        return 0

    def denied_counts(self) -> dict[str, int]:
        """sandbox id -> packets its chain dropped so far (one ``list table``)."""
        by_index = {e.addrs.index: sid for sid, e in self._sandboxes.items()}
        out: dict[str, int] = {}
        if not self.exists():
            return out
        for item in self.nft.json(f"list table inet {self.config.table}"):
            counter = item.get("counter")
            if not isinstance(counter, dict):
                continue
            name = str(counter.get("name", ""))
            index = name.removeprefix("denied_")
            if name.startswith("denied_") and index.isdigit() and int(index) in by_index:
                out[by_index[int(index)]] = int(counter.get("packets", 0))
        return out

    # -- compiling -----------------------------------------------------------------------------

    def _sets(self, index: int) -> list[str]:
        names = self._objects().get("set", set())
        own = (f"cc{index}", f"cl{index}", inject_set(index), f"{inject_set(index)}_6")
        return sorted(n for n in names if n.startswith(f"n{index}_") or n in own)

    def _map_keys(self, name: str) -> set[str]:
        keys: set[str] = set()
        for item in self.nft.json(f"list map inet {self.config.table} {name}"):
            body = item.get("map")
            for elem in body.get("elem", []) if isinstance(body, dict) else []:
                if isinstance(elem, list) and elem and isinstance(elem[0], str):
                    keys.add(elem[0])
        return keys
