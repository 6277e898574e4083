"""Pod snapshots as layers: a sandbox's tar checked, diffed and written in overlay format; a
chain of layers merged back into one tar.

A Pod sandbox's files reach the lifecycle as the tar execd wrote of its ``/workspace``
(``sys.snapshot``). The sandbox controls what that tar holds, so nothing in it is unpacked by
``tar``: :func:`read_archive` reads it member by member and refuses (``CaptureRefused``) any
member that could land outside the layer -- an absolute name, a ``..`` component, a name below
a member that is not a directory (the symlink-then-file trick), a hard link to anything but an
earlier regular file of the archive, a device (whiteouts are 0/0 character devices: a sandbox
must not forge one), a name seen twice. What passes becomes a :class:`PodManifest` (every
entry's type, mode, owner, mtime, size, link target and the SHA-256 of its data).

:func:`write_layer` writes the layer tar of what changed since the previous capture's manifest,
in the format :mod:`snaplayers` stores (the local runtime's layers are the same: names ``./``,
numeric owners, a whiteout is a 0/0 character device): new and changed entries, their parent
directories, a whiteout for each entry gone. Only headers are written (owners, modes and
whiteouts are tar fields), so the lifecycle needs no privilege, and every header is rebuilt
from the checked fields: of the sandbox's pax records only ``user.*`` extended attributes
(``SCHILY.xattr.user.``, at most 64 KiB each: part of an entry's digest) and a directory's
listing pass through -- never an overlay or security attribute.

The root filesystem's tar (execd's ``sys.snapshot`` with ``rootfs``) holds only what changed
since the container started, and a changed directory's complete listing as a ``SANDPOD.children``
record (names, "/"-joined): an entry not listed was deleted, though it may be one of the
image's, which no capture holds. So that part's layers have no whiteouts (:func:`changes` with
``whiteouts=False``: an entry missing from a capture is unchanged since the image, or its
directory's listing says it is gone); a listing is checked (plain names only), kept in the
layer's header, and applied by :func:`merge_layers` (what it does not name below that
directory is dropped) and, in the new Pod, by the restore (:func:`listings`).

:func:`merge_layers` is the restore: the chain's layer tars, bottom first, resolved as overlayfs
would (a whiteout hides what is below; a non-directory replaces a directory's whole subtree; an
opaque directory hides what is below it), each member checked again, written as one tar for the
sandbox's own ``tar -x`` (``sandpod_client.archive.extract``) to unpack in a fresh Pod.
:func:`below_root` says where that tar's members below its root begin: the Pod's
``/workspace`` is an emptyDir the kubelet made (owned by root), so the sandbox's user may not set
its mode or times and ``tar -x -p`` of the root member fails ("Cannot utime"); the restore
streams the tar from there on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import tarfile
from pathlib import Path
from typing import IO

import msgpack

from sandpod_lifecycle.runtime.snapdiff import CaptureFailed

__all__ = [
    "CaptureRefused",
    "PodManifest",
    "below_root",
    "changes",
    "listings",
    "merge_layers",
    "read_archive",
    "write_layer",
]

MANIFEST_VERSION = 1
OPAQUE = "trusted.overlay.opaque"
CHILDREN = "SANDPOD.children"  # a changed directory's complete listing (sandpod_execd.snaptar)
USER_XATTR = "SCHILY.xattr.user."  # the extended attributes a capture keeps
MAX_XATTR = 65536
CHUNK = 1 << 20
# (type, mode, uid, gid, mtime_ns, size, link target, sha256 hex of the data or "")
Row = tuple[str, int, int, int, int, int, str, str]


class CaptureRefused(CaptureFailed):
    """The sandbox's archive holds a member that could write outside its layer: refused."""

    code = "snapshot.capture_refused"
    retryable = False


@dataclasses.dataclass(frozen=True, slots=True)
class PodManifest:
    """Every entry of a captured tree ("" is the root): relative path -> :data:`Row`."""

    entries: dict[str, Row]

    def encode(self) -> bytes:
        rows = [[p, *r] for p, r in self.entries.items()]
        data: bytes = msgpack.packb({"version": MANIFEST_VERSION, "entries": rows})
        return data

    @classmethod
    def decode(cls, data: bytes) -> PodManifest:
        raw = msgpack.unpackb(data)
        if not isinstance(raw, dict) or raw.get("version") != MANIFEST_VERSION:
            raise ValueError("unknown manifest version")
        entries: dict[str, Row] = {}
        for p, t, mode, uid, gid, mtime, size, link, digest in raw["entries"]:
            row = (str(t), int(mode), int(uid), int(gid), int(mtime), int(size), str(link))
            entries[str(p)] = (*row, str(digest))
        return cls(entries)


