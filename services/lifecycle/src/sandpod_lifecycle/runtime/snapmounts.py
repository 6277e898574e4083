"""A restored instance's snapshot layers, mounted id-mapped where its holder stacks them.

Each layer of ``InstanceSpec.snapshot`` is mounted read-only in ``<jail dir>/lowers/<n>`` seen
through an id-mapping that swaps the uid it was captured from with the new instance's
(``idmap.py``); the holder's overlay takes them as lower layers and keeps its own copy, so
:func:`unmount` detaches ours as soon as the holder is ready (and on any failure or teardown:
never remove a tree through a mount).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from sandpod_lifecycle.runtime import idmap
from sandpod_lifecycle.runtime.base import CreateFailed, InstanceSpec, SnapshotLayer

__all__ = ["mount", "unmount"]


def mount(
    d: Path, spec: InstanceSpec, base: Path, *, uid: int, rootless: bool, unshare: str
) -> tuple[list[Path], list[Path]]:
    """Mount each layer of ``spec.snapshot`` id-mapped (its owner's files as ``uid``'s) in
    ``d/lowers``: the (rootfs, workspace) mount points, bottom first.

    Raises:
        CreateFailed: this instance cannot be restored (rootless, or on the host root).
    """
    layers: tuple[SnapshotLayer, ...] = spec.snapshot
    if not layers:
        return [], []
    if rootless:
        raise CreateFailed(
            "restoring a snapshot needs id-mapped mounts, which need root: run the "
            "lifecycle as root",
            sandbox_id=spec.sandbox_id,
        )
    if os.path.realpath(base) == "/":
        raise CreateFailed(
            "a sandbox on the host root (template rootfs: /) cannot be restored from a "
            "snapshot: its layers would lie inside its own base; use a template with an "
            "image or the default base",
            sandbox_id=spec.sandbox_id,
        )
    lowers = d / "lowers"
    lowers.mkdir(mode=0o700)
    namespaces: dict[int, int] = {}
    rootfs: list[Path] = []
    workspace: list[Path] = []
    try:
        for i, layer in enumerate(layers):
            if layer.owner not in namespaces:
                namespaces[layer.owner] = idmap.userns_fd(layer.owner, uid, unshare)
            target = lowers / str(i)
            target.mkdir()
            idmap.mount_idmapped(layer.path, target, namespaces[layer.owner])
            (rootfs if layer.part == "rootfs" else workspace).append(target)
    finally:
        for fd in namespaces.values():
            os.close(fd)
    return rootfs, workspace


def unmount(d: Path) -> None:
    """Detach whatever :func:`mount` left mounted (never remove through a mount)."""
    lowers = d / "lowers"
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(lowers):
            idmap.detach(Path(entry.path))
        lowers.rmdir()
