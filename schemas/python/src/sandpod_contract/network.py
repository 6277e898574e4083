"""``spec.network``: a sandbox's egress policy, the one model every enforcer reads.

A policy is a ``mode`` plus ``allow`` and ``deny`` rules (and optional limits and header
injections). The local runtime's nftables rules, the per-node DNS resolver, the egress proxy's
SNI/Host check and the Kubernetes NetworkPolicy are all compiled from this one value, so they
cannot disagree about what a rule means. Data flows: wire map -> :meth:`NetworkPolicy.from_dict`
(typed ``ResourceInvalid`` naming the field) -> enforcers ask :meth:`NetworkPolicy.name_verdict`
(a DNS name or TLS SNI / HTTP Host) and :meth:`NetworkPolicy.address_verdict` (an address and
port).

Modes:
    ``public``     (the default of a template that says nothing) the public internet, any port;
                   special-purpose ranges (:data:`SPECIAL_RANGES`: private, loopback,
                   link-local with the cloud metadata address, CGNAT, multicast, ...) refused
                   unless an ``allow`` CIDR rule names them.
    ``allowlist``  only what an ``allow`` rule names.
    ``deny-all``   nothing at all; DNS lookups are refused too.
``deny`` rules apply on top of every mode and beat any ``allow`` rule. Some destinations no rule
can open (the host's own addresses, the platform's ports, other sandboxes, the metadata
service): those are the enforcer's, which knows them (:data:`METADATA_ADDRESSES` here).

Rules are strings: ``example.com`` (exactly that name), ``*.example.com`` (any name below it,
not the apex), ``10.0.0.0/8`` or ``1.2.3.4`` or ``2001:db8::/32`` (addresses), each optionally
with ports: ``example.com:443``, ``10.0.0.0/8:8000-8100``, ``[2001:db8::1]:443``.

Wire form (``spec.network`` of a template or a sandbox)::

    {"mode": "public|allowlist|deny-all", "allow": [rule...], "deny": [rule...],
     "limits": {"bandwidthBytesPerSecond": int, "maxConnections": int},
     "inject": [{"domain": rule-name, "header": str, "secret": name, "format": "Bearer {secret}"}]}

The older form ``{"egress": [rule...]}`` (a template's allowlist before modes existed) still
parses: it is ``allowlist`` with those rules, and an empty list is ``deny-all``.
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import re
from collections.abc import Iterable, Mapping
from typing import Any

from sandpod_contract.errors import ResourceInvalid

__all__ = [
    "MAX_RULES",
    "METADATA_ADDRESSES",
    "SPECIAL_RANGES",
    "HeaderInjection",
    "NetworkLimits",
    "NetworkMode",
    "NetworkPolicy",
    "PortRange",
    "Rule",
    "Verdict",
    "effective_policy",
]

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

MAX_RULES = 512  # per list: a policy is compiled into kernel sets on every change
MAX_INJECTIONS = 32
# The cloud metadata service and its IPv6 twin (AWS/GCP/Azure/OpenStack use these addresses).
METADATA_ADDRESSES = (
    ipaddress.ip_address("169.254.169.254"),
    ipaddress.ip_address("fd00:ec2::254"),
)
# Not the public internet: refused in ``public`` mode unless an ``allow`` CIDR names them.
SPECIAL_RANGES: tuple[IPNetwork, ...] = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",  # "this network"
        "10.0.0.0/8",  # private
        "100.64.0.0/10",  # carrier-grade NAT
        "127.0.0.0/8",  # loopback
        "169.254.0.0/16",  # link-local, the metadata service
        "172.16.0.0/12",  # private
        "192.0.0.0/24",  # IETF protocol assignments
        "192.0.2.0/24",  # TEST-NET-1
        "192.168.0.0/16",  # private
        "198.18.0.0/15",  # benchmarking
        "198.51.100.0/24",  # TEST-NET-2
        "203.0.113.0/24",  # TEST-NET-3
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, broadcast
        "::/128",  # unspecified
        "::1/128",  # loopback
        "::ffff:0:0/96",  # IPv4-mapped: would smuggle a v4 address past v4 rules
        "64:ff9b::/96",  # NAT64: the same
        "100::/64",  # discard
        "2001:db8::/32",  # documentation
        "fc00::/7",  # unique local (fd00:ec2::254 is in it)
        "fe80::/10",  # link-local
        "ff00::/8",  # multicast
    )
)
_LABEL = r"(?!-)[a-z0-9_-]{1,63}(?<!-)"
_NAME = re.compile(rf"(\*\.)?{_LABEL}(\.{_LABEL})*")
_HEADER = re.compile(r"[A-Za-z0-9-]{1,64}")
# a secret's name; in Kubernetes mode "<Secret>/<key>": a key of a Secret in the namespace
_SECRET = re.compile(r"[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?(/[-._a-zA-Z0-9]{1,253})?")


class NetworkMode(enum.StrEnum):
    PUBLIC = "public"
    ALLOWLIST = "allowlist"
    DENY_ALL = "deny-all"


def _fail(field: str, why: str) -> ResourceInvalid:
    return ResourceInvalid(f"{field}: {why}", field=field)


@dataclasses.dataclass(frozen=True, slots=True)
class PortRange:
    first: int
    last: int

    def __contains__(self, port: object) -> bool:
        return isinstance(port, int) and self.first <= port <= self.last

    def __str__(self) -> str:
        return str(self.first) if self.first == self.last else f"{self.first}-{self.last}"

    @classmethod
    def parse(cls, field: str, text: str) -> PortRange:
        first, _, last = text.partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            raise _fail(field, f"{text!r} is not a port or a port range")
        lo, hi = int(first), int(last or first)
        if not 1 <= lo <= hi <= 65535:
            raise _fail(field, f"{text!r}: ports are 1-65535, low-high")
        return cls(lo, hi)


@dataclasses.dataclass(frozen=True, slots=True)
class Rule:
    """One ``allow``/``deny`` entry: a DNS name (exact or ``*.`` wildcard) or an address range,
    with the ports it covers (none: every port)."""

    text: str
    name: str | None = None  # lower case, no trailing dot; "*.x" for a wildcard
    network: IPNetwork | None = None
    ports: PortRange | None = None

    @property
    def is_name(self) -> bool:
        return self.name is not None

    @classmethod
    def parse(cls, field: str, raw: Any) -> Rule:
        """A rule from its text. Raises ResourceInvalid naming ``field`` and the text."""
        if not isinstance(raw, str) or not raw or len(raw) > 300:
            raise _fail(field, "a rule is a non-empty string of at most 300 characters")
        text = raw.strip().lower()
        host, ports = _split_port(field, text)
        try:
            network = ipaddress.ip_network(host, strict=False)
        except ValueError:
            network = None
        if network is not None:
            return cls(raw, network=network, ports=ports)
        name = host.rstrip(".")
        if not _NAME.fullmatch(name) or len(name) > 253:
            raise _fail(field, f"{raw!r} is neither a DNS name, a *.wildcard nor an address/CIDR")
        return cls(raw, name=name, ports=ports)

    def covers_port(self, port: int | None) -> bool:
        return self.ports is None or port is None or port in self.ports

    def covers_name(self, name: str) -> bool:
        """True when this is a name rule that names ``name`` (any case, trailing dot or not)."""
        if self.name is None:
            return False
        name = name.lower().rstrip(".")
        if self.name.startswith("*."):
            return name.endswith(self.name[1:])
        return name == self.name

    def covers_address(self, address: IPAddress) -> bool:
        return self.network is not None and address in self.network

    def to_wire(self) -> str:
        return self.text


def _split_port(field: str, text: str) -> tuple[str, PortRange | None]:
    if text.startswith("["):  # [v6]:port
        host, sep, rest = text[1:].partition("]")
        if not sep:
            raise _fail(field, f"{text!r}: unclosed [")
        if not rest:
            return host, None
        if not rest.startswith(":"):
            raise _fail(field, f"{text!r}: expected :port after ]")
        return host, PortRange.parse(field, rest[1:])
    if text.count(":") == 1:  # name:port or v4:port (a bare v6 address has several colons)
        host, _, port = text.partition(":")
        return host, PortRange.parse(field, port)
    return text, None


@dataclasses.dataclass(frozen=True, slots=True)
class NetworkLimits:
    bandwidth_bytes_per_second: int | None = None
    max_connections: int | None = None

    @classmethod
    def from_dict(cls, raw: Any) -> NetworkLimits:
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise _fail("spec.network.limits", "must be a map")
        values: list[int | None] = []
        for key in ("bandwidthBytesPerSecond", "maxConnections"):
            value = raw.get(key)
            if value is not None and (type(value) is not int or value < 1):
                raise _fail(f"spec.network.limits.{key}", "must be an integer >= 1")
            values.append(value)
        return cls(values[0], values[1])

    def to_dict(self) -> dict[str, int]:
        out: dict[str, int] = {}
        if self.bandwidth_bytes_per_second is not None:
            out["bandwidthBytesPerSecond"] = self.bandwidth_bytes_per_second
        if self.max_connections is not None:
            out["maxConnections"] = self.max_connections
        return out


@dataclasses.dataclass(frozen=True, slots=True)
class HeaderInjection:
    """A header the egress path adds to requests for ``domain`` (an exact or ``*.`` name): the
    value is ``format`` with ``{secret}`` replaced by the named secret's value, which never
    enters the sandbox."""

    domain: Rule
    header: str = "Authorization"
    secret: str = ""
    format: str = "Bearer {secret}"

    @classmethod
    def from_dict(cls, field: str, raw: Any) -> HeaderInjection:
        if not isinstance(raw, Mapping):
            raise _fail(field, "must be a map with domain, secret (and header, format)")
        domain = Rule.parse(f"{field}.domain", raw.get("domain"))
        if not domain.is_name or domain.ports is not None:
            raise _fail(f"{field}.domain", "must be a DNS name or *.wildcard, without a port")
        header = raw.get("header", "Authorization")
        if not isinstance(header, str) or not _HEADER.fullmatch(header):
            raise _fail(f"{field}.header", "must be an HTTP header name")
        secret = raw.get("secret")
        if not isinstance(secret, str) or not _SECRET.fullmatch(secret):
            raise _fail(
                f"{field}.secret", "must name a secret (lower-case DNS label, or Secret/key)"
            )
        fmt = raw.get("format", "Bearer {secret}")
        if not isinstance(fmt, str) or fmt.count("{secret}") != 1 or len(fmt) > 200:
            raise _fail(f"{field}.format", "must contain {secret} exactly once")
        if any(c in fmt for c in "\r\n\0"):
            raise _fail(f"{field}.format", "must not contain line breaks")
        return cls(domain, header, secret, fmt)

    def to_dict(self) -> dict[str, str]:
        return {
            "domain": self.domain.to_wire(),
            "header": self.header,
            "secret": self.secret,
            "format": self.format,
        }


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """What a policy says of one destination: allowed or not, and the rule (or reason) why."""

    allowed: bool
    reason: str  # the rule's text, or "mode:<mode>" / "special-range" when no rule decided


@dataclasses.dataclass(frozen=True, slots=True)
class NetworkPolicy:
    mode: NetworkMode = NetworkMode.PUBLIC
    allow: tuple[Rule, ...] = ()
    deny: tuple[Rule, ...] = ()
    limits: NetworkLimits = dataclasses.field(default_factory=NetworkLimits)
    inject: tuple[HeaderInjection, ...] = ()

    @classmethod
    def from_dict(cls, raw: Any, field: str = "spec.network") -> NetworkPolicy:
        """Validate a wire policy. Raises ResourceInvalid naming the field at fault."""
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise _fail(field, "must be a map")
        if "egress" in raw and not {"mode", "allow"} & set(raw):  # the older allowlist form
            legacy = _rules(f"{field}.egress", raw["egress"])
            mode = NetworkMode.ALLOWLIST if legacy else NetworkMode.DENY_ALL
            return cls(mode=mode, allow=legacy, deny=_rules(f"{field}.deny", raw.get("deny")))
        mode_raw = raw.get("mode", "public")
        try:
            mode = NetworkMode(mode_raw)
        except ValueError:
            modes = ", ".join(m.value for m in NetworkMode)
            raise _fail(f"{field}.mode", f"{mode_raw!r} is not one of {modes}") from None
        inject_raw = raw.get("inject") or []
        if not isinstance(inject_raw, list) or len(inject_raw) > MAX_INJECTIONS:
            raise _fail(f"{field}.inject", f"must be a list of at most {MAX_INJECTIONS}")
        return cls(
            mode=mode,
            allow=_rules(f"{field}.allow", raw.get("allow")),
            deny=_rules(f"{field}.deny", raw.get("deny")),
            limits=NetworkLimits.from_dict(raw.get("limits")),
            inject=tuple(
                HeaderInjection.from_dict(f"{field}.inject[{i}]", item)
                for i, item in enumerate(inject_raw)
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mode": self.mode.value,
            "allow": [r.to_wire() for r in self.allow],
            "deny": [r.to_wire() for r in self.deny],
        }
        if limits := self.limits.to_dict():
            out["limits"] = limits
        if self.inject:
            out["inject"] = [i.to_dict() for i in self.inject]
        return out

    def name_verdict(self, name: str, port: int | None = None) -> Verdict:
        """May the sandbox reach ``name`` (a DNS query, a TLS SNI, an HTTP Host) on ``port``
        (None: any port, as for a DNS lookup)? Addresses it resolves to are still checked by
        :meth:`address_verdict` (a name allowed in ``public`` mode that points at a private
        address is refused there: DNS rebinding)."""
        if self.mode is NetworkMode.DENY_ALL:
            return Verdict(False, "mode:deny-all")
        for rule in self.deny:
            if rule.covers_name(name) and rule.covers_port(port):
                return Verdict(False, rule.text)
        for rule in self.allow:
            if rule.covers_name(name) and rule.covers_port(port):
                return Verdict(True, rule.text)
        if self.mode is NetworkMode.PUBLIC:
            return Verdict(True, "mode:public")
        return Verdict(False, "mode:allowlist")

    def address_verdict(self, address: str | IPAddress, port: int | None = None) -> Verdict:
        """May the sandbox connect to ``address`` on ``port`` by address rules alone (CIDR rules
        and the mode)? In ``allowlist`` mode an address that only a *name* rule covers is
        allowed by the enforcer's resolved-address sets, not here."""
        ip = ipaddress.ip_address(address) if isinstance(address, str) else address
        if self.mode is NetworkMode.DENY_ALL or ip in METADATA_ADDRESSES:
            return Verdict(False, "mode:deny-all" if ip not in METADATA_ADDRESSES else "metadata")
        rule = next((r for r in self.deny if r.covers_address(ip) and r.covers_port(port)), None)
        if rule is not None:
            return Verdict(False, rule.text)
        for rule in self.allow:
            if rule.covers_address(ip) and rule.covers_port(port):
                return Verdict(True, rule.text)
        if self.mode is NetworkMode.ALLOWLIST:
            return Verdict(False, "mode:allowlist")
        special = any(ip in net for net in SPECIAL_RANGES if net.version == ip.version)
        return Verdict(not special, "special-range" if special else "mode:public")

    @property
    def name_rules(self) -> tuple[Rule, ...]:
        """The allow rules that are names: their resolved addresses are what the enforcer opens."""
        return tuple(r for r in self.allow if r.is_name)

    @property
    def has_name_rules(self) -> bool:
        return any(r.is_name for r in (*self.allow, *self.deny))


def _rules(field: str, raw: Any) -> tuple[Rule, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_RULES:
        raise _fail(field, f"must be a list of at most {MAX_RULES} rules")
    return tuple(Rule.parse(f"{field}[{i}]", item) for i, item in enumerate(raw))


def effective_policy(
    template: NetworkPolicy, sandbox: NetworkPolicy | None, always_allowed: Iterable[Rule] = ()
) -> NetworkPolicy:
    """The policy a sandbox runs under: its own ``spec.network`` when it has one (a runtime
    update writes there), else its template's; plus the platform's ``always_allowed`` rules
    (lifecycle's ``SANDPOD_NET_ALWAYS_ALLOW``) at the end of ``allow``, those it lacks. Deny
    rules still beat them, and a ``deny-all`` policy stays deny-all (nothing is added to it)."""
    chosen = sandbox if sandbox is not None else template
    # a policy read back from status (platform rules included) and set again gets no copies
    extra = tuple(r for r in always_allowed if r not in chosen.allow)
    if not extra or chosen.mode is NetworkMode.DENY_ALL:
        return chosen
    return dataclasses.replace(chosen, allow=(*chosen.allow, *extra))