def _name(raw: str) -> str:
    """A member's name as a relative path ("" for the root), or CaptureRefused."""
    if raw.startswith("/") or "\x00" in raw:
        raise CaptureRefused(f"the archive names an absolute path: {raw[:200]!r}")
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise CaptureRefused(f"the archive names a path with '..': {raw[:200]!r}")
    return "/".join(parts)


def _kind(m: tarfile.TarInfo) -> str:
    if m.isdir():
        return "dir"
    if m.issym():
        return "symlink"
    if m.islnk():
        return "hardlink"
    if m.isfifo():
        return "fifo"
    if m.isreg():
        return "file"
    raise CaptureRefused(f"the archive holds a device or unknown member: {m.name[:200]!r}")


def _listing(m: tarfile.TarInfo) -> list[str] | None:
    """A directory member's checked ``SANDPOD.children`` record, or None; CaptureRefused when
    it is on another kind of member or names anything but plain entries."""
    raw = m.pax_headers.get(CHILDREN)
    if raw is None:
        return None
    if not m.isdir():
        raise CaptureRefused(f"a listing on a member that is no directory: {m.name[:200]!r}")
    names = raw.split("/") if raw else []
    if any(n in ("", ".", "..") or "\x00" in n for n in names):
        raise CaptureRefused(f"a listing names no plain entry: {m.name[:200]!r}")
    return names


def read_archive(path: Path) -> PodManifest:
    """Check every member of the tar ``path`` and return the tree's manifest.

    Raises:
        CaptureRefused: a member could write outside the layer (see the module docstring).
        CaptureFailed: the file is not a readable tar.
    """
    entries: dict[str, Row] = {}
    try:
        with tarfile.open(path, "r:") as tar:
            for m in tar:
                name, kind = _name(m.name), _kind(m)
                if name in entries:
                    raise CaptureRefused(f"the archive names {name[:200]!r} twice")
                parent = name.rpartition("/")[0]
                if name and parent not in entries and parent:
                    raise CaptureRefused(f"{name[:200]!r} comes before its directory")
                if name and entries.get(parent, ("dir",))[0] != "dir":
                    raise CaptureRefused(f"{name[:200]!r} is below a member that is no directory")
                if not name and kind != "dir":
                    raise CaptureRefused("the archive's root is not a directory")
                link, digest = _content(tar, m, name, kind, entries)
                if xattrs := _user_xattrs(m):  # part of what the entry is: a change is a diff
                    listed = "\0".join(f"{k}={v}" for k, v in sorted(xattrs.items()))
                    digest += (
                        ";xattrs:"
                        + hashlib.sha256(listed.encode("utf-8", "surrogateescape")).hexdigest()
                    )
                mtime = int(m.mtime * 1_000_000_000)
                entries[name] = (kind, m.mode & 0o7777, m.uid, m.gid, mtime, m.size, link, digest)
    except tarfile.TarError as exc:
        raise CaptureFailed(f"the sandbox's archive is not a readable tar: {exc}") from exc
    if "" not in entries:
        raise CaptureRefused("the archive has no root directory")
    return PodManifest(entries)


def _content(
    tar: tarfile.TarFile, m: tarfile.TarInfo, name: str, kind: str, entries: dict[str, Row]
) -> tuple[str, str]:
    """(link target, digest) of the checked member ``m``: a file's data, a hard link's file's,
    a directory's listing (none: "")."""
    names = _listing(m)  # refused on anything but a directory
    if kind == "symlink":
        return m.linkname, ""
    if kind == "hardlink":
        link = _name(m.linkname)
        if entries.get(link, ("",))[0] != "file":
            raise CaptureRefused(f"{name[:200]!r} links to no earlier regular file")
        return link, entries[link][7]
    if kind == "file":
        return "", _sha256(tar.extractfile(m))
    if names is not None:  # a listing is part of what a directory is
        listed = "/".join(names).encode("utf-8", "surrogateescape")
        return "", "children:" + hashlib.sha256(listed).hexdigest()
    return "", ""


