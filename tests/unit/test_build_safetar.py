"""A ``copy`` step's tar (``builds.commit.unpack_tar`` through ``builds.safetar``) on real tar
archives: hostile members are refused and normal ones unpacked, both where Python has the
``data`` filter and with the fallback that Pythons before 3.11.4 (Debian 12's, the node
images') take."""

from __future__ import annotations

import io
import stat
import tarfile
from pathlib import Path

import pytest

from sandpod_lifecycle.builds import safetar
from sandpod_lifecycle.builds.commit import unpack_tar


def _tar(path: Path, *members: tuple[tarfile.TarInfo, bytes]) -> Path:
    with tarfile.open(path, "w") as tf:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tf.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def _info(
    name: str, kind: bytes = tarfile.REGTYPE, mode: int = 0o644, link: str = ""
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, link
    return info


ATTACKS = {
    "dotdot": _info("../escaped"),
    "symlink outside": _info("out", tarfile.SYMTYPE, link="../../etc"),
    "absolute symlink": _info("abs", tarfile.SYMTYPE, link="/etc/passwd"),
    "hardlink outside": _info("hard", tarfile.LNKTYPE, link="../outside-file"),
    "device": _info("null", tarfile.CHRTYPE),
    "fifo": _info("pipe", tarfile.FIFOTYPE),
}


@pytest.fixture(params=["python", "fallback"])
def which(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "fallback":
        monkeypatch.setattr(safetar, "HAS_DATA_FILTER", False)
    elif not safetar.HAS_DATA_FILTER:
        pytest.skip("this Python predates tarfile's data filter (3.11.4): the fallback runs")
    return str(request.param)


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_hostile_member_is_refused_and_nothing_lands_outside(
    attack: str, which: str, tmp_path: Path
) -> None:
    """Each way out of the layer (``..``, links out, absolute links, devices, FIFOs) is a
    TarError, and nothing is written next to the layer."""
    (tmp_path / "outside-file").write_text("secret")
    tar = _tar(tmp_path / "in.tar", (ATTACKS[attack], b"x"))
    layer = tmp_path / "work" / "layer"
    layer.parent.mkdir()
    with pytest.raises(tarfile.TarError):
        unpack_tar(tar, layer, "/app", [])
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["layer"], which
    assert not (layer / "escaped").exists() and not (tmp_path / "work" / "escaped").exists()


def test_normal_members_unpack_as_roots_without_special_bits(which: str, tmp_path: Path) -> None:
    """Files, directories and links inside unpack at the step's directory, root's, with the
    setuid and group/other write bits cleared."""
    tar = _tar(
        tmp_path / "in.tar",
        (_info("bin", tarfile.DIRTYPE, 0o755), b""),
        (_info("bin/tool", mode=0o4777), b"#!/bin/sh\n"),
        (_info("bin/alias", tarfile.SYMTYPE, link="tool"), b""),
        (_info("bin/hard", tarfile.LNKTYPE, 0o4775, link="bin/tool"), b""),
    )
    layer = tmp_path / "layer"
    unpack_tar(tar, layer, "/app", [])
    tool = layer / "app/bin/tool"
    assert tool.read_text() == "#!/bin/sh\n", which
    st = tool.stat()
    assert stat.S_IMODE(st.st_mode) == 0o755 and (st.st_uid, st.st_gid) == (0, 0), oct(st.st_mode)
    assert (layer / "app/bin/alias").readlink() == Path("tool")
    assert (layer / "app/bin/hard").stat().st_ino == st.st_ino
