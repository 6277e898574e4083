"""``sys.snapshot``: a sandbox directory as one tar file, written while its commands are frozen.

The lifecycle snapshots a Pod sandbox through its execd (Kubernetes mode: the Pod's files are
reachable from nowhere else). Consistency needs the copy to happen while nothing in the sandbox
writes, but a frozen sandbox refuses new commands (``sys.freeze``), so the sandbox's own ``tar``
cannot be used: execd writes the archive itself (stdlib :mod:`tarfile`, POSIX/pax format:
names of any length, modes, numeric owners, times, symlinks, hard links, empty directories,
FIFOs; never following a symlink) into a private file, then thaws the commands (unless the
sandbox was paused before: it stays paused). The caller reads the file with ``fs.read``
(flow-controlled, any size) and removes it with ``fs.remove``.

Data flow: request -> freeze (``Freezer.freeze``; a sandbox already frozen is not frozen again)
-> walk ``path`` on a thread, writing ``<state dir>/snapshots/<random>.tar`` -> thaw -> reply
with the file's path, size and entry count. A failed copy removes the file and still thaws.

What the file holds is only what the sandbox's files are; the lifecycle never trusts it as more
(it checks every member before packing a layer: see ``sandpod_lifecycle.runtime.podtar``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import tarfile
import uuid
from pathlib import Path

from sandpod_contract.errors import FsNotADirectory, FsNotFound, SandboxError

__all__ = ["write_snapshot"]

SKIPPED = (stat.S_IFSOCK,)  # sockets cannot be archived (tar skips them too)


def _write(root: Path, dest: Path) -> int:
    """``root``'s tree (``root`` itself as ``.``) into the tar ``dest``; the number of entries."""
    entries = 0
    with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as tar:
        stack = [(root, ".")]
        while stack:
            path, name = stack.pop()
            st = path.lstat()
            if stat.S_IFMT(st.st_mode) in SKIPPED:
                continue
            info = tar.gettarinfo(str(path), arcname=name)
            info.uname = info.gname = ""  # numeric owners only
            if info.isreg():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
            entries += 1
            if stat.S_ISDIR(st.st_mode):
                with os.scandir(path) as it:
                    children = sorted(e.name for e in it)
                stack.extend((path / c, f"{name}/{c}") for c in reversed(children))
    return entries


async def write_snapshot(root: Path, state_dir: Path) -> tuple[Path, int]:
    """Archive the directory ``root`` into a new file under ``state_dir``; (file, entries).
    The caller has frozen the sandbox's commands.

    Raises:
        FsNotFound, FsNotADirectory: ``root`` is not a directory.
        SandboxError: the archive could not be written (disk full, unreadable file).
    """
    try:
        st = await asyncio.to_thread(root.lstat)
    except FileNotFoundError:
        raise FsNotFound("the directory to snapshot does not exist", path=root.name) from None
    if not stat.S_ISDIR(st.st_mode):
        raise FsNotADirectory(f"{root.name}: not a directory", path=root.name)
    where = state_dir / "snapshots"
    await asyncio.to_thread(where.mkdir, 0o700, True, True)
    dest = where / f"{uuid.uuid4().hex}.tar"
    try:
        entries = await asyncio.to_thread(_write, root, dest)
    except (OSError, tarfile.TarError) as exc:
        with contextlib.suppress(OSError):
            dest.unlink()
        raise SandboxError(f"cannot archive the sandbox's files: {exc}") from exc
    return dest, entries
