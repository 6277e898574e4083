"""Snapshots of local sandboxes: capture a running jail's state as layers, restore them.

:meth:`LocalSnapshots.capture` freezes the jail (``LocalRuntime.while_frozen``), writes what
changed in its writable layer and its workspace since the instance's last capture (or since it
was created: a restored sandbox's writable layers only ever hold what changed since its
snapshot) into staging directories (``snapdiff.py``), thaws it, then seals each as a layer
(``snaplayers.py``: packed, hashed, stored). The snapshot is the chain: the layers the instance
was restored from, those of its earlier captures, and the new ones -- so taking another snapshot
after changing one file stores one small layer.

The chain and the manifests of the last capture are the instance's *capture record*
(``<root>/instances/<sandbox id>``), valid only for the instance it was made for (its holder's
pid and start time); :meth:`commit` writes it once the snapshot is safely stored, so a capture
that failed half-way is simply taken again in full. :meth:`restore_layers` turns a chain back
into :class:`SnapshotLayer` paths for a new instance, fetching any layer this node lacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
from pathlib import Path

import msgpack

from sandpod_lifecycle.runtime.base import SnapshotLayer
from sandpod_lifecycle.runtime.local import LocalRuntime
from sandpod_lifecycle.runtime.snapdiff import Manifest, capture_tree
from sandpod_lifecycle.runtime.snaplayers import LayerInfo, LayerStore
from sandpod_service.jailfile import JailFile

__all__ = ["Capture", "LocalSnapshots"]

RECORD_VERSION = 1


@dataclasses.dataclass(frozen=True, slots=True)
class Capture:
    """A capture's result: the whole chain (bottom first) and what :meth:`commit` records."""

    sandbox_id: str
    chain: tuple[LayerInfo, ...]
    new: tuple[LayerInfo, ...]  # the layers this capture added (0 to 2)
    instance: tuple[int, int]  # (holder pid, holder start): whose record this is
    manifests: tuple[Manifest, Manifest]  # (writable layer, workspace) as captured
    previous: str | None = None  # the committed capture this one adds to (None: the first)


@dataclasses.dataclass(frozen=True, slots=True)
class _Record:
    name: str
    chain: tuple[LayerInfo, ...]
    manifests: tuple[Manifest, Manifest]


class LocalSnapshots:
    def __init__(self, runtime: LocalRuntime, layers: LayerStore) -> None:
        self.runtime = runtime
        self.layers = layers
        self._records = layers.root / "instances"
        self._records.mkdir(mode=0o700, exist_ok=True)

    async def capture(self, sandbox_id: str, restored: tuple[LayerInfo, ...] = ()) -> Capture:
        """Capture the running instance ``sandbox_id``; ``restored``: the chain it was created
        from (its snapshot's layers), used when it has no capture record yet.

        Raises:
            InstanceNotFound: not running. CaptureFailed, SnapshotStoreFailed: see modules.
        """
        staged = [self.layers.staging(), self.layers.staging()]
        try:

            async def work(jail: JailFile) -> tuple[JailFile, Manifest, Manifest, _Record | None]:
                record = self._load(sandbox_id, jail)
                since = (None, None) if record is None else record.manifests
                upper = await capture_tree(jail.upper, staged[0] / "fs", since[0])
                ws = await capture_tree(jail.workspace.outside, staged[1] / "fs", since[1])
                return jail, upper, ws, record

            jail, upper, ws, record = await self.runtime.while_frozen(sandbox_id, work)
            chain = list(restored if record is None else record.chain)
            new: list[LayerInfo] = []
            for part, stage in zip(("rootfs", "workspace"), staged, strict=True):
                if not any((stage / "fs").iterdir()):
                    await asyncio.to_thread(_rmtree, stage)
                    continue
                new.append(await self.layers.seal(stage, part=part, owner=jail.uid))
            instance = (jail.holder_pid or 0, jail.holder_start or 0)
            previous = None if record is None else record.name
            return Capture(sandbox_id, (*chain, *new), tuple(new), instance, (upper, ws), previous)
        except BaseException:
            for stage in staged:
                await asyncio.to_thread(_rmtree, stage)
            raise

    def commit(self, capture: Capture, name: str) -> None:
        """Record ``capture`` (stored as snapshot ``name``) as the instance's last one: the
        next capture diffs from it."""
        raw = {
            "version": RECORD_VERSION,
            "name": name,
            "instance": list(capture.instance),
            "chain": [dataclasses.asdict(layer) for layer in capture.chain],
            "manifests": [m.encode() for m in capture.manifests],
        }
        path = self._records / capture.sandbox_id
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(msgpack.packb(raw))
        tmp.rename(path)

    def forget(self, sandbox_id: str) -> None:
        """Drop the capture record of an instance that is gone."""
        with contextlib.suppress(FileNotFoundError):
            (self._records / sandbox_id).unlink()

    async def restore_layers(self, chain: tuple[LayerInfo, ...]) -> tuple[SnapshotLayer, ...]:
        """The chain as layers on this node (fetching, verifying and unpacking what is missing).

        Raises:
            LayerCorrupt: a stored layer was changed. SnapshotStoreFailed: cannot fetch.
        """
        out = []
        for layer in chain:
            if layer.part == "podroot":  # a Pod's root fs changes: not this runtime's layer
                continue
            info = await self.layers.fetch(layer.digest, part=layer.part, owner=layer.owner)
            path = self.layers.path(layer.digest)
            if info.part == "workspace":
                out.append(SnapshotLayer(path, "workspace", layer.owner))
            else:
                out.append(SnapshotLayer(path, "rootfs", layer.owner))
        return tuple(out)

    def _load(self, sandbox_id: str, jail: JailFile) -> _Record | None:
        try:
            raw = msgpack.unpackb((self._records / sandbox_id).read_bytes())
            if raw.get("version") != RECORD_VERSION:
                return None
            if tuple(raw["instance"]) != (jail.holder_pid or 0, jail.holder_start or 0):
                return None  # another instance of the same name: its state is not ours
            chain = tuple(LayerInfo(**layer) for layer in raw["chain"])
            rootfs, ws = (Manifest.decode(m) for m in raw["manifests"])
            name = str(raw["name"])
        except (OSError, ValueError, TypeError, KeyError, msgpack.UnpackException):
            return None
        if not all(self.layers.has(layer.digest) for layer in chain):
            return None  # a layer it stacks on is gone: capture everything again
        return _Record(name, chain, (rootfs, ws))


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
