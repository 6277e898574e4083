"""A template's egress policy (:class:`sandpod_contract.network.NetworkPolicy`) as the
Kubernetes NetworkPolicy that selects the template's Pods. Pure: a manifest from typed input.

What a NetworkPolicy can say is less than the model: allow rules only (the union of every
policy selecting a Pod), destinations as CIDRs (``ipBlock``, whose ``except`` entries must lie
inside its ``cidr``), TCP/UDP ports and port ranges. So:

    every mode   no ingress; NATS (its pods and/or CIDRs, port ``nats_port``) always
    public       DNS (port 53) anywhere; 0.0.0.0/0 and ::/0 except SPECIAL_RANGES and every
                 deny CIDR without ports; each allow CIDR as its own block (that is how an
                 allow rule opens a special range), except the metadata address and the deny
                 CIDRs inside it
    allowlist    DNS only when a name rule needs it; each allow CIDR with its ports, except as
                 above
    deny-all     NATS only (no DNS)

What cannot be expressed is returned as ``unenforceable`` (the lifecycle reports it in
``status.network`` and logs it), never silently dropped: DNS-name rules (an allow name is then
closed, a deny name stays open in public mode), deny rules with ports, limits and header
injections (those need the in-Pod enforcer). Ports are TCP (as the egress proxy's are).

With the network guard (``PodSettings.netguard``) the NetworkPolicy is the outer bound and the
guard enforces the policy itself inside the Pod, so: each allow *name* rule opens the public
internet (``0.0.0.0/0`` except ``SPECIAL_RANGES``, the metadata address and deny CIDRs) on its
ports -- the guard's chain then admits only the addresses its resolver answered; the guard's
own needs are added (its upstream DNS ``guard_dns`` on port 53, the API server
``guard_api_cidrs``); names, deny rules with ports and ``maxConnections`` are no longer
reported (the guard enforces them); a bandwidth limit and header injections still are.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from sandpod_contract.network import (
    METADATA_ADDRESSES,
    SPECIAL_RANGES,
    NetworkMode,
    NetworkPolicy,
    Rule,
)
from sandpod_kube.podspec import MANAGED_BY, TEMPLATE_LABEL, PodSettings

__all__ = ["egress_policy", "policy_name", "unenforceable"]

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
_ANY = (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"))
_DNS = {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
_METADATA = tuple(ipaddress.ip_network(a) for a in METADATA_ADDRESSES)


def policy_name(template: str) -> str:
    return f"sandpod-template-{template}"


def _nats(settings: PodSettings) -> list[dict[str, Any]]:
    peers: list[dict[str, Any]] = [{"ipBlock": {"cidr": c}} for c in settings.nats_cidrs]
    if settings.nats_namespace:
        peers.insert(
            0,
            {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": settings.nats_namespace}
                },
                "podSelector": {"matchLabels": dict(settings.nats_pod_labels)},
            },
        )
    # Never a destination-less rule: that would open the port to every address.
    return (
        [{"to": peers, "ports": [{"protocol": "TCP", "port": settings.nats_port}]}] if peers else []
    )


def _mapped(net: IPNetwork) -> bool:
    """An IPv4-mapped IPv6 range (``::ffff:0:0/96``): the API server refuses it in an ipBlock.
    Nothing is lost: a socket connecting to a mapped address sends IPv4 packets, which the
    IPv4 block's rules (and excepts) decide."""
    return isinstance(net, ipaddress.IPv6Network) and net.network_address.ipv4_mapped is not None


def _inside(net: IPNetwork, outer: IPNetwork) -> bool:
    """``net`` strictly inside ``outer`` (what ``ipBlock.except`` accepts)."""
    if net.version != outer.version or net == outer or _mapped(net):
        return False
    return net.subnet_of(outer)  # type: ignore[arg-type]


def _covered(net: IPNetwork, by: list[IPNetwork]) -> bool:
    return any(net.version == d.version and net.subnet_of(d) for d in by)  # type: ignore[arg-type]


def _block(cidr: IPNetwork, excepted: list[IPNetwork]) -> dict[str, Any]:
    inner = sorted({str(n) for n in excepted if _inside(n, cidr)})
    return {"ipBlock": {"cidr": str(cidr), **({"except": inner} if inner else {})}}


def _ports(rule: Rule) -> list[dict[str, Any]]:
    if rule.ports is None:
        return []
    port: dict[str, Any] = {"protocol": "TCP", "port": rule.ports.first}
    if rule.ports.last != rule.ports.first:
        port["endPort"] = rule.ports.last
    return [port]


