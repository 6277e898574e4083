"""What the egress proxy does with one connection: refuse it, splice it, or intercept it.

A pure function of the sandbox's policy, the connection's original destination, what the
first bytes named (:mod:`.sniff`) and the names the resolver answered *to this sandbox* for
that address. The rules, in order:

1. An address the policy denies by an explicit rule (a ``deny`` CIDR, ``deny-all``, the
   metadata service) is refused whatever name it is asked under.
2. ECH hides the real name: treated as no name at all.
3. No name (IP-literal TLS, no SNI, no Host, another protocol): allowed only if the address
   alone is allowed (a CIDR rule, or a public address in ``public`` mode). A connection that
   reached a name rule's address without saying the name is refused.
4. A name the policy denies (``name_verdict``) is refused, even on an address that is
   otherwise open: on a shared CDN address the name, not the address, is the destination.
5. An allowed name is let through if the address is allowed on its own, or if the resolver
   answered this name with this address to this sandbox (``resolved_names``). A name rule
   opens the addresses its name resolves to, not every address a sandbox pins in
   ``/etc/hosts``.
6. Allowed, and the name is covered by an ``inject`` entry: intercepted (TLS terminated with
   the installation's authority for that entry's domain, the header added) -- but only if the
   resolver answered this name with this address to this sandbox, whatever the mode: in
   ``public`` mode the address is allowed on its own, and a sandbox that pins an injected
   name to another address that reaches the proxy (one answered for another injected name)
   must not have the secret sent there. Refused (``not-resolved``) otherwise.

In ``public`` mode the proxy sees only connections to addresses the resolver answered for an
injected name (the firewall's injection set); those for any other name (a CDN address shared
with other names) are allowed by the rules above and spliced, or for plain HTTP passed with
their Host checked, unchanged.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Iterable, Set

from sandpod_contract.network import METADATA_ADDRESSES, HeaderInjection, NetworkPolicy
from sandpod_lifecycle.network.sniff import Sniffed

__all__ = ["Decision", "HardDenies", "decide"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_NOT_EXPLICIT = ("mode:allowlist", "special-range")


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    rule: str  # the rule (or reason: not-resolved, no-name, ...) that decided
    inject: HeaderInjection | None = None


def decide(
    policy: NetworkPolicy,
    address: IPAddress,
    port: int,
    sniffed: Sniffed,
    resolved: Set[str],
) -> Decision:
    """The decision for one connection (see the module docstring for the rules)."""
    by_address = policy.address_verdict(address, port)
    if not by_address.allowed and by_address.reason not in _NOT_EXPLICIT:
        return Decision(False, by_address.reason)
    name = None if sniffed.ech else sniffed.name
    if name is None:
        if by_address.allowed:
            return Decision(True, by_address.reason)
        return Decision(False, "ech" if sniffed.ech else f"no-name:{sniffed.kind}")
    by_name = policy.name_verdict(name, port)
    if not by_name.allowed:
        return Decision(False, by_name.reason)
    inject = next((i for i in policy.inject if i.domain.covers_name(name)), None)
    if name not in resolved and (inject is not None or not by_address.allowed):
        return Decision(False, "not-resolved")
    return Decision(True, by_name.reason, inject)


# Destinations the proxy never connects to, whatever the policy: the firewall's hard denies
# apply to forwarded packets, but a DNAT'ed connection becomes the proxy's *own* connection
# from the host, so the proxy must refuse them itself.
_ALWAYS_FORBIDDEN = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "224.0.0.0/4",
        "240.0.0.0/4",
        "::/128",
        "::1/128",
        "fe80::/10",
        "ff00::/8",
    )
)


class HardDenies:
    """The ``forbidden`` predicate of the proxy: loopback, link-local (the metadata service),
    multicast, the cloud metadata addresses, plus ``extra`` (the lifecycle passes the host's
    own addresses and the sandbox address pool: other sandboxes)."""

    def __init__(self, extra: Iterable[ipaddress.IPv4Network | ipaddress.IPv6Network] = ()) -> None:
        self.networks = (*_ALWAYS_FORBIDDEN, *extra)

    def __call__(self, address: IPAddress, port: int) -> str | None:
        if address in METADATA_ADDRESSES:
            return "metadata"
        for net in self.networks:
            if net.version == address.version and address in net:
                return f"hard-deny:{net}"
        return None
