"""Which installation this is, so two of them on one host never touch each other's sandboxes.

Everything the local runtime puts where another installation could see it (the cgroup parent
under every hierarchy, the range of sandbox uids) is named after an :class:`Installation`:
``id`` is a short hash of the subject prefix and the *resolved* state dir, so two ``sandpod up``
with their own state dirs get different cgroup parents (neither lists the other's sandboxes as
orphans) even with the same prefix and the same sandbox names. Files and pid records already
live in the state dir; the jails' mounts and network live in their own namespaces.

Uid ranges are claimed host-wide in a small registry (``/var/lib/sandpod/uid-ranges.json`` by
default, under an ``flock``): the installation's preferred slot comes from its id and, when
another installation holds it, the next free slot is taken. A claim whose state dir is gone is
given back only when no process on the host runs with a uid of its range. Without a writable
registry (rootless: uids inside map to the user's own uid anyway) the preferred slot is used.

Registry, version 1::

    {"version": 1, "slots": {"<slot>": {"id": str, "state_dir": str}}}
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
from pathlib import Path

import structlog

from sandpod_lifecycle.runtime.base import HostCapabilities
from sandpod_lifecycle.runtime.uids import busy_uids

__all__ = [
    "DEFAULT_REGISTRY",
    "SLOTS",
    "SLOT_SIZE",
    "UID_FLOOR",
    "Installation",
    "identity",
    "remove_cgroup_parents",
]

log = structlog.get_logger("sandpod.lifecycle.installation")

DEFAULT_REGISTRY = Path("/var/lib/sandpod/uid-ranges.json")
UID_FLOOR = 2**30  # above any distribution's users and the usual /etc/subuid ranges
SLOT_SIZE = 2**16  # uids per installation
SLOTS = 2**14  # UID_FLOOR + SLOTS * SLOT_SIZE = 2**31: below every signed 32-bit limit
VERSION = 1


def identity(prefix: str, state_dir: Path) -> str:
    """The installation id: 10 hex digits of sha256(prefix, resolved state dir)."""
    material = f"{prefix}\0{state_dir.expanduser().resolve()}".encode()
    return hashlib.sha256(material).hexdigest()[:10]


@dataclasses.dataclass(frozen=True, slots=True)
class Installation:
    """The host-global names of one installation (see the module docstring)."""

    id: str
    prefix: str
    state_dir: Path
    uid_base: int
    uid_count: int = SLOT_SIZE

    @property
    def cgroup_parent(self) -> str:
        """``sandpod-<prefix>-<id>``: a plain cgroup name no other installation uses."""
        return f"sandpod-{self.prefix.replace('.', '-')}-{self.id}"

    @classmethod
    def claim(
        cls, prefix: str, state_dir: Path, registry: Path | None = DEFAULT_REGISTRY
    ) -> Installation:
        """This installation, with a uid range no other installation on the host holds.

        Args:
            prefix: the subject prefix.
            state_dir: the installation's state dir (resolved here).
            registry: the host-wide registry of uid ranges; None: use the preferred slot.

        Raises:
            OSError: the registry exists but cannot be read or written (fix its permissions).
            ValueError: every slot is claimed by a live installation.
        """
        state_dir = state_dir.expanduser().resolve()
        ident = identity(prefix, state_dir)
        preferred = int(ident, 16) % SLOTS
        slot = preferred
        if registry is not None:
            try:
                registry.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
                slot = _claim_slot(registry, ident, state_dir, preferred)
            except PermissionError:
                log.warning("uid_registry_unwritable", registry=str(registry), slot=slot)
        return cls(ident, prefix, state_dir, UID_FLOOR + slot * SLOT_SIZE)


def remove_cgroup_parents(caps: HostCapabilities, parent: str) -> list[str]:
    """Remove the installation's (empty) cgroup parent from every hierarchy, so stopped
    installations leave no cgroup behind; returns those still in use (a sandbox left)."""
    kept = []
    for mount in {*caps.cgroup_v1.values(), *([caps.cgroup_v2] if caps.cgroup_v2 else [])}:
        path = mount / parent
        try:
            path.rmdir()
        except FileNotFoundError:
            continue
        except OSError:
            kept.append(str(path))
    return sorted(kept)


def _claim_slot(registry: Path, ident: str, state_dir: Path, preferred: int) -> int:
    fd = os.open(registry.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "r+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        slots = _read(registry)
        for held, claimed in slots.items():
            if claimed.get("id") == ident:
                return held
        busy: set[int] | None = None
        for step in range(SLOTS):
            slot = (preferred + step) % SLOTS
            entry = slots.get(slot)
            if entry is not None:
                if Path(str(entry.get("state_dir", ""))).exists():
                    continue
                busy = busy_uids() if busy is None else busy
                base = UID_FLOOR + slot * SLOT_SIZE
                if any(base <= uid < base + SLOT_SIZE for uid in busy):
                    continue  # its state dir is gone but some of its processes are not
                log.info("uid_slot_reclaimed", slot=slot, previous=entry.get("id"))
            slots[slot] = {"id": ident, "state_dir": str(state_dir)}
            _write(registry, slots)
            return slot
    raise ValueError(
        f"every sandbox uid range in {registry} is claimed by an installation whose state dir "
        "exists; remove the entries of installations you no longer use"
    )


def _read(registry: Path) -> dict[int, dict[str, object]]:
    try:
        data = json.loads(registry.read_text())
    except FileNotFoundError:
        return {}
    except ValueError:
        log.warning("uid_registry_corrupt", registry=str(registry))
        return {}
    slots = data.get("slots", {}) if isinstance(data, dict) else {}
    out: dict[int, dict[str, object]] = {}
    for key, entry in slots.items() if isinstance(slots, dict) else ():
        with contextlib.suppress(ValueError):
            if isinstance(entry, dict) and 0 <= int(key) < SLOTS:
                out[int(key)] = entry
    return out


def _write(registry: Path, slots: dict[int, dict[str, object]]) -> None:
    tmp = registry.with_suffix(".tmp")
    body = {"version": VERSION, "slots": {str(k): v for k, v in sorted(slots.items())}}
    tmp.write_text(json.dumps(body, indent=1))
    tmp.chmod(0o644)
    tmp.replace(registry)
