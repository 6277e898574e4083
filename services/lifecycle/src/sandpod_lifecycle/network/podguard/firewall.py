"""The guard's nftables table in a Pod's network namespace: the sandbox uid's egress, filtered
by the same chain compiler as the local runtime (``rules.compile_chain``).

Table ``inet sandpod_guard`` (the Pod's netns is the guard's alone: no other table is touched)::

    nat_out  (nat, output)     the sandbox uid's port-53 packets, wherever addressed
                               -> 127.0.0.1:<dns_port> (the guard's resolver answers them all);
                               then ``jump nat_0``
    nat_0                      (with a proxy port) TCP 80/443 to the name-rule sets' and the
                               injection set's (``j0``) addresses -> 127.0.0.1:<proxy_port>, the
                               guard's egress proxy (``rules.compile_nat``, as the local runtime)
    output   (filter, output)  packets of sockets NOT owned by the sandbox uid: accepted (the
                               guard's own upstream DNS and API server watch, kubelet probes'
                               replies); the sandbox uid: loopback (its own Pod) and
                               127/8 (the resolver after the DNAT: a rerouted packet keeps
                               the hook's first output interface) accepted; replies of
                               connections opened *to* the sandbox (ingress is the
                               NetworkPolicy's: the gateway's preview URLs) accepted; IPv6
                               refused (counted in ``denied6``, rejected so a client falls
                               back to IPv4 at once; the README says why); NATS (the
                               pinned addresses and port: execd's control
                               connection) accepted before any policy; then ``jump sbx_0``
    sbx_0                      the policy, compiled by ``rules.compile_chain`` exactly as a
                               local sandbox's: hard denies (metadata, ``hard_deny``), the
                               established connections of this generation, the connection
                               limit, deny rules (drops go to ``deny_0``: counted in
                               ``denied_0``), allow CIDRs and name sets (``n0_<hash>``,
                               timed, filled by :meth:`PodFirewall.add_resolved` from the
                               resolver before it answers), then the mode (public: special
                               ranges dropped)

A policy update is one batch (flush and refill ``sbx_0``, remove sets no longer named), so no
packet sees half a policy; each update is a new ct mark generation, so open connections are
judged again by the new policy (as in the local runtime).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import time
from collections.abc import Sequence

from sandpod_contract.network import METADATA_ADDRESSES, SPECIAL_RANGES, NetworkPolicy, Rule
from sandpod_lifecycle.network.firewall import GENERATIONS, UnknownRule
from sandpod_lifecycle.network.nft import Nft
from sandpod_lifecycle.network.rules import (
    compile_chain,
    compile_nat,
    elements,
    inject_set,
    injects,
    set_name,
    timed_elements,
)

__all__ = ["GuardTable", "PodFirewall"]

TABLE = "sandpod_guard"
INDEX = 0  # one sandbox per Pod: chain sbx_0


@dataclasses.dataclass(frozen=True, slots=True)
class GuardTable:
    """What the base chains are compiled from.

    Attributes:
        dns_port: the guard resolver's port on 127.0.0.1.
        proxy_port: the guard's egress proxy's port there (None: no proxy).
        nats: (network, port) pairs execd's NATS connection goes to: always allowed.
        hard_deny: more networks no rule can open (besides the metadata addresses).
    """

    dns_port: int = 53
    proxy_port: int | None = None
    nats: tuple[tuple[ipaddress.IPv4Network, int], ...] = ()
    hard_deny: tuple[ipaddress.IPv4Network, ...] = ()


class PodFirewall:
    """The guard's table (module docstring). Methods block (one batch each)."""

    def __init__(self, nft: Nft, table: GuardTable) -> None:
        self.nft = nft
        self.table = table
        self.policy: NetworkPolicy | None = None
        self._sets: set[str] = set()
        self._generation = int(time.time() * 16) & GENERATIONS

    def setup(self, policy: NetworkPolicy) -> None:
        """Create (or refresh) the table with ``policy`` in force, in one batch.

        Raises:
            NftError: nftables refused it (nothing applied).
        """
        c, t = self.table, TABLE
        # Everything but the guard's own sockets (uid 0) is the sandbox's: a process of the Pod
        # under any other uid than the configured one is filtered too, never waved through.
        uid = "meta skuid != 0"
        hard = [*(a for a in METADATA_ADDRESSES if a.version == 4), *c.hard_deny]
        nats = "".join(
            f"add rule inet {t} output {uid} ip daddr {net} tcp dport {port} accept\n"
            for net, port in c.nats
        )
        script = f"""
add table inet {t}
delete table inet {t}
add table inet {t}
add set inet {t} hard4 {{ type ipv4_addr; flags interval; }}
add set inet {t} special4 {{ type ipv4_addr; flags interval; }}
add element inet {t} hard4 {{ {", ".join(str(h) for h in hard)} }}
add element inet {t} special4 {{ {elements(SPECIAL_RANGES)} }}
add counter inet {t} denied6
add chain inet {t} nat_out {{ type nat hook output priority -100; policy accept; }}
add chain inet {t} output {{ type filter hook output priority filter; policy accept; }}
"""
        script += self._policy_batch(policy, stale=set())
        script += f"""
add rule inet {t} nat_out {uid} meta l4proto {{ tcp, udp }} th dport 53 dnat ip to 127.0.0.1:{c.dns_port}
add rule inet {t} nat_out {uid} jump nat_{INDEX}
add rule inet {t} output meta skuid 0 accept
add rule inet {t} output {uid} oifname "lo" accept
add rule inet {t} output {uid} ip daddr 127.0.0.0/8 accept
add rule inet {t} output {uid} ct direction reply accept
add rule inet {t} output {uid} meta nfproto ipv6 counter name denied6 reject with icmpx admin-prohibited
{nats}add rule inet {t} output {uid} jump sbx_{INDEX}
"""  # noqa: E501 -- nft's own syntax, one rule a line
        self.nft.run(script)
        self._commit(policy)

    def apply(self, policy: NetworkPolicy) -> None:
        """Replace the policy in force with ``policy``: one batch.

        Raises:
            NftError: nftables refused it; the previous policy is still in force.
        """
        self.nft.run(self._policy_batch(policy, stale=self._sets))
        self._commit(policy)

    def _policy_batch(self, policy: NetworkPolicy, stale: set[str]) -> str:
        self._generation = self._generation % GENERATIONS + 1
        lines = compile_chain(TABLE, INDEX, policy, generation=self._generation, source=None)
        nat = f"nat_{INDEX}"
        lines += [f"add chain inet {TABLE} {nat}", f"flush chain inet {TABLE} {nat}"]
        if (port := self.table.proxy_port) is not None:
            lines += compile_nat(TABLE, INDEX, policy, f"127.0.0.1:{port}")
        keep = self._names(policy)
        lines += [f"delete set inet {TABLE} {s}" for s in sorted(stale - keep)]
        return "\n".join(lines) + "\n"

    def _commit(self, policy: NetworkPolicy) -> None:
        self.policy = policy
        self._sets = self._names(policy)

    def _names(self, policy: NetworkPolicy) -> set[str]:
        keep = {set_name(INDEX, r) for r in policy.name_rules}
        if self._injects(policy):
            keep.add(inject_set(INDEX))
        if policy.limits.max_connections is not None:
            keep.add(f"cc{INDEX}")
        return keep

    def add_resolved(self, rule: Rule, addresses: Sequence[tuple[str, float]]) -> int:
        """Open ``addresses`` ((address, seconds) pairs, clamped to 1..86400) for name rule
        ``rule`` of the policy in force, until their time runs out; IPv6 skipped. Returns how
        many were added.

        Raises:
            UnknownRule: the policy in force has no such rule (it was replaced meanwhile).
            NftError: nftables refused the batch.
        """
        policy = self.policy
        if policy is None or rule.text not in {r.text for r in policy.name_rules}:
            raise UnknownRule(f"no name rule {rule.text!r} in force")
        script, added = timed_elements(TABLE, set_name(INDEX, rule), addresses)
        if script:
            self.nft.run(script)
        return added

    def _injects(self, policy: NetworkPolicy) -> bool:
        port = self.table.proxy_port
        return injects(policy, None if port is None else str(port))

    def add_injected(self, addresses: Sequence[tuple[str, float]]) -> int:
        """Send ``addresses`` ((address, seconds)) of an ``inject`` domain to the proxy (the
        injection set ``j0``) for their time; IPv6 skipped. Returns how many were added.

        Raises:
            UnknownRule: the policy in force has no injection set.
            NftError: nftables refused the batch.
        """
        policy = self.policy
        if policy is None or not self._injects(policy):
            raise UnknownRule("no injection set in force")
        script, added = timed_elements(TABLE, inject_set(INDEX), addresses)
        if script:
            self.nft.run(script)
        return added

    def refused_ipv6(self) -> int:
        """IPv6 packets of the sandbox refused so far."""
        return self._counter("denied6")

    def denied(self) -> int:
        """Packets the policy chain dropped so far."""
        return self._counter(f"denied_{INDEX}")

    def _counter(self, name: str) -> int:
        for item in self.nft.json(f"list counter inet {TABLE} {name}"):
            counter = item.get("counter")
            if isinstance(counter, dict):
                return int(counter.get("packets", 0))
        return 0

    def remove(self) -> None:
        """Delete the table (idempotent)."""
        self.nft.run(f"add table inet {TABLE}\ndelete table inet {TABLE}\n")
