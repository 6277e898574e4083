"""Addresses of one installation's sandboxes: private ranges of its own, a /31 (and a /127) each.

The host-wide *pool* (``SANDPOD_NET_POOL``, default ``10.240.0.0/12``) is cut into slices of
``/20`` (4096 addresses); each installation claims one slice in a small registry
(``/var/lib/sandpod/net-ranges.json`` under an ``flock``, like the uid ranges of
``runtime/installation.py``): its preferred slice comes from its id, the next free one when
another installation holds it, and a slice that overlaps a route or an address this host
already has (a LAN in 10.x) is never taken. A claim whose state dir is gone is given back.

Inside its slice an installation numbers its sandboxes 1, 2, ...; sandbox ``n`` gets the
point-to-point pair ``slice + 2n`` (the host end of its veth) and ``slice + 2n + 1`` (the
sandbox's own address, ``status.endpoint["address"]``). Pair 0 holds the installation's
*gateway address* ``slice + 1``, on which the node's resolver and egress proxy listen.

IPv6 (``SANDPOD_NET_IPV6``): the same, one size up. The host-wide v6 pool
(``SANDPOD_NET_POOL6``, default the ULA ``fd53:616e:6470::/48``) is cut into ``/64`` slices
claimed in the same registry by the same rules (each pool is a key of its own there, so the v6
claims sit next to the v4 ones and are released with them); sandbox ``n`` gets the /127
``slice6 + 2n`` (host end) / ``slice6 + 2n + 1`` (its own), the gateway ``slice6 + 1``. One
index numbers both families, so a sandbox's two addresses never disagree about who it is.

Registry, version 1 (slices by pool, then by index in it)::

    {"version": 1, "pools": {"<pool>": {"<index>": {"id": str, "state_dir": str}}}}
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import ipaddress
import json
import os
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "DEFAULT_POOL",
    "DEFAULT_POOL6",
    "DEFAULT_REGISTRY",
    "SLICE6_PREFIX",
    "SLICE_PREFIX",
    "AddressPlan",
    "PoolExhausted",
    "SandboxAddresses",
    "claim_slice",
    "claim_slice6",
    "claimed_ids",
    "release",
    "release_stale",
]

DEFAULT_POOL = ipaddress.IPv4Network("10.240.0.0/12")
DEFAULT_POOL6 = ipaddress.IPv6Network("fd53:616e:6470::/48")  # ULA; "Sandp" in its bytes
DEFAULT_REGISTRY = Path("/var/lib/sandpod/net-ranges.json")
SLICE_PREFIX = 20
SLICE6_PREFIX = 64
VERSION = 1


class PoolExhausted(Exception):
    """No slice of the pool is free, or no sandbox pair is free in the slice."""

    code = "network.pool_exhausted"
    retryable = False


@dataclasses.dataclass(frozen=True, slots=True)
class SandboxAddresses:
    """One sandbox's pair: ``host`` (the veth's host end, the sandbox's default route) and
    ``sandbox`` (its own address), a /31; ``host6``/``sandbox6`` the same as a /127 (None: the
    installation gives no IPv6)."""

    index: int
    host: ipaddress.IPv4Address
    sandbox: ipaddress.IPv4Address
    host6: ipaddress.IPv6Address | None = None
    sandbox6: ipaddress.IPv6Address | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class AddressPlan:
    """The installation's slice and how it is numbered (see the module docstring)."""

    slice: ipaddress.IPv4Network
    pool: ipaddress.IPv4Network = DEFAULT_POOL
    slice6: ipaddress.IPv6Network | None = None  # None: no IPv6
    pool6: ipaddress.IPv6Network = DEFAULT_POOL6

    @property
    def gateway(self) -> ipaddress.IPv4Address:
        return self.slice.network_address + 1

    @property
    def gateway6(self) -> ipaddress.IPv6Address | None:
        return None if self.slice6 is None else self.slice6.network_address + 1

    @property
    def capacity(self) -> int:
        """How many sandboxes the slice numbers (pair 0 is the gateway's)."""
        return self.slice.num_addresses // 2 - 1

    def sandbox(self, index: int) -> SandboxAddresses:
        if not 1 <= index <= self.capacity:
            raise ValueError(f"sandbox index {index} is outside 1..{self.capacity}")
        host = self.slice.network_address + 2 * index
        if self.slice6 is None:
            return SandboxAddresses(index, host, host + 1)
        host6 = self.slice6.network_address + 2 * index
        return SandboxAddresses(index, host, host + 1, host6, host6 + 1)

    def free_index(self, used: Iterable[int]) -> int:
        """The lowest index not in ``used``. Raises PoolExhausted."""
        taken = set(used)
        for index in range(1, self.capacity + 1):
            if index not in taken:
                return index
        raise PoolExhausted(f"all {self.capacity} sandbox addresses of {self.slice} are in use")


def claim_slice(
    ident: str,
    state_dir: Path,
    pool: ipaddress.IPv4Network = DEFAULT_POOL,
    registry: Path | None = DEFAULT_REGISTRY,
    in_use: Iterable[ipaddress.IPv4Network] = (),
) -> AddressPlan:
    """The installation's slice of ``pool`` (see the module docstring).

    Args:
        ident: the installation id (hex).
        state_dir: its state dir: a claim whose state dir is gone is given back.
        pool: the host-wide pool; at least a /20.
        registry: where claims are kept; None: the preferred slice, unrecorded.
        in_use: networks this host already routes or holds (never taken).

    Raises:
        PoolExhausted: every slice is claimed or overlaps ``in_use``.
        ValueError: the pool is smaller than one slice.
        OSError: the registry cannot be read or written.
    """
    net = _claim(ident, state_dir, pool=pool, prefix=SLICE_PREFIX, registry=registry, in_use=in_use)
    return AddressPlan(ipaddress.IPv4Network(net), pool)


