"""Layer semantics of ``sandpod_image.layers``: what an unpacked layer holds, and the hostile
layers it refuses without changing anything outside its directory.

Layers are built entry by entry with ``tarfile`` (tests/layertar.py). Every attack test plants
files, directories and symlinks next to the layer and checks, after the refusal, that all of
them are exactly as they were. The suite runs as root, so root-only semantics (ownership,
setuid, ``security.capability``, ``trusted.`` xattrs) are checked directly; rootless mode is
the ``rootless=True`` option here and a real unprivileged user in test_image_overlay.py.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from pathlib import Path

import pytest
import zstandard

from layertar import (
    MTIME,
    device,
    directory,
    fifo,
    file,
    gzipped,
    hardlink,
    layer,
    snapshot,
    symlink,
    zstded,
)
from sandpod_image._errors import ImageLayerRefused, ImageUnsupported
from sandpod_image.layers import (
    MEDIA_TYPE_TAR,
    MEDIA_TYPE_TAR_GZIP,
    MEDIA_TYPE_TAR_ZSTD,
    UnpackOptions,
    UnpackReport,
    pack_layer,
    unpack_layer,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="layer ownership tests run as root")

# A file capability (VFS_CAP_REVISION_2, cap_net_bind_service permitted): binary, NULs inside.
CAPABILITY = bytes.fromhex("0100000200040000000000000000000000000000")


def unpack(
    dest: Path, data: bytes, media_type: str = MEDIA_TYPE_TAR, **options: object
) -> UnpackReport:
    dest.mkdir(exist_ok=True)
    opts = UnpackOptions(**options)  # type: ignore[arg-type]
    return unpack_layer(io.BytesIO(data), dest, media_type=media_type, options=opts)


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    return tmp_path / "layer"


# -- what a layer holds ----------------------------------------------------------------------


def test_files_dirs_links_modes_owners_and_mtimes_are_unpacked(dest: Path) -> None:
    """Regular files, directories, symlinks and hard links land with their modes, owners, mtimes."""
    data = layer(
        directory("usr", mode=0o755, uid=0, gid=0),
        directory("usr/bin", mode=0o750, uid=12, gid=34),
        file("usr/bin/tool", b"#!/bin/sh\n", mode=0o4755, uid=0, gid=0),
        file("usr/bin/group", b"g", mode=0o2711, uid=5, gid=6),
        directory("tmp", mode=0o1777),
        symlink("usr/bin/sh", "/bin/dash"),
        hardlink("usr/bin/tool2", "usr/bin/tool"),
    )
    report = unpack(dest, data)
    tool = dest / "usr/bin/tool"
    assert tool.read_bytes() == b"#!/bin/sh\n"
    assert stat.S_IMODE(tool.stat().st_mode) == 0o4755  # setuid kept (root)
    group = (dest / "usr/bin/group").stat()
    assert (stat.S_IMODE(group.st_mode), group.st_uid, group.st_gid) == (0o2711, 5, 6)
    bin_st = (dest / "usr/bin").stat()
    assert (stat.S_IMODE(bin_st.st_mode), bin_st.st_uid, bin_st.st_gid) == (0o750, 12, 34)
    assert stat.S_IMODE((dest / "tmp").stat().st_mode) == 0o1777
    assert os.readlink(dest / "usr/bin/sh") == "/bin/dash"
    assert (dest / "usr/bin/tool2").stat().st_ino == tool.stat().st_ino
    assert tool.stat().st_mtime_ns == MTIME * 10**9
    assert bin_st.st_mtime_ns == MTIME * 10**9  # applied after its children were written
    assert os.lstat(dest / "usr/bin/sh").st_mtime_ns == MTIME * 10**9
    assert report.entries == 7
    assert report.bytes == len(b"#!/bin/sh\n") + 1
    assert report.diff_id == "sha256:" + hashlib.sha256(data).hexdigest()


def test_xattrs_from_pax_headers_are_filtered(dest: Path) -> None:
    """user.* and security.capability are set (root); trusted.* and overlay xattrs never are."""
    info, body = file("bin/ping", b"x")
    info.pax_headers = {
        "SCHILY.xattr.user.mime": "text/plain",
        "SCHILY.xattr.security.capability": CAPABILITY.decode("utf-8", "surrogateescape"),
        "SCHILY.xattr.trusted.overlay.opaque": "y",
        "SCHILY.xattr.trusted.evil": "1",
        "SCHILY.xattr.user.overlay.opaque": "y",
    }
    unpack(dest, layer((info, body)))
    path = dest / "bin/ping"
    assert sorted(os.listxattr(path)) == ["security.capability", "user.mime"]
    assert os.getxattr(path, "security.capability") == CAPABILITY
    assert os.getxattr(path, "user.mime") == b"text/plain"


def test_rootless_keeps_mode_bits_but_not_owners_or_capabilities(dest: Path) -> None:
    """Rootless: the caller owns everything, modes stay, privileged xattrs are dropped."""
    info, body = file("bin/ping", b"x", mode=0o4755, uid=7, gid=8)
    info.pax_headers = {
        "SCHILY.xattr.security.capability": CAPABILITY.decode("utf-8", "surrogateescape"),
        "SCHILY.xattr.user.keep": "1",
    }
    report = unpack(dest, layer((info, body), directory("d/.", mode=0o500)), rootless=True)
    st = (dest / "bin/ping").stat()
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o4755, os.getuid(), os.getgid())
    assert os.listxattr(dest / "bin/ping") == ["user.keep"]
    assert stat.S_IMODE((dest / "d").stat().st_mode) == 0o500
    assert report.xattr_namespace == "user"


def test_whiteouts_become_overlay_character_devices(dest: Path) -> None:
    """``.wh.<name>`` becomes a 0/0 character device, the overlayfs whiteout."""
    report = unpack(dest, layer(directory("etc"), file("etc/.wh.motd")))
    st = os.lstat(dest / "etc/motd")
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(0, 0)
    assert not (dest / "etc/.wh.motd").exists()
    assert report.skipped == ()


def test_opaque_marker_sets_the_xattr_of_its_namespace(dest: Path, tmp_path: Path) -> None:
    """``.wh..wh..opq`` marks its directory opaque: trusted.* as root, user.* rootless."""
    data = layer(directory("var/cache"), file("var/cache/.wh..wh..opq"), file("var/cache/new"))
    unpack(dest, data)
    assert os.getxattr(dest / "var/cache", "trusted.overlay.opaque") == b"y"
    assert not (dest / "var/cache/.wh..wh..opq").exists()
    rootless = tmp_path / "rootless"
    report = unpack(rootless, data, rootless=True)
    assert os.listxattr(rootless / "var/cache") == ["user.overlay.opaque"]
    assert report.xattr_namespace == "user"


def test_a_whiteout_spares_its_own_layers_entries(dest: Path) -> None:
    """OCI: a whiteout hides lower layers only; a file of the same layer stays."""
    unpack(dest, layer(file("a", b"mine"), file(".wh.a")))
    assert (dest / "a").read_bytes() == b"mine"


def test_devices_and_fifos_are_skipped_and_listed(dest: Path) -> None:
    """Device nodes and fifos are never created; the report names them."""
    data = layer(
        directory("dev"),
        device("dev/null"),
        device("dev/sda", tarfile.BLKTYPE, 8, 0),
        fifo("dev/pipe"),
    )
    report = unpack(dest, data)
    assert os.listdir(dest / "dev") == []
    assert report.skipped == ("dev/null", "dev/sda", "dev/pipe")


def test_duplicate_entries_later_wins(dest: Path) -> None:
    """A later entry replaces an earlier one of the same name, whatever the kinds."""
    data = layer(
        file("a", b"first"),
        file("a", b"second"),
        directory("d"),
        file("d/child"),
        file("d", b"now a file"),
        symlink("s", "x"),
        directory("s"),
        file("s/inside", b"ok"),
    )
    unpack(dest, data)
    assert (dest / "a").read_bytes() == b"second"
    assert (dest / "d").read_bytes() == b"now a file"
    assert (dest / "s/inside").read_bytes() == b"ok"


@pytest.mark.parametrize(
    ("compress", "media_type"),
    [
        (gzipped, MEDIA_TYPE_TAR_GZIP),
        (zstded, MEDIA_TYPE_TAR_ZSTD),
        (gzipped, "application/vnd.docker.image.rootfs.diff.tar.gzip"),
        (lambda data: data, "application/vnd.docker.image.rootfs.diff.tar.gzip"),
    ],
)
def test_compressed_layers_give_the_tar_diff_id(
    dest: Path, compress: object, media_type: str
) -> None:
    """gzip and zstd are sniffed (a Docker 'gzip' layer may be plain tar); diff_id is the tar's."""
    data = layer(file("f", os.urandom(300_000)))
    report = unpack(dest, compress(data), media_type)  # type: ignore[operator]
    assert report.diff_id == "sha256:" + hashlib.sha256(data).hexdigest()
    assert (dest / "f").stat().st_size == 300_000


