"""A Pod snapshot's root-filesystem part unpacked into a new Pod (Kubernetes mode).

The part (``podtar``: changed entries, their directories as context, a changed directory's
complete listing) goes into the new Pod's root filesystem (``Info.rootfs``: ``/`` in a Pod) in
two steps, both as the sandbox's own user inside the Pod, before the Sandbox is Ready:

    unpack     the sandbox's ``tar -x`` (``sandpod_client.archive.extract``) of the merged tar
               without its root member, with ``keep_dirs``: a directory the image has keeps its
               owner, mode and times (the user could not have changed the image's root-owned
               ones; a directory the user made is made with its own)
    listings   every directory whose listing the chain carries loses what it does not name
               (``fs.list`` then ``fs.remove``): an image file the sandbox deleted or renamed

What the user could not write in the source Pod it cannot write here either: the restore has
exactly the sandbox's authority, never more.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from sandpod_client import Channel
from sandpod_client.archive import extract
from sandpod_contract.errors import FsNotADirectory, FsNotFound
from sandpod_contract.messages.fs import FsList, FsListing, FsRemove, FsRemoved
from sandpod_lifecycle.runtime.podtar import below_root, listings

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
    start = await asyncio.to_thread(below_root, merged)
    await extract(ch, rootfs, file_chunks(merged, start), keep_dirs=True)
    removed = 0
    for rel, names in sorted((await asyncio.to_thread(listings, merged)).items()):
        where = f"{rootfs.rstrip('/')}/{rel}" if rel else rootfs
        keep = set(names)
        for name in await _names(ch, where):
            if name not in keep:
                path = f"{where.rstrip('/')}/{name}"
                request = FsRemove(path=path, recursive=True)
                await ch.call("fs", "remove", request, FsRemoved, OP_TIMEOUT)
                removed += 1
    return removed


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
