"""What a sandbox's policy lets through of an upstream DNS answer (pure: no I/O).

The resolver asks the upstream only for names the policy allows; the answer still has to be
screened, because the upstream (or whoever controls an allowed zone) decides what it says:

- **Addresses** (A/AAAA): each is checked with ``address_verdict`` of the policy seen in
  ``public`` mode with the policy's own rules: the metadata service, ``SPECIAL_RANGES``
  (loopback, private, link-local, ...) and deny CIDRs are removed unless an allow CIDR names
  them. In ``public`` mode that is DNS rebinding protection; in ``allowlist`` mode it means an
  allowed name cannot open a private address by answering one (``*.github.io`` is anyone's
  zone): to reach an internal service by name, allow its CIDR too. Deny CIDRs with ports are
  left to the firewall (a lookup has no port).
- **Names in the chain**: a CNAME/DNAME target, or the owner of any record, that a *deny* rule
  covers refuses the whole answer (``allowed.example CNAME denied.example`` would otherwise
  reach the denied name's addresses). Chain names are not held to the allowlist itself: an
  allowed API name commonly points at a CDN name nobody would list.
- **HTTPS/SVCB** records pass, minus ``ipv4hint``/``ipv6hint`` (addresses that would bypass the
  A/AAAA screening and never reach the firewall's sets) and ``ech`` (Encrypted Client Hello
  hides the SNI the egress proxy checks); a record whose ``mandatory`` list needs a stripped
  key is dropped, as a client could not use it anyway.
- **TTLs** are capped at ``max_ttl``, so a client never caches an address longer than the
  firewall keeps it open.
"""

from __future__ import annotations

import dataclasses
import ipaddress

import dns.name
import dns.rdata
import dns.rdatatype
import dns.rrset
from dns.rdtypes.svcbbase import ParamKey, SVCBBase

from sandpod_contract.network import NetworkMode, NetworkPolicy, Rule

__all__ = ["Screened", "allowing_rules", "screen"]

_ADDRESS_TYPES = (dns.rdatatype.A, dns.rdatatype.AAAA)
_SVCB_TYPES = (dns.rdatatype.SVCB, dns.rdatatype.HTTPS)
_STRIPPED_KEYS = frozenset({ParamKey.IPV4HINT, ParamKey.IPV6HINT, ParamKey.ECH})


@dataclasses.dataclass(frozen=True, slots=True)
class Screened:
    """The part of an answer a sandbox may see, and what was taken out."""

    answer: list[dns.rrset.RRset]
    addresses: list[tuple[str, int]]  # kept A/AAAA: (address, capped ttl)
    removed: list[tuple[str, str]]  # (address, the verdict's reason)
    names: frozenset[str]  # every owner name in the answer (the query name's chain)
    denied_by: tuple[str, str] | None = None  # (chain name, deny rule) refusing it all


def allowing_rules(policy: NetworkPolicy, name: str) -> list[Rule]:
    """The allow rules that name ``name`` (their ports are what the firewall opens)."""
    return [rule for rule in policy.allow if rule.covers_name(name)]


def _address_view(policy: NetworkPolicy) -> NetworkPolicy:
    return dataclasses.replace(
        policy,
        mode=NetworkMode.PUBLIC,
        deny=tuple(rule for rule in policy.deny if rule.ports is None),
    )


def _text(name: dns.name.Name) -> str:
    return name.to_text(omit_final_dot=True).lower()


def _denied(policy: NetworkPolicy, name: str) -> str | None:
    return next((rule.text for rule in policy.deny if rule.covers_name(name)), None)


def _strip_svcb(rdata: dns.rdata.Rdata) -> dns.rdata.Rdata | None:
    if not isinstance(rdata, SVCBBase) or not _STRIPPED_KEYS & set(rdata.params):
        return rdata
    mandatory = rdata.params.get(ParamKey.MANDATORY)
    if mandatory is not None and _STRIPPED_KEYS & set(getattr(mandatory, "keys", ())):
        return None
    params = {k: v for k, v in rdata.params.items() if k not in _STRIPPED_KEYS}
    return rdata.replace(params=params)


def screen(
    policy: NetworkPolicy, answer: list[dns.rrset.RRset], max_ttl: int, remaining: int | None
) -> Screened:
    """Screen ``answer`` (the upstream's answer section) for a sandbox under ``policy``.

    Args:
        policy: the sandbox's policy; its ``name_verdict`` already allowed the query name.
        answer: RRsets as the upstream (or the cache) gave them; not modified.
        max_ttl: the highest TTL a client is told.
        remaining: the seconds a cached answer has left (None: fresh); TTLs are cut to it.

    Returns:
        the screened answer; ``denied_by`` set means the resolver must refuse it whole.
    """
    view: NetworkPolicy | None = None
    out: list[dns.rrset.RRset] = []
    addresses: list[tuple[str, int]] = []
    removed: list[tuple[str, str]] = []
    names: set[str] = set()
    for rrset in answer:
        owner = _text(rrset.name)
        names.add(owner)
        targets = [owner]
        if rrset.rdtype in (dns.rdatatype.CNAME, dns.rdatatype.DNAME):
            targets += [_text(rd.target) for rd in rrset]
        for name in targets:
            if (rule := _denied(policy, name)) is not None:
                return Screened([], [], [], frozenset(names), (name, rule))
        ttl = min(rrset.ttl, max_ttl, remaining if remaining is not None else rrset.ttl)
        kept: list[dns.rdata.Rdata] = []
        for original in rrset:
            rdata: dns.rdata.Rdata | None = original
            if rrset.rdtype in _ADDRESS_TYPES:
                view = view or _address_view(policy)
                address = ipaddress.ip_address(original.address)
                verdict = view.address_verdict(address)
                if not verdict.allowed:
                    removed.append((str(address), verdict.reason))
                    continue
                addresses.append((str(address), max(ttl, 0)))
            elif rrset.rdtype in _SVCB_TYPES:
                rdata = _strip_svcb(original)
            if rdata is not None:
                kept.append(rdata)
        if kept:
            out.append(dns.rrset.from_rdata_list(rrset.name, max(ttl, 0), kept))
    return Screened(out, addresses, removed, frozenset(names))