def claim_slice6(
    ident: str,
    state_dir: Path,
    pool: ipaddress.IPv6Network = DEFAULT_POOL6,
    registry: Path | None = DEFAULT_REGISTRY,
    in_use: Iterable[ipaddress.IPv6Network] = (),
) -> ipaddress.IPv6Network:
    """The installation's /64 of the IPv6 ``pool``: :func:`claim_slice`'s rules and registry
    (the v6 pool is a key of its own there). Raises as :func:`claim_slice`."""
    return ipaddress.IPv6Network(
        _claim(ident, state_dir, pool=pool, prefix=SLICE6_PREFIX, registry=registry, in_use=in_use)
    )


def _claim(
    ident: str,
    state_dir: Path,
    *,
    pool: ipaddress.IPv4Network | ipaddress.IPv6Network,
    prefix: int,
    registry: Path | None,
    in_use: Iterable[ipaddress.IPv4Network | ipaddress.IPv6Network],
) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    if pool.prefixlen > prefix:
        raise ValueError(f"the network pool {pool} is smaller than one /{prefix} slice")
    count = 1 << (prefix - pool.prefixlen)
    step = 1 << (pool.max_prefixlen - prefix)

    def nth(index: int) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
        return ipaddress.ip_network(f"{pool.network_address + index * step}/{prefix}")

    busy = [n for n in in_use if n.version == pool.version and n.prefixlen > 0]

    def usable(index: int) -> bool:
        candidate = nth(index)
        return not any(candidate.overlaps(n) for n in busy)

    preferred = int(ident, 16) % count
    order = ((preferred + k) % count for k in range(count))
    if registry is None:
        for index in order:
            if usable(index):
                return nth(index)
        raise PoolExhausted(f"every /{prefix} of {pool} overlaps this host's networks")
    registry.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    fd = os.open(registry.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "r+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        claims = _read(registry)
        mine = claims.setdefault(str(pool), {})
        for index, entry in mine.items():
            if entry.get("id") == ident and index < count:
                return nth(index)
        for index in order:
            held = mine.get(index)
            if held is not None and Path(str(held.get("state_dir", ""))).exists():
                continue
            if not usable(index):
                continue
            mine[index] = {"id": ident, "state_dir": str(state_dir)}
            _write(registry, claims)
            return nth(index)
    raise PoolExhausted(
        f"every /{prefix} slice of {pool} is claimed by a live installation or overlaps "
        f"this host's networks; remove stale entries from {registry} or set SANDPOD_NET_POOL"
        f"{'6' if pool.version == 6 else ''}"
    )


def claimed_ids(registry: Path) -> list[str]:
    """Ids of every installation holding a slice in ``registry``."""
    return sorted(
        {str(e.get("id", "")) for s in _read(registry).values() for e in s.values() if e.get("id")}
    )


def release_stale(registry: Path) -> list[str]:
    """Give back every claim whose installation's state dir is gone; returns their ids (the
    caller removes what such an installation left on the host: a crash leaves its table and
    links, and nobody else would ever remove them)."""
    if not registry.exists():
        return []
    fd = os.open(registry.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "r+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        claims = _read(registry)
        gone = []
        for slices in claims.values():
            for index, entry in list(slices.items()):
                if not Path(str(entry.get("state_dir", ""))).exists():
                    gone.append(str(entry.get("id", "")))
                    del slices[index]
        if gone:
            _write(registry, claims)
    return sorted({g for g in gone if g})


def release(registry: Path, idents: set[str]) -> list[str]:
    """Give back every slice the installations ``idents`` hold, in every pool (they are dead
    and left nothing on the host: the caller made sure); returns those that held any."""
    if not registry.exists() or not idents:
        return []
    fd = os.open(registry.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "r+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        claims = _read(registry)
        held = [
            (s, i, str(e.get("id")))
            for s, slices in claims.items()
            for i, e in slices.items()
            if e.get("id") in idents
        ]
        for pool, index, _ in held:
            del claims[pool][index]
        if held:
            _write(registry, claims)
    return sorted({ident for _, _, ident in held})


def _read(registry: Path) -> dict[str, dict[int, dict[str, object]]]:
    try:
        data = json.loads(registry.read_text())
    except (FileNotFoundError, ValueError):
        return {}
    pools = data.get("pools", {}) if isinstance(data, dict) else {}
    out: dict[str, dict[int, dict[str, object]]] = {}
    for pool, slices in pools.items() if isinstance(pools, dict) else ():
        if not isinstance(slices, dict):
            continue
        for key, entry in slices.items():
            with contextlib.suppress(ValueError):
                if isinstance(entry, dict):
                    out.setdefault(str(pool), {})[int(key)] = entry
    return out


def _write(registry: Path, claims: dict[str, dict[int, dict[str, object]]]) -> None:
    tmp = registry.with_suffix(".tmp")
    body = {
        "version": VERSION,
        "pools": {p: {str(k): v for k, v in sorted(s.items())} for p, s in claims.items()},
    }
    tmp.write_text(json.dumps(body, indent=1))
    tmp.chmod(0o644)
    tmp.replace(registry)
