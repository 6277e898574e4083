"""A Pod's root filesystem part: execd's walk of what changed since it started, and the
lifecycle's checks, diffs and merges of it (listings instead of whiteouts); user.* extended
attributes through both parts.

The end-to-end proof (a Pod's changes restored into a new Pod through its execd) is
tests/k8s/test_pod_snapshots.py::test_a_pod_snapshot_keeps_the_root_filesystems_changes_deletions_too.
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from sandpod_execd.snaptar import CHILDREN, _write_changes
from sandpod_execd.snaptar import _write as write_archive
from sandpod_lifecycle.runtime.podtar import (
    CaptureRefused,
    PodManifest,
    changes,
    listings,
    merge_layers,
    read_archive,
    write_layer,
)


def _image(root: Path) -> int:
    """A small image under ``root``; the ctime (ns) after which every change is the sandbox's."""
    for d in ("app/lib", "etc", "usr/bin"):
        (root / d).mkdir(parents=True)
    for f, text in (("app/old", "o"), ("app/readme", "r"), ("app/lib/m", "m"), ("etc/motd", "w")):
        (root / f).write_text(text)
    (root / "usr/bin/tool").write_text("t")
    return max(p.lstat().st_ctime_ns for p in [root, *root.rglob("*")]) + 1


def _members(tar_path: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(tar_path) as tar:
        return {m.name: m for m in tar}


def _capture(root: Path, since: int, out: Path, skip: frozenset[Path] = frozenset()) -> Path:
    _write_changes(root, since, skip, out)
    return out


def _change(root: Path) -> None:
    (root / "app/new").write_text("new")
    (root / "app/old").unlink()
    (root / "app/readme").write_text("changed")
    (root / "etc/added").write_text("a")


def test_only_what_changed_since_the_start_is_captured_with_its_directories_listings(
    tmp_path: Path,
) -> None:
    """Files written, made or deleted after the start are there (a deletion as the directory's
    listing); their directories come as headers; the image's untouched files and directories
    (usr/, app/lib/m, etc/motd) and a skipped path (execd's state) are not."""
    root = tmp_path / "root"
    since = _image(root)
    state = root / "state"
    _change(root)
    state.mkdir()
    (state / "execd.sock").write_text("x")
    members = _members(_capture(root, since, tmp_path / "c.tar", frozenset({state})))
    assert set(members) == {".", "./app", "./app/new", "./app/readme", "./etc", "./etc/added"}
    assert members["./app"].pax_headers[CHILDREN] == "lib/new/readme"  # old: gone
    assert members["./etc"].pax_headers[CHILDREN] == "added/motd"
    assert members["."].pax_headers[CHILDREN] == "app/etc/state/usr"  # state made after: listed
    manifest = read_archive(tmp_path / "c.tar")
    assert manifest.entries["app"][7].startswith("children:")


def test_the_chain_applies_listings_and_never_whites_out_what_a_capture_leaves_out(
    tmp_path: Path,
) -> None:
    """A second capture after more changes is diffed without whiteouts (an entry of the first
    that is not in the second is unchanged, or its directory's listing says it is gone); the
    merged chain drops what a newer listing does not name, and keeps what it does."""
    root = tmp_path / "root"
    since = _image(root)
    _change(root)
    full1 = _capture(root, since, tmp_path / "full1.tar")
    m1 = read_archive(full1)
    layer1 = tmp_path / "l1.tar"
    write_layer(full1, m1, changes(None, m1, whiteouts=False), layer1)

    (root / "app/new").unlink()  # made in the first capture, gone now
    (root / "app/more").write_text("more")
    full2 = _capture(root, since, tmp_path / "full2.tar")
    m2 = read_archive(full2)
    write, gone = changes(m1, m2, whiteouts=False)
    assert gone == [] and "app/more" in write and "etc/added" not in write
    layer2 = tmp_path / "l2.tar"
    write_layer(full2, m2, (write, gone), layer2)
    assert not any(m.ischr() for m in _members(layer2).values())

    merged = tmp_path / "merged.tar"
    merge_layers([layer1, layer2], merged)
    names = set(_members(merged))
    assert {"./app/more", "./app/readme", "./etc/added"} <= names
    assert "./app/new" not in names  # dropped by the newer listing of app/
    assert listings(merged)["app"] == ["lib", "more", "readme"]


def _with_listing(tmp: Path, member: tarfile.TarInfo, value: str) -> Path:
    path = tmp / "hostile.tar"
    root = tarfile.TarInfo(".")
    root.type = tarfile.DIRTYPE
    member.pax_headers = {CHILDREN: value}
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(root)
        tar.addfile(member)
    return path


@pytest.mark.parametrize(
    ("kind", "value"),
    [(tarfile.DIRTYPE, "a/../b"), (tarfile.DIRTYPE, "a//b"), (tarfile.REGTYPE, "a")],
)
def test_a_forged_listing_is_refused(tmp_path: Path, kind: bytes, value: str) -> None:
    """The sandbox can replace execd's file once thawed: a listing naming ``..`` or an empty
    name (which the restore would turn into a removal outside the directory), or one on a
    member that is no directory, is refused by the capture and by the merge."""
    member = tarfile.TarInfo("./d")
    member.type = kind
    path = _with_listing(tmp_path, member, value)
    with pytest.raises(CaptureRefused):
        read_archive(path)
    with pytest.raises(CaptureRefused):
        merge_layers([path], tmp_path / "out.tar")


def test_a_root_capture_of_an_unchanged_root_is_the_root_alone(tmp_path: Path) -> None:
    """Nothing changed since the start: the tar holds the root only, which the lifecycle
    stores as no layer (``changes`` gives the root alone)."""
    root = tmp_path / "root"
    since = _image(root)
    full = _capture(root, since, tmp_path / "c.tar")
    manifest = read_archive(full)
    assert list(manifest.entries) == [""]
    assert changes(PodManifest({"": manifest.entries[""]}), manifest, whiteouts=False) == (
        [""],
        [],
    )
    assert os.path.getsize(full) > 0


def test_a_directory_whose_only_change_is_its_mtime_is_no_root_change() -> None:
    """A restore writes into ``/var/tmp``, which moves its mtime: the first capture of the
    restored Pod must not store a layer for that alone. Its listing (digest), mode or owner
    changing still is a change, and the workspace part keeps comparing mtimes."""
    root = ("dir", 0o755, 0, 0, 1, 0, "", "")
    var = ("dir", 0o1777, 0, 0, 1, 0, "", "children:aa")
    old = PodManifest({"": root, "var/tmp": var})
    moved = PodManifest({"": root, "var/tmp": (*var[:4], 2, *var[5:])})
    assert changes(old, moved, whiteouts=False) == ([""], [])
    assert changes(old, moved) == (["", "var", "var/tmp"], [])
    for other in ((*var[:1], 493, *var[2:]), (*var[:7], "children:bb")):
        changed = PodManifest({"": root, "var/tmp": other})
        assert changes(old, changed, whiteouts=False) == (["", "var", "var/tmp"], [])


def _one_file(tmp: Path, name: str, records: dict[str, str]) -> Path:
    path = tmp / name
    root, member = tarfile.TarInfo("."), tarfile.TarInfo("./f")
    root.type = tarfile.DIRTYPE
    member.pax_headers = records
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(root)
        tar.addfile(member, io.BytesIO(b""))
    return path


def test_user_xattrs_are_kept_and_diffed_and_no_other_namespace_passes(tmp_path: Path) -> None:
    """A file's user.* attributes reach the layer and the merge; changing only them is a change
    (the next layer holds the file); trusted.* / security.* records in a sandbox's archive never
    reach a layer (an overlay attribute would change what the restore means); a value larger
    than Linux allows is refused."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f").write_text("x")
    os.setxattr(ws / "f", "user.note", b"\xff\x00binary")
    full1 = tmp_path / "full1.tar"
    write_archive(ws, full1)
    m1 = read_archive(full1)
    layer = tmp_path / "l1.tar"
    write_layer(full1, m1, changes(None, m1), layer)
    merged = tmp_path / "merged.tar"
    merge_layers([layer], merged)
    record = _members(merged)["./f"].pax_headers["SCHILY.xattr.user.note"]
    assert record.encode("utf-8", "surrogateescape") == b"\xff\x00binary"

    os.setxattr(ws / "f", "user.note", b"other")
    full2 = tmp_path / "full2.tar"
    write_archive(ws, full2)
    assert "f" in changes(m1, read_archive(full2))[0]

    forged = _one_file(
        tmp_path,
        "forged.tar",
        {"SCHILY.xattr.trusted.overlay.opaque": "y", "SCHILY.xattr.user.a": "1"},
    )
    out = tmp_path / "forged-layer.tar"
    manifest = read_archive(forged)
    write_layer(forged, manifest, changes(None, manifest), out)
    assert set(_members(out)["./f"].pax_headers) == {"SCHILY.xattr.user.a"}
    huge = _one_file(tmp_path, "huge.tar", {"SCHILY.xattr.user.a": "v" * 70_000})
    with pytest.raises(CaptureRefused):
        read_archive(huge)
