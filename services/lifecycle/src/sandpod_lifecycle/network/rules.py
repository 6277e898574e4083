"""A sandbox's policy compiled to nftables: its chain, name-rule sets and NAT chain.

One compiler for both places a policy is enforced: the local runtime's table on the host
(:func:`compile_sandbox`: chain ``sbx_<n>`` jumped to from the forward hook by interface) and the
network guard in a Kubernetes Pod's own netns (:func:`compile_chain`: the same chains, jumped
to from the output hook by the sandbox's uid, ``podguard/firewall.py``).

The order inside ``sbx_<n>`` is the policy's meaning: a spoofed source (local runtime only: in
a Pod the uid match decides) and the hard denies first (no rule can open them), then
connections accepted under this policy generation (a ct mark: older ones are judged again),
the connection limit, ``deny`` rules, ``allow`` CIDR and name-set rules, and the mode (public:
special ranges dropped, the rest accepted; allowlist and deny-all: dropped). Every drop is a
``goto deny_<n>``: that chain logs the packet to the installation's NFLOG group (when it has
one), at most ``LOG_RATE`` a second after a burst of ``LOG_BURST`` for this sandbox (one
sandbox hammering a closed port fills neither userspace nor the others' share), then counts
it in ``denied_<n>`` (every packet: the exact count) and drops
it. Every accept marks the connection.

IPv6 (``ipv6=True``, the local runtime when its installation has a v6 range): every rule
above has its ``ip6`` twin in the same chain -- the spoofed-source check against the
sandbox's /127, the hard denies (set ``hard6``), v6 CIDRs of ``deny``/``allow``, a second
timed set per name rule (``<set>_6``, filled with the AAAA answers), ``special6`` in public
mode -- so a policy whose CIDRs are all IPv4 still refuses all IPv6 but what its names
resolve to. The connection limit then counts both families together (set ``cl<n>`` keyed by
the sandbox's interface: ``ip saddr`` would leave v6 connections uncounted). Without it (the
Pod guard) the chain matches IPv4 only, as before.

The NAT chain ``nat_<n>`` (only with a proxy) sends TCP 80/443 to the egress proxy for the
addresses of each name-rule set and of the injection set ``j<n>``: the addresses the resolver
answered this sandbox for a name of its ``inject`` entries, in any mode but deny-all (in
``public`` mode nothing else would bring that traffic to the proxy, which adds the header).
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable

from sandpod_contract.network import NetworkMode, NetworkPolicy, Rule
from sandpod_lifecycle.network.addressing import SandboxAddresses

__all__ = [
    "LOG_BURST",
    "LOG_RATE",
    "LOG_SNAPLEN",
    "MAX_TTL",
    "MIN_TTL",
    "PROXIED_PORTS",
    "Address",
    "compile_chain",
    "compile_nat",
    "compile_sandbox",
    "elements",
    "inject_set",
    "injects",
    "log_prefix",
    "set_name",
    "set_name6",
    "timed_elements",
]

PROXIED_PORTS = "{ 80, 443 }"
MIN_TTL, MAX_TTL = 1, 86400
Address = str | ipaddress.IPv4Address | ipaddress.IPv6Address
LOG_RATE = "5/second"  # refused packets logged per sandbox, after ...
LOG_BURST = 20  # ... this many at once
LOG_SNAPLEN = 128  # bytes of each logged packet: IP header with options + the ports


def log_prefix(table: str, index: int) -> str:
    """The ``log prefix`` of sandbox ``index``'s refusals (``sandpod_<id>:<n>``): the NFLOG
    reader finds the installation and the sandbox in it."""
    return f"{table}:{index}"


def set_name(index: int, rule: Rule) -> str:
    """The resolved-address set of name rule ``rule`` in sandbox ``index``'s chain."""
    return f"n{index}_{hashlib.sha256(rule.text.encode()).hexdigest()[:12]}"


def set_name6(index: int, rule: Rule) -> str:
    """The IPv6 twin of :func:`set_name` (AAAA answers)."""
    return f"{set_name(index, rule)}_6"


def inject_set(index: int) -> str:
    """The injection set of sandbox ``index``: addresses of its ``inject`` domains."""
    return f"j{index}"


def injects(policy: NetworkPolicy, proxy: str | None) -> bool:
    """Whether a sandbox under ``policy`` has an injection set (a proxy to send it to, and
    header injections in a mode that lets names resolve)."""
    return proxy is not None and bool(policy.inject) and policy.mode is not NetworkMode.DENY_ALL


