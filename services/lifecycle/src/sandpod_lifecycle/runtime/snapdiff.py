"""What changed in a directory since the last capture, as an overlay-format layer.

A sandbox's writable layer and workspace are captured while its cgroup is frozen (nothing in it
can write). The first capture copies the whole tree. Each later one copies only what changed
since the last *successful* capture of the same sandbox, known from that capture's
:class:`Manifest` -- every entry's inode and ctime. The ctime cannot be set from user space
(``utimes`` moves it to now), so an entry whose (inode, ctime) pair is unchanged is unchanged:
the walk costs a ``stat`` per entry, the copy only the changed bytes. The layer says:

- a new or changed entry: the entry itself (``cp -a``: data, holes, mode, owner, times,
  xattrs, hard links among the entries copied together);
- a directory whose inode changed (removed and made again): the directory, opaque
  (``trusted.overlay.opaque=y``), with all it holds -- nothing of the older one shows through;
- an entry gone since: a whiteout (a 0/0 character device), unless a parent already went;
- the parent directories of all of them, with their own metadata (a directory merges).

Stacked on the layers of the captures before it, the layer shows exactly the tree captured.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import stat
from importlib import resources
from pathlib import Path

import msgpack

from sandpod_lifecycle.runtime.base import RuntimeFailure

__all__ = ["CaptureFailed", "Manifest", "capture_tree", "scan"]

MANIFEST_VERSION = 1
HOST_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
SNAPCOPY = (
    resources.files(__package__ or "sandpod_lifecycle.runtime").joinpath("snapcopy.sh").read_text()
)
OPAQUE = "trusted.overlay.opaque"
CP_BATCH = 512  # paths per cp invocation (argv stays far below ARG_MAX)


class CaptureFailed(RuntimeFailure):
    """A tree could not be copied out of a sandbox (disk full, a copy error)."""

    code = "snapshot.capture_failed"
    retryable = True


@dataclasses.dataclass(frozen=True, slots=True)
class Manifest:
    """Every entry of a captured tree: relative path -> (inode, ctime_ns, is_dir)."""

    entries: dict[str, tuple[int, int, bool]]

    def encode(self) -> bytes:
        rows = [[p, i, c, d] for p, (i, c, d) in self.entries.items()]
        data: bytes = msgpack.packb({"version": MANIFEST_VERSION, "entries": rows})
        return data

    @classmethod
    def decode(cls, data: bytes) -> Manifest:
        raw = msgpack.unpackb(data)
        if not isinstance(raw, dict) or raw.get("version") != MANIFEST_VERSION:
            raise ValueError("unknown manifest version")
        return cls({p: (int(i), int(c), bool(d)) for p, i, c, d in raw["entries"]})


def scan(root: Path) -> Manifest:
    """The manifest of the tree below ``root`` (``root`` itself excluded)."""
    entries: dict[str, tuple[int, int, bool]] = {}
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(root / rel if rel else root) as it:
            for e in it:
                st = e.stat(follow_symlinks=False)
                path = f"{rel}/{e.name}" if rel else e.name
                is_dir = stat.S_ISDIR(st.st_mode)
                entries[path] = (st.st_ino, st.st_ctime_ns, is_dir)
                if is_dir:
                    stack.append(path)
    return Manifest(entries)


async def capture_tree(src: Path, dest: Path, since: Manifest | None) -> Manifest:
    """Write the layer of ``src``'s changes since ``since`` (None: all of it) into ``dest``
    (a new directory); return ``src``'s manifest now.

    Raises:
        CaptureFailed: a copy failed.
    """
    now = await asyncio.to_thread(scan, src)
    await asyncio.to_thread(dest.mkdir, 0o755)
    if since is None:
        await _copy(src, dest, [])
        return now
    changed, opaque, gone = _diff(since, now)
    parents = {a for p in (*changed, *gone) for a in _ancestors(p)}
    dirs = sorted(parents | opaque | {p for p in changed if now.entries[p][2]})
    await asyncio.to_thread(_copy_meta, src, dest)
    await asyncio.to_thread(_make_dirs, src, dest, dirs, opaque)
    files = [p for p in changed if not now.entries[p][2]]
    for i in range(0, len(files), CP_BATCH):
        await _copy(src, dest, files[i : i + CP_BATCH])
    await asyncio.to_thread(_whiteouts, dest, gone)
    await asyncio.to_thread(_dir_times, src, dest, ["", *dirs])
    return now


def _diff(old: Manifest, new: Manifest) -> tuple[list[str], set[str], list[str]]:
    """(entries to copy, directories to make opaque, entries to white out)."""
    opaque = {
        p
        for p, (ino, _, is_dir) in new.entries.items()
        if is_dir and p in old.entries and old.entries[p][0] != ino
    }
    gone_all = {p for p in old.entries if p not in new.entries}
    ancestors = _ancestors

    def hidden(path: str) -> bool:
        """Under a directory that is opaque, gone, or now something else: covered already."""
        return any(
            a in opaque or a in gone_all or not new.entries.get(a, (0, 0, True))[2]
            for a in ancestors(path)
        )

    changed = [
        p
        for p, row in new.entries.items()
        if old.entries.get(p) != row or any(a in opaque for a in ancestors(p))
    ]
    gone = [p for p in sorted(gone_all) if not hidden(p)]
    return changed, opaque, gone


def _ancestors(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


async def _copy(src: Path, dest: Path, paths: list[str]) -> None:
    """``cp -a`` of ``src`` (or of ``paths`` below it) into ``dest``, chrooted where nothing of
    the host but its programs is (``snapcopy.sh``): the sandbox may swap a directory for a
    symlink while it is copied."""
    unshare = shutil.which("unshare", path=HOST_PATH)
    if unshare is None:
        raise CaptureFailed("util-linux's unshare is not installed: it isolates the copy")
    scratch = dest.parent / f"{dest.name}.mnt"
    await asyncio.to_thread(scratch.mkdir, 0o700)
    try:
        proc = await asyncio.create_subprocess_exec(
            unshare,
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            SNAPCOPY,
            "sandpod-snapcopy",
            str(scratch),
            str(src),
            str(dest),
            *paths,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env={"PATH": HOST_PATH},
        )
        _, err = await proc.communicate()
    finally:
        await asyncio.to_thread(_rmdir, scratch)
    if proc.returncode != 0:
        raise CaptureFailed(f"cannot copy a sandbox's files: {err.decode(errors='replace')[-400:]}")


def _rmdir(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.rmdir()


def _copy_meta(src: Path, dest: Path) -> None:
    """``dest`` gets ``src``'s mode, owner, times and xattrs (not its contents)."""
    st = src.lstat()
    for name in os.listxattr(src, follow_symlinks=False):
        os.setxattr(dest, name, os.getxattr(src, name, follow_symlinks=False))
    os.chown(dest, st.st_uid, st.st_gid, follow_symlinks=False)
    os.chmod(dest, stat.S_IMODE(st.st_mode))
    os.utime(dest, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)


def _make_dirs(src: Path, dest: Path, dirs: list[str], opaque: set[str]) -> None:
    for rel in dirs:  # sorted: a parent before its children
        target = dest / rel
        target.mkdir(exist_ok=True)
        _copy_meta(src / rel, target)
        if rel in opaque:
            os.setxattr(target, OPAQUE, b"y")


def _dir_times(src: Path, dest: Path, dirs: list[str]) -> None:
    """Directory times as in ``src``, children first (filling a directory changed its own)."""
    for rel in sorted(dirs, key=lambda r: r.count("/") + bool(r), reverse=True):
        st = (src / rel).lstat() if rel else src.lstat()
        os.utime(dest / rel if rel else dest, ns=(st.st_atime_ns, st.st_mtime_ns))


def _whiteouts(dest: Path, gone: list[str]) -> None:
    for rel in gone:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(target, stat.S_IFCHR | 0o600, os.makedev(0, 0))
