"""What the egress proxy is configured with and asks about: its settings, the resolver's
record, and a thread-safe sandbox directory (the sandbox and denial types every enforcer
shares are in ``sandboxnet.py``).

Kept apart from the proxy's connection handling so the lifecycle's wiring reads one small
module.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Mapping, Set
from pathlib import Path
from typing import Protocol

from sandpod_lifecycle.network.origdst import IPAddress
from sandpod_lifecycle.network.sandboxnet import SandboxNet
from sandpod_lifecycle.network.sniff import MAX_HELLO
from sandpod_service import env_float, env_int, env_str

__all__ = ["ProxySettings", "ResolvedNames", "SandboxDirectory", "plain_address"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProxySettings:
    sniff_timeout: float = 10.0  # a client must send its ClientHello / request head by then
    sniff_max_bytes: int = MAX_HELLO
    max_sniffing: int = 256  # connections waiting for their first bytes at once
    max_connections: int = 8192  # connections at once; past it new ones are closed
    connect_timeout: float = 10.0
    handshake_timeout: float = 15.0  # TLS with the sandbox, then with the real server
    response_grace: float = 10.0  # how long a refused request waits for earlier responses
    upstream_ca_file: Path | None = None  # None: the host's trust store
    denial_burst: int = 20  # denial events per sandbox at once ...
    denial_rate: float = 1.0  # ... refilled per second

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ProxySettings:
        """Read once at start (the lifecycle's settings call this):

        | variable | default | meaning |
        |---|---|---|
        | ``SANDPOD_EGRESS_SNIFF_TIMEOUT`` | 10 s | a client's ClientHello / request head deadline |
        | ``SANDPOD_EGRESS_MAX_SNIFFING`` | 256 | connections waiting for first bytes at once |
        | ``SANDPOD_EGRESS_MAX_CONNECTIONS`` | 8192 | proxied connections at once (node-wide) |
        | ``SANDPOD_EGRESS_CONNECT_TIMEOUT`` | 10 s | connecting to the real destination |
        | ``SANDPOD_EGRESS_UPSTREAM_CA_FILE`` | host's store | CA bundle for intercepted upstreams |

        Raises SettingsError (a value that is no number) or ValueError (out of range).
        """
        base = cls()
        ca = env_str(env, "SANDPOD_EGRESS_UPSTREAM_CA_FILE", "")
        return cls(
            sniff_timeout=env_float(env, "SANDPOD_EGRESS_SNIFF_TIMEOUT", base.sniff_timeout),
            max_sniffing=env_int(env, "SANDPOD_EGRESS_MAX_SNIFFING", base.max_sniffing, minimum=1),
            max_connections=env_int(
                env, "SANDPOD_EGRESS_MAX_CONNECTIONS", base.max_connections, minimum=1
            ),
            connect_timeout=env_float(env, "SANDPOD_EGRESS_CONNECT_TIMEOUT", base.connect_timeout),
            upstream_ca_file=Path(ca) if ca else None,
        )

    def __post_init__(self) -> None:
        if self.sniff_timeout <= 0 or self.connect_timeout <= 0 or self.handshake_timeout <= 0:
            raise ValueError("egress proxy timeouts must be > 0")
        if not 64 <= self.sniff_max_bytes <= MAX_HELLO:
            raise ValueError(f"sniff_max_bytes must be 64..{MAX_HELLO}")
        if self.max_sniffing < 1 or self.max_connections < 1:
            raise ValueError("max_sniffing and max_connections must be >= 1")


class ResolvedNames(Protocol):
    """The resolver's record: names it answered ``sandbox_id`` with ``address`` (live TTL).
    ``resolver.NodeResolver.resolved_names`` has this shape."""

    def __call__(self, sandbox_id: str, address: str) -> Set[str]: ...


class SandboxDirectory:
    """A :data:`~.sandboxnet.SandboxLookup` safe to call from the proxy's thread: source
    address -> :class:`~.sandboxnet.SandboxNet`, written by the lifecycle (its loop); each
    write replaces the whole mapping, so a read is one dictionary lookup on a mapping nobody
    mutates (no lock, no torn state)."""

    def __init__(self) -> None:
        self._map: dict[str, SandboxNet] = {}

    def set(self, address: str, net: SandboxNet) -> None:
        """Add or update a sandbox (at creation and on every policy update)."""
        self._map = {**self._map, _key(address): net}

    def remove(self, address: str) -> None:
        self._map = {a: n for a, n in self._map.items() if a != _key(address)}

    def __call__(self, source: str) -> SandboxNet | None:
        return self._map.get(_key(source))


def _key(address: str) -> str:
    try:
        return str(plain_address(ipaddress.ip_address(address)))
    except ValueError:
        return address


def plain_address(address: IPAddress) -> IPAddress:
    """An IPv4-mapped IPv6 address as the IPv4 address it is."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address
