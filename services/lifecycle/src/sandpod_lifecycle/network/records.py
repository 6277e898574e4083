"""What a node remembers of each attached sandbox's network, so a restarted lifecycle knows
every link and chain that is its own (``<records dir>/<sandbox id>.json``).

Version 1::

    {"version": 1, "index": int, "policy": <spec.network wire form>, "holder": int}

``index`` numbers the sandbox's addresses, link and chain; ``holder`` is its holder's host pid
(the limits are set inside its network namespace). A record is written before the link exists
and removed after it is gone. Allocation of indexes happens under ``<records dir>/.lock``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

from sandpod_contract.errors import ResourceInvalid
from sandpod_contract.network import NetworkPolicy

__all__ = ["NetRecord", "Records"]

VERSION = 1


@dataclasses.dataclass(frozen=True, slots=True)
class NetRecord:
    index: int
    policy: NetworkPolicy
    holder: int

    def encode(self) -> bytes:
        body = {
            "version": VERSION,
            "index": self.index,
            "policy": self.policy.to_dict(),
            "holder": self.holder,
        }
        return json.dumps(body).encode()

    @classmethod
    def decode(cls, raw: bytes) -> NetRecord | None:
        """The record, or None when it is not one this version wrote."""
        try:
            data = json.loads(raw)
            if not isinstance(data, dict) or data.get("version") != VERSION:
                return None
            policy = NetworkPolicy.from_dict(data["policy"])
            return cls(int(data["index"]), policy, int(data["holder"]))
        except (ValueError, KeyError, TypeError, ResourceInvalid):
            return None


class Records:
    """The records directory (mode 0700)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    def _path(self, sandbox_id: str) -> Path:
        return self.dir / f"{sandbox_id}.json"

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive, across processes (and threads: each call opens its own description)."""
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        with (self.dir / ".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def get(self, sandbox_id: str) -> NetRecord | None:
        try:
            return NetRecord.decode(self._path(sandbox_id).read_bytes())
        except OSError:
            return None

    def all(self) -> dict[str, NetRecord]:
        out = {}
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.dir):
                if entry.name.endswith(".json"):
                    record = self.get(entry.name.removesuffix(".json"))
                    if record is not None:
                        out[entry.name.removesuffix(".json")] = record
        return out

    def indexes(self) -> dict[str, int]:
        """sandbox id -> index of every record of this version: what allocating an index needs,
        without decoding each policy (``all`` does; this is O(sandboxes) under the lock)."""
        out = {}
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.dir):
                if not entry.name.endswith(".json"):
                    continue
                try:
                    data = json.loads(Path(entry.path).read_bytes())
                    if isinstance(data, dict) and data.get("version") == VERSION:
                        out[entry.name.removesuffix(".json")] = int(data["index"])
                except (OSError, ValueError, KeyError, TypeError):
                    continue
        return out

    def put(self, sandbox_id: str, record: NetRecord) -> None:
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self._path(sandbox_id)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(record.encode())
        tmp.replace(path)

    def remove(self, sandbox_id: str) -> None:
        self._path(sandbox_id).unlink(missing_ok=True)
