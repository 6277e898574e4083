"""A Pod snapshot's root-filesystem part unpacked into a new Pod (Kubernetes mode).

The part (``podtar``: changed entries, their directories as context, a changed directory's
complete listing) goes into the new Pod's root filesystem (``Info.rootfs``: ``/`` in a Pod) in
three steps, all as the sandbox's own user inside the Pod, before the Sandbox is Ready:

    directories  each directory of the tar is looked up in the Pod (``fs.stat``; below one that
                 is missing nothing is): one that exists is left out of the stream -- it is the
                 image's, its owner, mode and times are not the sandbox's to set (GNU tar would
                 even try a chmod of it to 0700 first, which a non-root user may not do)
    unpack       the sandbox's ``tar -x`` (``sandpod_client.archive.extract``) of the rest:
                 changed files, links, and the directories the sandbox made, with their modes
    listings     every directory whose listing the chain carries loses what it does not name
                 (``fs.list`` then ``fs.remove``): an image file the sandbox deleted or renamed

What the user could not write in the source Pod it cannot write here either: the restore has
exactly the sandbox's authority, never more. (Measured on a real node: without the first step,
``tar`` failed on ``./var/tmp: Cannot change mode to rwx------``.)
"""

from __future__ import annotations

import asyncio
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

from sandpod_client import Channel
from sandpod_client.archive import extract
from sandpod_contract.errors import FsNotADirectory, FsNotFound
from sandpod_contract.messages.fs import (
    FsEntry,
    FsList,
    FsListing,
    FsPath,
    FsRemove,
    FsRemoved,
)
from sandpod_lifecycle.runtime.podtar import CHILDREN, listings

__all__ = ["file_chunks", "unpack_rootfs"]

CHUNK = 1 << 20
OP_TIMEOUT = 30.0


async def unpack_rootfs(ch: Channel, rootfs: str, merged: Path) -> int:
    """Unpack the merged root-filesystem tar ``merged`` into ``rootfs`` of the Pod behind
    ``ch`` and apply its listings; the number of entries removed.

    Raises:
        SandpodError: execd refused a call or the sandbox's ``tar`` refused the stream.
        CaptureRefused: a listing names anything but plain entries.
    """
    base = rootfs.rstrip("/")
    existing = await _existing_dirs(ch, base, await asyncio.to_thread(_dirs, merged))
    stream = merged.with_suffix(".stream.tar")
    await asyncio.to_thread(_without, merged, existing, stream)
    await extract(ch, rootfs, file_chunks(stream))
    removed = 0
    for rel, names in sorted((await asyncio.to_thread(listings, merged)).items()):
        where = f"{base}/{rel}" if rel else rootfs
        keep = set(names)
        for name in await _names(ch, where):
            if name not in keep:
                path = f"{base}/{rel}/{name}" if rel else f"{base}/{name}"
                request = FsRemove(path=path, recursive=True)
                await ch.call("fs", "remove", request, FsRemoved, OP_TIMEOUT)
                removed += 1
    return removed


def _dirs(merged: Path) -> list[str]:
    """The directories of the tar (relative names, parents first), its root left out."""
    with tarfile.open(merged, "r:") as tar:
        return sorted(n for m in tar if m.isdir() and (n := m.name.removeprefix("./")) != ".")


async def _existing_dirs(ch: Channel, base: str, dirs: list[str]) -> set[str]:
    """Those of ``dirs`` that are directories in the Pod already (none below a missing one)."""
    found: set[str] = set()
    missing: set[str] = set()
    for rel in dirs:
        parent = rel.rpartition("/")[0]
        if parent in missing:
            missing.add(rel)
            continue
        try:
            entry = await ch.call(
                "fs", "stat", FsPath(path=f"{base}/{rel}", follow=False), FsEntry, OP_TIMEOUT
            )
        except FsNotFound:
            missing.add(rel)
            continue
        if entry.type == "dir":
            found.add(rel)
    return found


def _without(merged: Path, existing: set[str], out: Path) -> None:
    """``merged`` as the stream to unpack: without its root, the directories in ``existing``,
    and the listings (tar does not know the record, and says so on every member)."""
    with (
        tarfile.open(merged, "r:") as src,
        tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as dst,
    ):
        for m in src:
            name = m.name.removeprefix("./")
            if name == "." or (m.isdir() and name in existing):
                continue
            m.pax_headers = {k: v for k, v in m.pax_headers.items() if k != CHILDREN}
            dst.addfile(m, src.extractfile(m) if m.isreg() else None)


async def _names(ch: Channel, path: str) -> list[str]:
    """The names in the directory ``path`` of the Pod (all pages); none when it is gone."""
    names: list[str] = []
    cursor = None
    while True:
        request = FsList(path=path, cursor=cursor, limit=10_000)
        try:
            page = await ch.call("fs", "list", request, FsListing, OP_TIMEOUT)
        except (FsNotFound, FsNotADirectory):  # replaced by the chain's own entry
            return names
        names.extend(entry.name for entry in page.entries)
        if not page.truncated or page.cursor is None:
            return names
        cursor = page.cursor


async def file_chunks(path: Path, start: int = 0) -> AsyncIterator[bytes]:
    """The file ``path`` from byte ``start`` on, in chunks read on a thread."""
    with path.open("rb") as f:
        f.seek(start)
        while chunk := await asyncio.to_thread(f.read, CHUNK):
            yield chunk