def test_multi_member_gzip_is_read_to_the_end(dest: Path) -> None:
    """A gzip blob of several members (pigz, some registries) unpacks whole."""
    data = layer(file("f", os.urandom(100_000)), file("g", b"tail"))
    blob = gzipped(data[:70_000]) + gzipped(data[70_000:])
    report = unpack(dest, blob, MEDIA_TYPE_TAR_GZIP)
    assert (dest / "g").read_bytes() == b"tail"
    assert report.diff_id == "sha256:" + hashlib.sha256(data).hexdigest()


def test_unknown_media_type_is_unsupported(dest: Path) -> None:
    """A blob that is not a layer tarball type raises image.unsupported."""
    with pytest.raises(ImageUnsupported) as err:
        unpack(dest, layer(), "application/vnd.oci.image.config.v1+json")
    assert err.value.code == "image.unsupported"


@pytest.mark.parametrize("blob", [b"\x1f\x8b" + b"garbage" * 50, b"not a tar at all" * 64])
def test_corrupt_layers_are_refused(dest: Path, blob: bytes) -> None:
    """Corrupt gzip or tar data raises image.layer_refused with reason corrupt."""
    with pytest.raises(ImageLayerRefused) as err:
        unpack(dest, blob, MEDIA_TYPE_TAR_GZIP)
    assert err.value.details["reason"] == "corrupt"