def timed_elements(
    table: str, name: str, addresses: Iterable[tuple[Address, float]], name6: str | None = None
) -> tuple[str, int]:
    """(the batch adding the IPv4 ``addresses`` to timed set ``name`` and the IPv6 ones to
    ``name6``, each for its TTL in seconds clamped to 1..86400, and how many it adds). IPv6
    addresses are skipped when ``name6`` is None (a sandbox with IPv4 egress only). Raises
    ValueError for an address that is not one."""
    script = ""
    added = 0
    for raw, ttl in addresses:
        ip = ipaddress.ip_address(raw) if isinstance(raw, str) else raw
        target = name if ip.version == 4 else name6
        if target is None:
            continue
        seconds = int(min(max(ttl, MIN_TTL), MAX_TTL))
        # add (so it exists), delete, add again: refreshes the timeout of a known address
        script += (
            f"add element inet {table} {target} {{ {ip} timeout {seconds}s }}\n"
            f"delete element inet {table} {target} {{ {ip} }}\n"
            f"add element inet {table} {target} {{ {ip} timeout {seconds}s }}\n"
        )
        added += 1
    return script, added


def elements(
    nets: Iterable[ipaddress.IPv4Network | ipaddress.IPv6Network], version: int = 4
) -> str:
    return ", ".join(str(n) for n in nets if n.version == version)


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
    proxy6: str | None = None,
    log_group: int | None = None,
) -> str:
    """The batch that installs (or replaces) sandbox ``addrs.index``'s chain, its deny chain,
    its name-rule sets, its NAT chain and its map entries in ``table`` (see ``firewall.py``);
    ``proxy`` (``address:port``): where name-rule addresses on 80/443 are DNAT'ed, None:
    nowhere; ``proxy6`` (``[address]:port``): the same for their IPv6 addresses (the chain
    has IPv6 rules when ``addrs`` has a v6 pair); ``log_group``: the NFLOG group refusals are
    logged to, None: not logged."""
    t, n = table, addrs.index
    chain, nat, deny = f"sbx_{n}", f"nat_{n}", f"deny_{n}"
    v6 = addrs.sandbox6 is not None
    lines = [f"add chain inet {t} {nat}", f"flush chain inet {t} {nat}"]
    lines += compile_chain(
        t,
        n,
        policy,
        generation=generation,
        source=str(addrs.sandbox),
        log_group=log_group,
        source6=str(addrs.sandbox6) if v6 else None,
        ipv6=v6,
    )
    if proxy is not None:
        lines += compile_nat(t, n, policy, proxy, proxy6, ipv6=v6)
    lines.append(f'add element inet {t} dispatch {{ "{ifname}" : jump {chain} }}')
    lines.append(f'add element inet {t} natdispatch {{ "{ifname}" : jump {nat} }}')
    lines.append(f'add element inet {t} deny {{ "{ifname}" : goto {deny} }}')
    return "\n".join(lines) + "\n"


def compile_nat(
    table: str,
    index: int,
    policy: NetworkPolicy,
    proxy: str,
    proxy6: str | None = None,
    *,
    ipv6: bool = False,
    match: str = "",
) -> list[str]:
    """The rules of NAT chain ``nat_<index>`` (already flushed) sending TCP 80/443 of the
    name-rule sets' and the injection set's addresses to the egress proxy at ``proxy``
    (``address:port``; ``proxy6``: the IPv6 one), creating the injection set when the policy
    injects. ``match``: a prefix every rule gets (a Pod: the sandbox's uid)."""
    t, n, nat = table, index, f"nat_{index}"
    proxied = [(set_name(n, r), set_name6(n, r)) for r in policy.name_rules]
    lines = []
    if injects(policy, proxy):
        j = inject_set(n)
        lines.append(f"add set inet {t} {j} {{ type ipv4_addr; flags timeout; }}")
        if ipv6:
            lines.append(f"add set inet {t} {j}_6 {{ type ipv6_addr; flags timeout; }}")
        proxied.append((j, f"{j}_6"))
    for name, name6 in proxied:
        lines.append(
            f"add rule inet {t} {nat} {match}ip daddr @{name} tcp dport "
            f"{PROXIED_PORTS} dnat ip to {proxy}"
        )
        if ipv6 and proxy6 is not None:
            lines.append(
                f"add rule inet {t} {nat} {match}ip6 daddr @{name6} tcp dport "
                f"{PROXIED_PORTS} dnat ip6 to {proxy6}"
            )
    return lines


