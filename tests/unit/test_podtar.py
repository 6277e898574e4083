"""Pod snapshot layers (``sandpod_lifecycle.runtime.podtar``) on real files and real tar archives:
execd's archive of a tree, diffed into layers, merged back, unpacked by GNU tar, is the tree
again; archives and layers that could write outside their target are refused."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

from sandpod_execd.snaptar import _write as write_archive
from sandpod_lifecycle.runtime.podtar import (
    CaptureRefused,
    PodManifest,
    below_root,
    changes,
    merge_layers,
    read_archive,
    write_layer,
)


def _tree(root: Path) -> dict[str, tuple[str, int, str]]:
    """path -> (type, permission bits, content or link target), every entry below ``root``."""
    out: dict[str, tuple[str, int, str]] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            st = p.lstat()
            rel = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", 0, os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode), "")
            elif stat.S_ISFIFO(st.st_mode):
                out[rel] = ("fifo", stat.S_IMODE(st.st_mode), "")
            else:
                out[rel] = ("file", stat.S_IMODE(st.st_mode), p.read_text())
    return out


def _capture(ws: Path, tmp: Path, n: int, base: PodManifest | None) -> tuple[Path, PodManifest]:
    full = tmp / f"full{n}.tar"
    write_archive(ws, full)
    manifest = read_archive(full)
    layer = tmp / f"layer{n}.tar"
    write_layer(full, manifest, changes(base, manifest), layer)
    return layer, manifest


def _restore(layers: list[Path], tmp: Path) -> Path:
    merged, out = tmp / "merged.tar", tmp / "restored"
    merge_layers(layers, merged)
    out.mkdir()
    subprocess.run(["tar", "-x", "-p", "-f", str(merged)], cwd=out, check=True)
    return out


def test_two_captures_merge_back_to_the_tree_exactly(tmp_path: Path) -> None:
    """Modes, symlinks (relative and absolute, kept as links), an empty directory, a FIFO and a
    hard link survive; a file and a directory deleted after the first capture are whiteouts in
    the second layer and absent after the merge; the second layer holds only the change."""
    ws = tmp_path / "ws"
    (ws / "sub" / "empty").mkdir(parents=True)
    (ws / "a").write_text("alpha")
    (ws / "a").chmod(0o751)
    (ws / "big").write_text("b" * 100_000)
    (ws / "sub" / "gone").write_text("soon deleted")
    (ws / "gonedir").mkdir()
    (ws / "gonedir" / "f").write_text("x")
    os.symlink("a", ws / "rel")
    os.symlink("/etc/passwd", ws / "abs")
    os.link(ws / "a", ws / "hard")
    os.mkfifo(ws / "fifo", 0o640)
    first, m1 = _capture(ws, tmp_path, 1, None)

    (ws / "sub" / "gone").unlink()
    (ws / "gonedir" / "f").unlink()
    (ws / "gonedir").rmdir()
    (ws / "new").write_text("added")
    second, _ = _capture(ws, tmp_path, 2, m1)

    with tarfile.open(second) as tar:
        names = {m.name: m for m in tar}
    assert "./big" not in names  # unchanged: not stored again
    assert names["./sub/gone"].ischr() and names["./gonedir"].ischr()  # whiteouts
    assert _tree(_restore([first, second], tmp_path)) == _tree(ws)


def test_a_restore_unpacks_as_the_sandbox_user_into_a_workspace_it_does_not_own(
    tmp_path: Path,
) -> None:
    """A Pod's /workspace is the kubelet's emptyDir (root's, mode 0777) and the sandbox's tar
    runs as its user: the merged tar's root member makes ``tar -x -p`` fail ("Cannot utime",
    what a real node showed on every wake from hibernation); the bytes from
    :func:`below_root` on unpack to the same tree, a pax-headed long name first included."""
    ws = tmp_path / "ws"
    long = "l" * 150  # past ustar's 100 characters: a pax record before its header
    (ws / long).mkdir(parents=True)
    (ws / long / "f").write_text("deep")
    (ws / "a").write_text("alpha")
    (ws / "a").chmod(0o604)
    os.utime(ws, (1e9, 1e9))
    layer, _ = _capture(ws, tmp_path, 1, None)
    merged = tmp_path / "merged.tar"
    merge_layers([layer], merged)
    data = merged.read_bytes()
    target = tmp_path / "workspace"
    target.mkdir(mode=0o777)
    target.chmod(0o777)

    def untar(stream: bytes) -> subprocess.CompletedProcess[bytes]:
        argv = ["tar", "-x", "-p", "-f", "-"]
        return subprocess.run(argv, cwd=target, input=stream, capture_output=True, user=65534)

    failed = untar(data)
    assert failed.returncode == 2 and b"Operation not permitted" in failed.stderr, failed
    start = below_root(merged)
    assert 0 < start < len(data)
    done = untar(data[start:])
    assert done.returncode == 0, done.stderr
    assert _tree(target) == _tree(ws)
    only_root = tmp_path / "root.tar"
    with tarfile.open(only_root, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(tarfile.TarInfo("."))
    rest = only_root.read_bytes()[below_root(only_root) :]
    assert rest and not rest.strip(b"\0")  # the end-of-archive blocks: an empty tar


Member = tuple[str, bytes | str | None, bytes]


def _hostile(tmp: Path, *members: Member) -> Path:
    """A tar of ``members``: (name, b"file" data | "symlink target" | None for a dir, type)."""
    path = tmp / "hostile.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, what, kind in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                info.linkname = str(what)
                tar.addfile(info)
            elif kind == tarfile.REGTYPE:
                data = what if isinstance(what, bytes) else b""
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return path


ROOT: Member = (".", None, tarfile.DIRTYPE)
HOSTILE: dict[str, list[Member]] = {
    "dotdot": [ROOT, ("./../../etc/x", b"pwned", tarfile.REGTYPE)],
    "absolute": [ROOT, ("/etc/x", b"pwned", tarfile.REGTYPE)],
    "symlink-then-file": [
        ROOT,
        ("./l", "/etc", tarfile.SYMTYPE),
        ("./l/x", b"pwned", tarfile.REGTYPE),
    ],
    "hardlink-outside": [ROOT, ("./h", "../../etc/passwd", tarfile.LNKTYPE)],
    "forged-whiteout": [ROOT, ("./w", None, tarfile.CHRTYPE)],
    "twice": [ROOT, ("./f", b"a", tarfile.REGTYPE), ("./f", b"b", tarfile.REGTYPE)],
}


@pytest.mark.parametrize("attack", sorted(HOSTILE))
def test_a_hostile_sandbox_archive_is_refused(tmp_path: Path, attack: str) -> None:
    """An archive a sandbox made (it controls what execd's file holds once thawed) with a member
    that could land outside the layer is refused before anything is written."""
    path = _hostile(tmp_path, *HOSTILE[attack])
    with pytest.raises(CaptureRefused):
        read_archive(path)


def test_a_layer_whose_member_sits_under_a_symlink_is_refused_on_merge(tmp_path: Path) -> None:
    """Merging (the restore) checks every member again: a layer with a file below a symlink
    (written by anything but this code) never reaches the Pod."""
    path = _hostile(tmp_path, *HOSTILE["symlink-then-file"])
    out = tmp_path / "merged.tar"
    with pytest.raises(CaptureRefused):
        merge_layers([path], out)
    dotdot = _hostile(tmp_path, *HOSTILE["dotdot"])
    with pytest.raises(CaptureRefused):
        merge_layers([dotdot], out)