def test_truncated_gzip_is_refused(dest: Path) -> None:
    """A gzip stream cut short is corrupt, not a shorter layer."""
    blob = gzipped(layer(file("f", os.urandom(200_000))))
    with pytest.raises(ImageLayerRefused):
        unpack(dest, blob[: len(blob) // 2], MEDIA_TYPE_TAR_GZIP)


# -- pack ------------------------------------------------------------------------------------


def test_pack_then_unpack_round_trips_overlay_state(tmp_path: Path) -> None:
    """pack_layer turns whiteouts and opaque dirs into OCI markers that unpack_layer restores."""
    src = tmp_path / "upper"
    (src / "d/sub").mkdir(parents=True)
    (src / "d/f").write_bytes(b"data")
    os.chmod(src / "d/f", 0o4750)
    os.link(src / "d/f", src / "d/f2")
    os.symlink("../f", src / "d/sub/l")
    os.mknod(src / "d/gone", stat.S_IFCHR, os.makedev(0, 0))
    os.setxattr(src / "d/sub", "trusted.overlay.opaque", b"y")
    os.setxattr(src / "d/f", "user.k", b"v")
    out = io.BytesIO()
    packed = pack_layer(src, out, compress="zstd", mtime=0)
    blob = out.getvalue()
    assert packed.size == len(blob)
    assert packed.digest == "sha256:" + hashlib.sha256(blob).hexdigest()
    with tarfile.open(fileobj=io.BytesIO(zstandard_decompress(blob))) as tar:
        names = tar.getnames()
    # sorted by the upper's names: the whiteout of "gone" sorts as "gone"
    assert names == ["d", "d/f", "d/f2", "d/.wh.gone", "d/sub", "d/sub/.wh..wh..opq", "d/sub/l"]
    back = tmp_path / "back"
    report = unpack(back, blob, packed.media_type)
    assert report.diff_id == packed.diff_id
    assert (back / "d/f2").stat().st_ino == (back / "d/f").stat().st_ino
    assert stat.S_IMODE((back / "d/f").stat().st_mode) == 0o4750
    assert os.getxattr(back / "d/f", "user.k") == b"v"
    assert os.getxattr(back / "d/sub", "trusted.overlay.opaque") == b"y"
    assert os.lstat(back / "d/gone").st_rdev == os.makedev(0, 0)


def test_pack_is_deterministic(tmp_path: Path) -> None:
    """The same tree packs to the same digest, whatever order the files were created in."""
    digests = set()
    for order in (("a", "b", "c"), ("c", "a", "b")):
        src = tmp_path / "-".join(order)
        src.mkdir()
        for name in order:
            (src / name).write_text(name)
        digests.add(pack_layer(src, io.BytesIO(), mtime=0).digest)
    assert len(digests) == 1


def test_pack_refuses_an_unknown_compression(tmp_path: Path) -> None:
    """compress must be gzip, zstd or none."""
    with pytest.raises(ImageUnsupported):
        pack_layer(tmp_path, io.BytesIO(), compress="bzip2")


def zstandard_decompress(blob: bytes) -> bytes:
    return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(blob)).read()


# -- hostile layers --------------------------------------------------------------------------


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """Files an attacker wants to reach, next to the layer directory."""
    victim = tmp_path / "outside"
    victim.mkdir()
    (victim / "secret").write_bytes(b"keep me")
    (victim / "dir").mkdir()
    os.symlink(victim / "secret", tmp_path / "planted-link")
    return victim


def refused(tmp_path: Path, dest: Path, data: bytes, reason: str, **options: int) -> None:
    """Unpacking ``data`` is refused for ``reason`` and nothing outside ``dest`` changed."""
    before = snapshot(tmp_path, skip=dest)
    with pytest.raises(ImageLayerRefused) as err:
        unpack(dest, data, MEDIA_TYPE_TAR, **options)
    assert err.value.code == "image.layer_refused"
    assert err.value.details["reason"] == reason
    assert snapshot(tmp_path, skip=dest) == before


def test_dotdot_names_are_refused(tmp_path: Path, dest: Path, outside: Path) -> None:
    """``../`` in a name never writes next to the layer."""
    refused(tmp_path, dest, layer(file("../outside/secret", b"pwned")), "path_escape")
    refused(tmp_path, dest, layer(file("a/../../outside/new", b"pwned")), "path_escape")


def test_absolute_names_are_refused(tmp_path: Path, dest: Path, outside: Path) -> None:
    """An absolute name is refused, not written at that path on the host."""
    refused(tmp_path, dest, layer(file(str(outside / "secret"), b"pwned")), "path_escape")


def test_symlink_then_write_is_refused(tmp_path: Path, dest: Path, outside: Path) -> None:
    """A symlink to outside followed by an entry through it writes nothing outside."""
    for target in (str(outside), "../outside", "."):
        data = layer(symlink("esc", target), file("esc/secret", b"pwned"))
        refused(tmp_path, dest, data, "path_escape")
    data = layer(symlink("esc", str(outside)), directory("esc/dir/new"))
    refused(tmp_path, dest, data, "path_escape")


def test_whiteout_or_opaque_through_a_symlink_is_refused(
    tmp_path: Path, dest: Path, outside: Path
) -> None:
    """Whiteouts cannot delete or mark anything outside through a symlinked directory."""
    refused(tmp_path, dest, layer(symlink("e", str(outside)), file("e/.wh.secret")), "path_escape")
    data = layer(symlink("e", str(outside)), file("e/dir/.wh..wh..opq"))
    refused(tmp_path, dest, data, "path_escape")
    refused(tmp_path, dest, layer(file("d/.wh..")), "path_escape")


def test_symlink_replacing_a_directory_cannot_be_written_through(
    tmp_path: Path, dest: Path, outside: Path
) -> None:
    """A directory replaced by a symlink (cached fds forgotten) is not followed later."""
    data = layer(
        directory("d"),
        file("d/a", b"in layer"),
        symlink("d", str(outside)),
        file("d/secret", b"pwned"),
    )
    refused(tmp_path, dest, data, "path_escape")


def test_a_file_entry_replaces_a_symlink_instead_of_following_it(
    tmp_path: Path, dest: Path, outside: Path
) -> None:
    """Writing a file where a symlink to outside is replaces the link; the target is untouched."""
    before = snapshot(tmp_path, skip=dest)
    unpack(dest, layer(symlink("f", str(outside / "secret")), file("f", b"mine")))
    assert (dest / "f").read_bytes() == b"mine" and not (dest / "f").is_symlink()
    assert snapshot(tmp_path, skip=dest) == before


@pytest.mark.parametrize(
    "target",
    ["../outside/secret", "/etc/passwd", "not/yet/there", "later"],
)
def test_hard_links_outside_the_layer_are_refused(
    tmp_path: Path, dest: Path, outside: Path, target: str
) -> None:
    """A hard link may only point at an earlier file of the same layer."""
    reason = "path_escape" if target.startswith(("/", "..")) else "link_escape"
    data = layer(hardlink("l", target), file("later", b"x"))
    refused(tmp_path, dest, data, reason)


def test_hard_link_through_a_symlinked_directory_is_refused(
    tmp_path: Path, dest: Path, outside: Path
) -> None:
    """A hard link whose source path goes through a symlink out of the layer is refused."""
    data = layer(file("a"), symlink("esc", str(outside)), hardlink("esc/secret2", "a"))
    refused(tmp_path, dest, data, "path_escape")
    data = layer(
        directory("esc"),
        file("esc/secret"),
        symlink("esc", str(outside)),
        hardlink("x", "esc/secret"),
    )
    refused(tmp_path, dest, data, "link_escape")


def test_huge_entries_are_refused_before_writing(tmp_path: Path, dest: Path) -> None:
    """A file over max_entry_bytes is refused from its header, before any byte is written."""
    data = layer(file("big", b"x" * 5000))
    refused(tmp_path, dest, data, "too_large", max_entry_bytes=4096)
    assert not (dest / "big").exists()


def test_layer_size_bound_stops_a_decompression_bomb(tmp_path: Path, dest: Path) -> None:
    """The uncompressed tar is bounded: a small gzip of a huge tar is refused past the limit."""
    bomb = gzipped(layer(file("zeros", bytes(4 << 20))))
    assert len(bomb) < 64 << 10
    before = snapshot(tmp_path, skip=dest)
    dest.mkdir()
    with pytest.raises(ImageLayerRefused) as err:
        unpack_layer(
            io.BytesIO(bomb),
            dest,
            media_type=MEDIA_TYPE_TAR_GZIP,
            options=UnpackOptions(max_layer_bytes=1 << 20),
        )
    assert err.value.details["reason"] == "too_large"
    assert snapshot(tmp_path, skip=dest) == before


def test_over_long_names_are_refused(tmp_path: Path, dest: Path) -> None:
    """A name component over 255 bytes or a path over 4096 is refused."""
    refused(tmp_path, dest, layer(file("a" * 256)), "name_too_long")
    refused(tmp_path, dest, layer(file("/".join(["d" * 200] * 25))), "name_too_long")


# -- the tar dialects layers come in ---------------------------------------------------------


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
def test_long_names_in_every_tar_dialect(dest: Path, fmt: int) -> None:
    """GNU long names/links, PAX paths and the ustar prefix field all give the full name."""
    deep = "/".join(["directory-name-of-some-length"] * 5) + "/file"  # 154 chars: > 100
    members = [file(deep, b"deep"), symlink("link", "/".join(["t" * 60] * 3))]
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for info, body in members:
            if fmt == tarfile.USTAR_FORMAT and info.issym():
                continue  # ustar has no long link names
            tar.addfile(info, io.BytesIO(body) if body is not None else None)
    unpack(dest, out.getvalue())
    assert (dest / deep).read_bytes() == b"deep"
    if fmt != tarfile.USTAR_FORMAT:
        assert os.readlink(dest / "link") == "/".join(["t" * 60] * 3)


def test_pax_numbers_global_headers_and_base256(dest: Path) -> None:
    """PAX mtime with nanoseconds, global headers, and GNU base-256 ids are read exactly."""
    info, _ = file("f", b"x", uid=3_000_000, gid=7)
    info.mtime = 1_700_000_000.5  # tarfile writes a fractional mtime as a PAX record
    out = io.BytesIO()
    with tarfile.open(
        fileobj=out, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "g"}
    ) as tar:
        tar.addfile(info, io.BytesIO(b"x"))
    unpack(dest, out.getvalue())
    st = (dest / "f").stat()
    assert (st.st_uid, st.st_mtime_ns) == (3_000_000, 1_700_000_000_500_000_000)
    gnu = io.BytesIO()
    big, _ = file("g", uid=2**22)  # over 7 octal digits: GNU writes base-256
    with tarfile.open(fileobj=gnu, mode="w", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(big, io.BytesIO(b""))
    unpack(dest, gnu.getvalue())
    assert (dest / "g").stat().st_uid == 2**22


def test_a_bad_header_checksum_is_corrupt(dest: Path) -> None:
    """A header whose checksum does not match is refused, not guessed at."""
    data = bytearray(layer(file("f", b"x")))
    data[0] ^= 1
    with pytest.raises(ImageLayerRefused) as err:
        unpack(dest, bytes(data))
    assert err.value.details["reason"] == "corrupt"


def test_a_tar_cut_inside_a_file_is_corrupt(dest: Path) -> None:
    """A tar that ends inside a file body is refused."""
    data = layer(file("f", os.urandom(10_000)))
    with pytest.raises(ImageLayerRefused):
        unpack(dest, data[:5000])


def test_hard_links_across_many_directories_link_the_right_files(dest: Path) -> None:
    """Past the unpacker's fd cache (256 directories), every link still names its own source."""
    members = []
    for n in range(600):
        members += [directory(f"d{n}"), file(f"d{n}/f", f"file {n}".encode())]
    members += [hardlink(f"d{(n + 1) % 600}/link{n}", f"d{n}/f") for n in range(600)]
    unpack(dest, layer(*members))
    for n in range(600):
        link = dest / f"d{(n + 1) % 600}/link{n}"
        assert link.read_bytes() == f"file {n}".encode()
        assert link.stat().st_ino == (dest / f"d{n}/f").stat().st_ino