def _allow_rules(policy: NetworkPolicy, denied: list[IPNetwork]) -> list[dict[str, Any]]:
    """One egress rule per allow CIDR, minus what deny rules and the metadata service take."""
    out = []
    for rule in policy.allow:
        net = rule.network
        if net is None or _mapped(net) or _covered(net, denied):
            continue  # a name or a mapped range (both reported), or wholly denied
        to = _block(net, [*denied, *_METADATA])
        out.append({"to": [to], **({"ports": _ports(rule)} if rule.ports else {})})
    return out


def _host_cidr(server: str) -> str:
    """``ip``, ``ip:port`` or ``[ipv6]:port`` as the address's one-host CIDR."""
    host = server.strip()
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    address = ipaddress.ip_address(host)
    return f"{address}/{address.max_prefixlen}"


def _guard_rules(policy: NetworkPolicy, settings: PodSettings) -> list[dict[str, Any]]:
    """The guard's own egress, and the public internet on each allow name rule's ports."""
    out: list[dict[str, Any]] = []
    dns = [{"ipBlock": {"cidr": _host_cidr(d)}} for d in settings.guard_dns]
    if dns:
        out.append({"to": dns, **_DNS})
    if settings.guard_api_cidrs:
        out.append({"to": [{"ipBlock": {"cidr": c}} for c in settings.guard_api_cidrs]})
    denied = [r.network for r in policy.deny if r.network is not None and r.ports is None]
    public = _block(_ANY[0], [*SPECIAL_RANGES, *_METADATA, *denied])
    for rule in policy.allow:
        if rule.is_name and policy.mode is not NetworkMode.DENY_ALL:
            out.append({"to": [public], **({"ports": _ports(rule)} if rule.ports else {})})
    return out


def unenforceable(policy: NetworkPolicy, guard: bool = False) -> list[str]:
    """What of ``policy`` the Pod runtime cannot enforce: by a NetworkPolicy alone, or
    (``guard``) with the network guard in the Pod."""
    if policy.mode is NetworkMode.DENY_ALL:
        return []
    return _unenforceable(policy, guard)


def _unenforceable(policy: NetworkPolicy, guard: bool = False) -> list[str]:
    if guard:  # the guard enforces names, deny ports and the connection limit
        notes = [
            f"allow rule {r.text!r} is an IPv4-mapped IPv6 range (write the IPv4 range instead)"
            for r in policy.allow
            if r.network is not None and _mapped(r.network)
        ]
        if policy.limits.bandwidth_bytes_per_second is not None:
            notes.append("a bandwidth limit is not enforced in a Pod")
        return notes  # header injections: the guard's egress proxy
    notes = [
        f"{kind} rule {r.text!r} is a DNS name (a NetworkPolicy has addresses only)"
        for kind, rules in (("allow", policy.allow), ("deny", policy.deny))
        for r in rules
        if r.is_name
    ]
    notes += [
        f"allow rule {r.text!r} is an IPv4-mapped IPv6 range (write the IPv4 range instead)"
        for r in policy.allow
        if r.network is not None and _mapped(r.network)
    ]
    notes += [
        f"deny rule {r.text!r} has ports (a NetworkPolicy cannot deny one port)"
        for r in policy.deny
        if r.network is not None and r.ports is not None
    ]
    if policy.limits.to_dict():
        notes.append("limits need the in-Pod enforcer")
    if policy.inject:
        notes.append("header injections need the in-Pod egress proxy")
    return notes


def egress_policy(
    namespace: str, template: str, policy: NetworkPolicy, settings: PodSettings
) -> tuple[dict[str, Any], list[str]]:
    """The template's NetworkPolicy, and what of ``policy`` it cannot enforce (see above)."""
    rules = _nats(settings)
    if policy.mode is not NetworkMode.DENY_ALL:
        # deny rules without ports: taken out of every block (deny beats allow)
        denied = [r.network for r in policy.deny if r.network is not None and r.ports is None]
        if policy.mode is NetworkMode.PUBLIC or policy.name_rules:
            rules.append(dict(_DNS))  # names need DNS
        if policy.mode is NetworkMode.PUBLIC:
            rules.append({"to": [_block(any_, [*SPECIAL_RANGES, *denied]) for any_ in _ANY]})
        rules += _allow_rules(policy, denied)
    if settings.netguard:
        rules += _guard_rules(policy, settings)
    manifest = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": policy_name(template),
            "namespace": namespace,
            "labels": {TEMPLATE_LABEL: template, "app.kubernetes.io/managed-by": MANAGED_BY},
        },
        "spec": {
            "podSelector": {"matchLabels": {TEMPLATE_LABEL: template}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": rules,
        },
    }
    return manifest, unenforceable(policy, settings.netguard)
