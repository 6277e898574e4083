"""Turn a builder sandbox's writable layer into a cache layer, and make the small layers.

A paused builder's ``upper/`` is already in overlay format (whiteouts are 0/0 character
devices, opaque directories carry ``trusted.overlay.opaque``), so committing it is a copy that
keeps all of that (``cp -a``: modes, owners, xattrs, device nodes, hard links) followed by
undoing what the sandbox's holder itself wrote there rather than the step:

- the mount points it makes at the top (``/proc``, ``/dev``, ``/run``, ``/tmp``,
  ``/workspace``): they are mounts in every sandbox, never part of an image;
- the lines it adds to ``/etc/passwd``, ``/etc/group`` and ``/etc/hosts`` (the builder's own
  uid and hostname);
- the builder's uid and gid on what the step created become root's (0), as in an image built
  by Docker: a sandbox of the template (another uid) reads them; the builder's uid, one of the
  installation's sandbox uids, must not own anything of an image.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tarfile
from collections.abc import Sequence
from pathlib import Path

from sandpod_lifecycle.builds.safetar import extract_member
from sandpod_lifecycle.runtime.base import RuntimeFailure

__all__ = ["CommitFailed", "commit_upper", "unpack_tar", "workdir_layer"]

MOUNT_POINTS = ("proc", "dev", "run", "tmp", "workspace")


class CommitFailed(RuntimeFailure):
    """A builder's layer could not be copied into the cache (disk full, a copy error)."""

    retryable = True


async def commit_upper(upper: Path, dest: Path, *, uid: int, gid: int, hostname: str) -> None:
    """Copy the writable layer ``upper`` to ``dest`` (a new directory) and clean it (above).

    Raises:
        CommitFailed: the copy failed (``dest`` is removed again).
    """
    await asyncio.to_thread(dest.mkdir, mode=0o755)
    proc = await asyncio.create_subprocess_exec(
        "cp",
        "-a",
        "--",
        f"{upper}/.",
        str(dest),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        shutil.rmtree(dest, ignore_errors=True)
        raise CommitFailed(f"cannot copy the builder's layer: {err.decode(errors='replace')}")
    await asyncio.to_thread(_clean, dest, uid, gid, hostname)


def _clean(dest: Path, uid: int, gid: int, hostname: str) -> None:
    for name in MOUNT_POINTS:
        path = dest / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.is_symlink() or path.exists():
            path.unlink()
    holder_lines = {
        "etc/passwd": f"sandbox:x:{uid}:{gid}:sandpod sandbox:/workspace:/bin/sh",
        "etc/group": f"sandbox:x:{gid}:",
        "etc/hosts": f"127.0.1.1 {hostname}",
    }
    for rel, line in holder_lines.items():
        path = dest / rel
        if path.is_file() and not path.is_symlink():
            kept = [x for x in path.read_text().splitlines() if x != line]
            path.write_text("".join(f"{x}\n" for x in kept))
    _chown_tree(dest, uid, gid)


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    """Give what ``uid``/``gid`` own under ``root`` to root (symlinks themselves, not targets)."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames, ""):
            path = os.path.join(dirpath, name) if name else dirpath
            st = os.lstat(path)
            if st.st_uid == uid or st.st_gid == gid:
                mode = st.st_mode
                os.lchown(path, 0 if st.st_uid == uid else st.st_uid, 0 if st.st_gid == gid else -1)
                if not os.path.islink(path):
                    os.chmod(path, mode & 0o7777)  # chown clears setuid/setgid: keep them


def _dirs(dest: Path, at: str, lowers: Sequence[Path]) -> Path:
    """Create ``at`` and its parents in the new layer ``dest``, each with the mode and owner it
    has below (the first of ``lowers``, top first, that has it; else 0755 root's): a directory
    of a layer shadows the attributes of the same one below, and must not change them."""
    dest.mkdir(mode=0o755)
    path, rel = dest, Path()
    for part in (p for p in at.split("/") if p):
        path, rel = path / part, rel / part
        path.mkdir()
        below = next((lo / rel for lo in lowers if (lo / rel).is_dir()), None)
        if below is None:
            path.chmod(0o755)
            continue
        st = below.stat()
        os.chown(path, st.st_uid, st.st_gid)
        path.chmod(st.st_mode & 0o7777)
    return path


def workdir_layer(dest: Path, workdir: str, lowers: Sequence[Path]) -> None:
    """A layer holding ``workdir`` at 0777 (the sandbox's user of later ``run`` steps and of
    the template's sandboxes can work there; owned as below, else by root). Over a lower
    directory of the same path it changes only the attributes (overlay merges the contents)."""
    _dirs(dest, workdir, lowers).chmod(0o777)


def unpack_tar(tar: Path, dest: Path, at: str, lowers: Sequence[Path]) -> None:
    """Unpack the client's tar ``tar`` into a new layer ``dest`` at directory ``at``.

    Python's ``data`` filter (``safetar``: also where Python predates it) refuses what must
    never reach a layer: absolute names, ``..``,
    links pointing outside, device nodes, setuid bits; entries are root's (the client's
    owners mean nothing here).

    Raises:
        tarfile.TarError: a refused or corrupt entry (the caller types it).
    """
    target = _dirs(dest, at, lowers)
    with tarfile.open(tar) as archive:
        for member in archive:
            member.uid = member.gid = 0
            member.uname = member.gname = "root"
            extract_member(archive, member, target)