def _user_xattrs(m: tarfile.TarInfo) -> dict[str, str]:
    """``m``'s ``user.*`` extended attributes (pax records); the other namespaces are dropped
    (a sandbox must not smuggle ``trusted.overlay.*`` or ``security.*`` through its archive).
    Raises CaptureRefused on a value larger than Linux allows (64 KiB)."""
    out = {k: v for k, v in m.pax_headers.items() if k.startswith(USER_XATTR)}
    if any(len(v.encode("utf-8", "surrogateescape")) > MAX_XATTR for v in out.values()):
        raise CaptureRefused(f"an extended attribute larger than 64 KiB: {m.name[:200]!r}")
    return out


def _sha256(f: IO[bytes] | None) -> str:
    sha = hashlib.sha256()
    if f is not None:
        while chunk := f.read(CHUNK):
            sha.update(chunk)
    return sha.hexdigest()


def changes(
    old: PodManifest | None, new: PodManifest, *, whiteouts: bool = True
) -> tuple[list[str], list[str]]:
    """(entries to write, entries to white out) to turn ``old`` into ``new`` (None: all).
    ``whiteouts=False`` (the root filesystem's part): an entry of ``old`` missing from ``new``
    is no deletion (a directory's listing says which are), so none is written; and a
    directory whose only change is its mtime is unchanged (writing into it, as a restore does,
    moves it; its listing's digest is what says its entries changed)."""
    if old is None:
        return sorted(new.entries), []
    same = _same if whiteouts else _same_but_dir_mtime
    if not whiteouts:
        old = PodManifest({p: row for p, row in old.entries.items() if p in new.entries})
    write = {p for p, row in new.entries.items() if not same(old.entries.get(p), row)}
    for p in list(write):  # a directory replaced by another kind: nothing below shows through
        if old.entries.get(p, ("dir",))[0] != "dir" or new.entries[p][0] != "dir":
            write |= {q for q in new.entries if q.startswith(p + "/")}
    gone = [p for p in old.entries if p not in new.entries]
    hidden = {p for p in gone if _covered(p, old, new)}
    parents = {a for p in (*write, *gone) for a in _ancestors(p)}
    return sorted(write | parents | {""}), sorted(set(gone) - hidden)


def _same(old: Row | None, new: Row) -> bool:
    return old == new


def _same_but_dir_mtime(old: Row | None, new: Row) -> bool:
    if old is None or old[0] != "dir" or new[0] != "dir":
        return old == new
    return old[:4] + old[5:] == new[:4] + new[5:]  # (type, mode, uid, gid, _, size, ...)


def _covered(path: str, old: PodManifest, new: PodManifest) -> bool:
    """Under an ancestor that is gone or no directory now: hidden without a whiteout."""
    return any(
        a not in new.entries or new.entries[a][0] != "dir" or old.entries[a][0] != "dir"
        for a in _ancestors(path)
    )


def _ancestors(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))] if path else []


def write_layer(
    archive: Path, new: PodManifest, changed: tuple[list[str], list[str]], out: Path
) -> int:
    """Write the layer tar ``out``: the entries ``changed[0]`` (from ``archive``, checked by
    :func:`read_archive`) and a whiteout per ``changed[1]``; the number of entries. Owners,
    modes and whiteouts are tar headers: no privilege is needed to write them."""
    write, gone = changed
    wanted = set(write)
    done: set[str] = set()
    with tarfile.open(archive, "r:") as tar, tarfile.open(out, "w", format=PAX) as layer:
        for m in tar:
            name = _name(m.name)
            if name not in wanted:
                continue
            info = _header(m, name)
            if m.islnk() and _name(m.linkname) in done:
                info.linkname = _arc(_name(m.linkname))
                layer.addfile(info)
            elif m.islnk() or m.isreg():  # a hard link to a file of an older layer: its data
                src = m if m.isreg() else tar.getmember(m.linkname)
                info.type, info.size, info.linkname = tarfile.REGTYPE, src.size, ""
                layer.addfile(info, tar.extractfile(src))
            else:
                layer.addfile(info)
            done.add(name)
        for name in gone:
            whiteout = tarfile.TarInfo(_arc(name))
            whiteout.type, whiteout.mode, whiteout.devmajor, whiteout.devminor = CHR, 0o600, 0, 0
            layer.addfile(whiteout)
    return len(done) + len(gone)


PAX = tarfile.PAX_FORMAT
CHR = tarfile.CHRTYPE


def _arc(name: str) -> str:
    return f"./{name}" if name else "."


