"""IPv6 for local sandboxes: whether this host can give it, the host settings it needs, and the
IPv6 parts of the installation's base chains.

:func:`host_support` says whether IPv6 is there at all (``SANDPOD_NET_IPV6`` defaults to it;
the reason it is not goes into the egress's notes and every sandbox's ``egress_ipv6``
protection). :func:`enable_forwarding` is the host effect: ``net.ipv6.conf.all.forwarding=1``
(like ``ip_forward`` for v4, logged, left on). Forwarding makes the kernel ignore router
advertisements on every interface whose ``accept_ra`` is 1 -- a host configured by SLAAC would
lose its default route when it expires -- so every such interface (but ours) is first set to
``accept_ra=2`` ("accept even when forwarding"), and each change is returned as a note.
Interfaces created later inherit ``default/accept_ra`` (left alone: noted in the README).

:func:`base_chains6` is called by ``firewall.Firewall.setup``: without a v6 slice every
IPv6 packet of a sandbox is refused (and logged) in the forward chain; with one, ``hard6``
(:data:`HARD6`, the metadata address, the whole v6 pool, v6 ``hard_deny``) and ``special6``
are filled, the v6
gateway address's service ports and neighbour discovery are let in, link-scope multicast (MLD
reports the sandbox's kernel sends by itself) is dropped unlogged, port 53 goes to the
resolver on the v6 gateway, and the v6 slice is masqueraded (NAT66).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from sandpod_contract.network import METADATA_ADDRESSES, SPECIAL_RANGES
from sandpod_lifecycle.network.addressing import AddressPlan
from sandpod_lifecycle.network.link import OURS, LinkError, run
from sandpod_lifecycle.network.rules import elements

__all__ = ["HARD6", "base_chains6", "enable_forwarding", "host_support", "route_note"]

CONF = Path("/proc/sys/net/ipv6/conf")
# IPv6 no policy opens besides the metadata address and the v6 pool
HARD6 = tuple(
    ipaddress.IPv6Network(n)
    for n in ("fe80::/10", "ff00::/8", "::/128", "::1/128", "::ffff:0:0/96")
)
ND = "icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } ip6 hoplimit 255 accept"


def host_support(conf: Path = CONF) -> str | None:
    """None when this host can route IPv6 for sandboxes, else why not (for people)."""
    try:
        if (conf / "all" / "disable_ipv6").read_text().strip() != "0":
            return "IPv6 is disabled on this host (net.ipv6.conf.all.disable_ipv6=1)"
    except OSError:
        return "this kernel has no IPv6 (no /proc/sys/net/ipv6)"
    return None


def route_note() -> str | None:
    """A note when this host has no IPv6 default route: sandboxes then reach v6 destinations
    only where the host has a route (their ULA source makes dual-stack clients prefer IPv4,
    RFC 6724, so names with both kinds of address still work)."""
    try:
        routes = run(["ip", "-6", "route", "show", "default"]).strip()
    except LinkError as exc:
        return f"cannot read this host's IPv6 routes: {exc}"
    if routes:
        return None
    return "this host has no IPv6 default route: sandboxes reach IPv6 only where it has routes"


def enable_forwarding(conf: Path = CONF) -> list[str]:
    """Set ``net.ipv6.conf.all.forwarding=1`` keeping router advertisements where they were
    accepted (see the module docstring); returns notes for people of what changed."""
    if (conf / "all" / "forwarding").read_text().strip() == "1":
        return []
    notes = []
    for iface in sorted(p.name for p in conf.iterdir()):
        if iface in ("all", "default") or OURS.match(iface):
            continue
        ra = conf / iface / "accept_ra"
        try:
            if ra.read_text().strip() == "1":
                ra.write_text("2")
                notes.append(
                    f"net.ipv6.conf.{iface}.accept_ra was 1: set to 2 (router advertisements "
                    "are still accepted now that this host forwards IPv6)"
                )
        except OSError:
            continue  # gone meanwhile
    (conf / "all" / "forwarding").write_text("1")
    notes.append("net.ipv6.conf.all.forwarding was 0: set to 1 (sandbox IPv6 egress is routed)")
    return notes


def base_chains6(
    table: str,
    prefix: str,
    *,
    plan: AddressPlan,
    ports: str,
    dns_port: int,
    hard_deny: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...],
) -> dict[str, str]:
    """The IPv6 lines of the base chains of ``table`` (by chain name), for sandbox links
    ``<prefix>*``; ``ports``: the gateway's service ports (nft list syntax)."""
    t, pre = table, prefix
    parts = dict.fromkeys(("forward", "input", "output", "prerouting", "postrouting"), "")
    if plan.slice6 is None or plan.gateway6 is None:
        parts["forward"] = (
            f'add rule inet {t} forward iifname "{pre}*" meta nfproto ipv6 iifname vmap @deny\n'
            f'add rule inet {t} forward iifname "{pre}*" meta nfproto ipv6 counter drop\n'
        )
        return parts
    gw6 = plan.gateway6
    hard6 = [
        *(a for a in METADATA_ADDRESSES if a.version == 6),
        plan.pool6,
        *HARD6,
        *(n for n in hard_deny if n.version == 6),
    ]
    parts["forward"] = (
        f"add element inet {t} hard6 {{ {', '.join(str(h) for h in hard6)} }}\n"
        f"add element inet {t} special6 {{ {elements(SPECIAL_RANGES, 6)} }}\n"
        f'add rule inet {t} forward iifname "{pre}*" ip6 daddr @hard6 iifname vmap @deny\n'
        f'add rule inet {t} forward iifname "{pre}*" ip6 daddr @hard6 counter drop\n'
    )
    parts["input"] = (
        f'add rule inet {t} input iifname "{pre}*" ip6 daddr {gw6} '
        f"meta l4proto {{ tcp, udp }} th dport {{ {ports} }} accept\n"
        f'add rule inet {t} input iifname "{pre}*" {ND}\n'
        f'add rule inet {t} input iifname "{pre}*" ip6 daddr ff02::/16 counter drop\n'
    )
    parts["output"] = f'add rule inet {t} output oifname "{pre}*" {ND}\n'
    parts["prerouting"] = (
        f'add rule inet {t} prerouting iifname "{pre}*" meta nfproto ipv6 '
        f"meta l4proto {{ tcp, udp }} th dport 53 dnat ip6 to [{gw6}]:{dns_port}\n"
    )
    parts["postrouting"] = (
        f'add rule inet {t} postrouting ip6 saddr {plan.slice6} oifname != "{pre}*" masquerade\n'
    )
    return parts
