"""Addresses of one installation's sandboxes: a private range of its own, a /31 per sandbox.

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
    "DEFAULT_REGISTRY",
    "SLICE_PREFIX",
    "AddressPlan",
    "PoolExhausted",
    "SandboxAddresses",
    "claim_slice",
    "claimed_ids",
    "release_stale",
]

DEFAULT_POOL = ipaddress.IPv4Network("10.240.0.0/12")
DEFAULT_REGISTRY = Path("/var/lib/sandpod/net-ranges.json")
SLICE_PREFIX = 20
VERSION = 1


class PoolExhausted(Exception):
    """No slice of the pool is free, or no sandbox pair is free in the slice."""

    code = "network.pool_exhausted"
    retryable = False


@dataclasses.dataclass(frozen=True, slots=True)
class SandboxAddresses:
    """One sandbox's pair: ``host`` (the veth's host end, the sandbox's default route) and
    ``sandbox`` (its own address), a /31."""

    index: int
    host: ipaddress.IPv4Address
    sandbox: ipaddress.IPv4Address


@dataclasses.dataclass(frozen=True, slots=True)
class AddressPlan:
    """The installation's slice and how it is numbered (see the module docstring)."""

    slice: ipaddress.IPv4Network
    pool: ipaddress.IPv4Network = DEFAULT_POOL

    @property
    def gateway(self) -> ipaddress.IPv4Address:
        return self.slice.network_address + 1

    @property
    def capacity(self) -> int:
        """How many sandboxes the slice numbers (pair 0 is the gateway's)."""
        return self.slice.num_addresses // 2 - 1

    def sandbox(self, index: int) -> SandboxAddresses:
        if not 1 <= index <= self.capacity:
            raise ValueError(f"sandbox index {index} is outside 1..{self.capacity}")
        host = self.slice.network_address + 2 * index
        return SandboxAddresses(index, host, host + 1)

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
    if pool.prefixlen > SLICE_PREFIX:
        raise ValueError(f"the network pool {pool} is smaller than one /{SLICE_PREFIX} slice")
    slices = list(pool.subnets(new_prefix=SLICE_PREFIX))
    busy = [n for n in in_use if n.version == 4 and n.prefixlen > 0]
    usable = {i for i, s in enumerate(slices) if not any(s.overlaps(n) for n in busy)}
    preferred = int(ident, 16) % len(slices)
    order = [(preferred + step) % len(slices) for step in range(len(slices))]
    if registry is None:
        for index in order:
            if index in usable:
                return AddressPlan(slices[index], pool)
        raise PoolExhausted(f"every /{SLICE_PREFIX} of {pool} overlaps this host's networks")
    registry.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    fd = os.open(registry.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "r+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        claims = _read(registry)
        key = str(pool)
        mine = claims.setdefault(key, {})
        for index, entry in mine.items():
            if entry.get("id") == ident and index < len(slices):
                return AddressPlan(slices[index], pool)
        for index in order:
            held = mine.get(index)
            if index not in usable:
                continue
            if held is not None and Path(str(held.get("state_dir", ""))).exists():
                continue
            mine[index] = {"id": ident, "state_dir": str(state_dir)}
            _write(registry, claims)
            return AddressPlan(slices[index], pool)
    raise PoolExhausted(
        f"every /{SLICE_PREFIX} slice of {pool} is claimed by a live installation or overlaps "
        f"this host's networks; remove stale entries from {registry} or set SANDPOD_NET_POOL"
    )


def claimed_ids(registry: Path) -> list[str]:
    """Ids of every installation holding a slice in ``registry``."""
    return sorted(
        str(e.get("id", "")) for s in _read(registry).values() for e in s.values() if e.get("id")
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
    return [g for g in gone if g]


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