def compile_chain(
    table: str,
    index: int,
    policy: NetworkPolicy,
    *,
    generation: int,
    source: str | None,
    log_group: int | None = None,
    source6: str | None = None,
    ipv6: bool = False,
) -> list[str]:
    """The commands that (re)fill chain ``sbx_<index>`` of ``table`` from ``policy``, with its
    deny chain ``deny_<index>``, counter ``denied_<index>`` and name-rule sets, in the module
    docstring's order. ``source``: the only address the sandbox may send from (None: no check;
    a Pod's chain is reached by uid); ``log_group``: as :func:`compile_sandbox`'s; ``ipv6``:
    the IPv6 twins of every rule (``source6``: the only v6 source). The table needs the sets
    ``hard4`` and ``special4`` (and ``hard6``, ``special6`` with ``ipv6``)."""
    t, n = table, index
    chain, deny = f"sbx_{n}", f"deny_{n}"
    drop = f"goto {deny}"
    lines = [
        f"add counter inet {t} denied_{n}",
        f"add chain inet {t} {deny}",
        f"add chain inet {t} {chain}",
        f"flush chain inet {t} {deny}",
        f"flush chain inet {t} {chain}",
    ]
    if log_group is not None:
        lines.append(
            f"add rule inet {t} {deny} limit rate {LOG_RATE} burst {LOG_BURST} packets "
            f'log prefix "{log_prefix(t, n)}" group {log_group} snaplen {LOG_SNAPLEN}'
        )
    lines.append(f"add rule inet {t} {deny} counter name denied_{n} drop")
    for rule in policy.name_rules:
        lines.append(f"add set inet {t} {set_name(n, rule)} {{ type ipv4_addr; flags timeout; }}")
        if ipv6:
            s6 = set_name6(n, rule)
            lines.append(f"add set inet {t} {s6} {{ type ipv6_addr; flags timeout; }}")
    head = f"add rule inet {t} {chain}"
    if source is not None:
        lines.append(f"{head} ip saddr != {source} {drop}")  # spoofed
    if ipv6:
        # no v6 source of its own: every v6 packet is spoofed (or link-local: ND stays on-link)
        lines.append(f"{head} ip6 saddr != {source6 or '::'} {drop}")
    lines.append(f"{head} ip daddr @hard4 {drop}")  # counted here too (forward has it)
    if ipv6:
        lines.append(f"{head} ip6 daddr @hard6 {drop}")
    lines.append(f"{head} ct state established,related ct mark {generation} accept")
    if (limit := policy.limits.max_connections) is not None:
        if ipv6:  # both families in one count: keyed by the sandbox's interface
            lines.append(f"add set inet {t} cl{n} {{ type ifname; size 1; flags dynamic; }}")
            lines.append(
                f"{head} ct state new add @cl{n} {{ iifname ct count over {limit} }} {drop}"
            )
        else:
            lines.append(f"add set inet {t} cc{n} {{ type ipv4_addr; size 1; flags dynamic; }}")
            lines.append(
                f"{head} ct state new add @cc{n} {{ ip saddr ct count over {limit} }} {drop}"
            )
    if policy.mode is not NetworkMode.DENY_ALL:
        accept = f"ct mark set {generation} accept"
        lines += _rules(head, n, policy, drop, accept, ipv6=ipv6)
    else:
        lines.append(f"{head} {drop}")
    if policy.mode is NetworkMode.ALLOWLIST:  # public ends in accept, deny-all in drop
        lines.append(f"{head} {drop}")
    return lines


def _rules(
    head: str, n: int, policy: NetworkPolicy, drop: str, accept: str, *, ipv6: bool = False
) -> list[str]:
    lines = []
    families = {4: "ip", 6: "ip6"} if ipv6 else {4: "ip"}
    for r in policy.deny:
        if r.network is not None and r.network.version in families:
            lines.append(
                f"{head} {families[r.network.version]} daddr {r.network} {_ports(r)}{drop}"
            )
    for r in policy.allow:
        if r.network is not None and r.network.version in families:
            family = families[r.network.version]
            lines.append(f"{head} {family} daddr {r.network} {_ports(r)}{accept}")
        elif r.is_name:
            lines.append(f"{head} ip daddr @{set_name(n, r)} {_ports(r)}{accept}")
            if ipv6:
                lines.append(f"{head} ip6 daddr @{set_name6(n, r)} {_ports(r)}{accept}")
    if policy.mode is NetworkMode.PUBLIC:
        lines.append(f"{head} ip daddr @special4 {drop}")
        if ipv6:
            lines.append(f"{head} ip6 daddr @special6 {drop}")
        lines.append(f"{head} {accept}")
    return lines
