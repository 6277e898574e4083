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
from pathlib import Path

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
    dest.mkdir(mode=0o755)
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
                os.lchown(
                    path, 0 if st.st_uid == uid else st.st_uid, 0 if st.st_gid == gid else -1
                )
                if not os.path.islink(path):
                    os.chmod(path, mode & 0o7777)  # chown clears setuid/setgid: keep them


def workdir_layer(dest: Path, workdir: str) -> None:
    """A layer holding ``workdir`` (parents 0755, itself 0777: the sandbox's user of later
    ``run`` steps and of the template's sandboxes can work there), all root's. Over a lower
    directory of the same path it changes only the attributes (overlay merges the contents)."""
    dest.mkdir(mode=0o755)
    path = dest
    parts = [p for p in workdir.split("/") if p]
    for i, part in enumerate(parts):
        path = path / part
        path.mkdir(mode=0o755)
        if i == len(parts) - 1:
            path.chmod(0o777)


def unpack_tar(tar: Path, dest: Path, at: str) -> None:
    """Unpack the client's tar ``tar`` into a new layer ``dest`` at directory ``at``.

    Python's ``data`` filter refuses what must never reach a layer: absolute names, ``..``,
    links pointing outside, device nodes, setuid bits; entries are root's (the client's
    owners mean nothing here).

    Raises:
        tarfile.TarError: a refused or corrupt entry (the caller types it).
    """
    dest.mkdir(mode=0o755)
    target = dest
    for part in (p for p in at.split("/") if p):
        target = target / part
        target.mkdir(mode=0o755)
    with tarfile.open(tar) as archive:
        for member in archive:
            member.uid = member.gid = 0
            member.uname = member.gname = "root"
            archive.extract(member, target, filter="data")
