"""A sandbox's policy compiled to nftables: its chain, name-rule sets and NAT chain.

One compiler for both places a policy is enforced: the local runtime's table on the host
(:func:`compile_sandbox`: chain ``sbx_<n>`` jumped to from the forward hook by interface) and the
network guard in a Kubernetes Pod's own netns (:func:`compile_chain`: the same chain body,
jumped to from the output hook by the sandbox's uid, ``podguard/firewall.py``).

The order inside ``sbx_<n>`` is the policy's meaning: a spoofed source (local runtime only: in
a Pod the uid match decides) and the hard denies first (no rule can open them), then
connections accepted under this policy generation (a ct mark: older ones are judged again),
the connection limit, ``deny`` rules, ``allow`` CIDR and name-set rules, and the mode
(public: special ranges dropped, the rest accepted; allowlist and deny-all: dropped). Every
drop counts in ``denied_<n>``; every accept marks the connection.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable

from sandpod_contract.network import NetworkMode, NetworkPolicy, Rule
from sandpod_lifecycle.network.addressing import SandboxAddresses

__all__ = ["PROXIED_PORTS", "compile_chain", "compile_sandbox", "elements", "set_name"]

PROXIED_PORTS = "{ 80, 443 }"


def set_name(index: int, rule: Rule) -> str:
    """The resolved-address set of name rule ``rule`` in sandbox ``index``'s chain."""
    return f"n{index}_{hashlib.sha256(rule.text.encode()).hexdigest()[:12]}"


def elements(nets: Iterable[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> str:
    return ", ".join(str(n) for n in nets if n.version == 4)


def _ports(rule: Rule) -> str:
    if rule.ports is None:
        return ""
    return f"meta l4proto {{ tcp, udp }} th dport {rule.ports} "


def compile_sandbox(
    table: str,
    addrs: SandboxAddresses,
    ifname: str,
    policy: NetworkPolicy,
    *,
    generation: int,
    proxy: str | None = None,
) -> str:
    """The batch that installs (or replaces) sandbox ``addrs.index``'s chain, its name-rule
    sets, its NAT chain and its map entries in ``table`` (see ``firewall.py``); ``proxy``
    (``address:port``): where name-rule addresses on 80/443 are DNAT'ed, None: nowhere."""
    t, n = table, addrs.index
    nat = f"nat_{n}"
    lines = [f"add chain inet {t} {nat}", f"flush chain inet {t} {nat}"]
    lines += compile_chain(t, n, policy, generation=generation, source=str(addrs.sandbox))
    if proxy is not None:
        for r in policy.name_rules:
            lines.append(
                f"add rule inet {t} {nat} ip daddr @{set_name(n, r)} tcp dport "
                f"{PROXIED_PORTS} dnat ip to {proxy}"
            )
    lines.append(f'add element inet {t} dispatch {{ "{ifname}" : jump sbx_{n} }}')
    lines.append(f'add element inet {t} natdispatch {{ "{ifname}" : jump {nat} }}')
    lines.append(f'add element inet {t} denycount {{ "{ifname}" : "denied_{n}" }}')
    return "\n".join(lines) + "\n"


def compile_chain(
    table: str, index: int, policy: NetworkPolicy, *, generation: int, source: str | None
) -> list[str]:
    """The commands that (re)fill chain ``sbx_<index>`` of ``table`` from ``policy``: its
    counter ``denied_<index>``, its name-rule sets, and the rules in the module docstring's
    order. ``source``: the only address the sandbox may send from (None: no check; a Pod's
    chain is reached by uid). The table needs the sets ``hard4`` and ``special4``."""
    t, n = table, index
    chain = f"sbx_{n}"
    drop = f"counter name denied_{n} drop"
    lines = [
        f"add counter inet {t} denied_{n}",
        f"add chain inet {t} {chain}",
        f"flush chain inet {t} {chain}",
    ]
    for rule in policy.name_rules:
        s = set_name(n, rule)
        lines.append(f"add set inet {t} {s} {{ type ipv4_addr; flags timeout; }}")
    head = f"add rule inet {t} {chain}"
    if source is not None:
        lines.append(f"{head} ip saddr != {source} {drop}")  # spoofed
    lines.append(f"{head} ip daddr @hard4 {drop}")  # counted here too (forward has it)
    lines.append(f"{head} ct state established,related ct mark {generation} accept")
    if (limit := policy.limits.max_connections) is not None:
        lines.append(f"add set inet {t} cc{n} {{ type ipv4_addr; size 1; flags dynamic; }}")
        lines.append(f"{head} ct state new add @cc{n} {{ ip saddr ct count over {limit} }} {drop}")
    if policy.mode is not NetworkMode.DENY_ALL:
        accept = f"ct mark set {generation} accept"
        lines += _rules(head, n, policy, drop, accept)
    else:
        lines.append(f"{head} {drop}")
    if policy.mode is NetworkMode.ALLOWLIST:  # public ends in accept, deny-all in drop
        lines.append(f"{head} {drop}")
    return lines


def _rules(head: str, n: int, policy: NetworkPolicy, drop: str, accept: str) -> list[str]:
    lines = []
    for r in policy.deny:
        if r.network is not None and r.network.version == 4:
            lines.append(f"{head} ip daddr {r.network} {_ports(r)}{drop}")
    for r in policy.allow:
        if r.network is not None and r.network.version == 4:
            lines.append(f"{head} ip daddr {r.network} {_ports(r)}{accept}")
        elif r.is_name:
            lines.append(f"{head} ip daddr @{set_name(n, r)} {_ports(r)}{accept}")
    if policy.mode is NetworkMode.PUBLIC:
        lines.append(f"{head} ip daddr @special4 {drop}")
        lines.append(f"{head} {accept}")
    return lines