def _header(m: tarfile.TarInfo, name: str) -> tarfile.TarInfo:
    """A clean copy of ``m``'s header: its name normalised, numeric owners, no extra records
    but its ``user.*`` extended attributes and listing (a sandbox cannot smuggle an overlay
    attribute through its archive)."""
    info = tarfile.TarInfo(_arc(name))
    info.type, info.mode, info.uid, info.gid = m.type, m.mode & 0o7777, m.uid, m.gid
    info.mtime, info.size, info.linkname = m.mtime, m.size if m.isreg() else 0, m.linkname
    info.pax_headers = _user_xattrs(m)
    if (names := _listing(m)) is not None:
        info.pax_headers[CHILDREN] = "/".join(names)
    return info


def merge_layers(layers: list[Path], out: Path) -> int:
    """Resolve the layer tars ``layers`` (bottom first) as overlayfs would and write the tree
    as one tar at ``out`` (the root as ``.``); the number of entries.

    Raises:
        CaptureRefused: a layer holds a hostile member (they are checked as captures are).
    """
    tree: dict[str, tuple[int, tarfile.TarInfo]] = {}
    tars = [tarfile.open(p, "r:") for p in layers]  # noqa: SIM115 - closed below
    try:
        for i, tar in enumerate(tars):
            for m in tar:
                name = _name(m.name)
                if m.ischr() and m.devmajor == 0 and m.devminor == 0:  # a whiteout
                    _drop(tree, name, itself=True)
                    continue
                if not (m.isdir() or m.isreg() or m.issym() or m.islnk() or m.isfifo()):
                    raise CaptureRefused(f"a layer holds a device: {m.name[:200]!r}")
                opaque = m.pax_headers.get(f"SCHILY.xattr.{OPAQUE}") == "y"
                if not m.isdir() or opaque:
                    _drop(tree, name, itself=False)
                elif (names := _listing(m)) is not None:  # what it does not name is gone
                    _keep_only(tree, name, set(names))
                if not all(a in tree and tree[a][1].isdir() for a in _ancestors(name)):
                    raise CaptureRefused(f"{name[:200]!r} is below a member that is no directory")
                tree[name] = (i, m)
        with tarfile.open(out, "w", format=PAX) as merged:
            return _emit(tars, tree, merged)
    finally:
        for tar in tars:
            tar.close()


def _emit(
    tars: list[tarfile.TarFile],
    tree: dict[str, tuple[int, tarfile.TarInfo]],
    merged: tarfile.TarFile,
) -> int:
    written: set[str] = set()
    for name in sorted(tree):  # a directory sorts before what it holds
        i, m = tree[name]
        info = _header(m, name)
        target = _name(m.linkname) if m.islnk() else ""
        if m.islnk() and target in written and tree[target][0] == i:
            info.linkname = _arc(target)
            merged.addfile(info)
        elif m.islnk() or m.isreg():  # a link whose file was replaced above it: its own data
            src = m if m.isreg() else tars[i].getmember(m.linkname)
            info.type, info.size, info.linkname = tarfile.REGTYPE, src.size, ""
            merged.addfile(info, tars[i].extractfile(src))
        else:
            merged.addfile(info)
        written.add(name)
    return len(written)


def below_root(path: Path) -> int:
    """The byte offset in the tar ``path`` (from :func:`merge_layers`: the root member, if
    any, first) where the members below the root begin -- the end-of-archive blocks when there
    are none. The bytes from there are a tar of the same members without the root."""
    with tarfile.open(path, "r:") as tar:
        for m in tar:
            if _name(m.name):
                return m.offset  # its first header block (a pax record's, if it has one)
        return tar.offset


def _drop(tree: dict[str, tuple[int, tarfile.TarInfo]], rel: str, *, itself: bool) -> None:
    prefix = rel + "/" if rel else ""
    for key in [k for k in tree if k.startswith(prefix) and k != rel]:
        del tree[key]
    if itself:
        tree.pop(rel, None)


def _keep_only(tree: dict[str, tuple[int, tarfile.TarInfo]], rel: str, names: set[str]) -> None:
    """Drop what the directory ``rel`` holds in ``tree`` below the entries ``names``."""
    prefix = rel + "/" if rel else ""
    for key in [k for k in tree if k.startswith(prefix) and k != rel]:
        if key[len(prefix) :].partition("/")[0] not in names:
            del tree[key]


def listings(path: Path) -> dict[str, list[str]]:
    """The directories of the tar ``path`` (from :func:`merge_layers`) that carry a listing:
    relative path -> the names it holds (what else a restored Pod has there is removed).

    Raises:
        CaptureRefused: a listing names anything but plain entries.
    """
    out: dict[str, list[str]] = {}
    with tarfile.open(path, "r:") as tar:
        for m in tar:
            if (names := _listing(m)) is not None:
                out[_name(m.name)] = names
    return out
