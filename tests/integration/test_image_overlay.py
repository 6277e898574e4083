"""Unpacked layers are what overlayfs expects: two stacked layers mounted for real.

The kernel is the judge here: each test unpacks layers built with ``tarfile`` and mounts them as
overlay lower layers in a private mount namespace (``unshare --mount``), then reads the merged
tree. Whiteouts must hide the lower file and opaque directories the lower directory's entries;
the rootless test unpacks as an unprivileged user (``setpriv``) and mounts in that user's own
user namespace with ``-o userxattr``, which reads the ``user.overlay.opaque`` markers.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from layertar import directory, file, gzipped, hardlink, layer, symlink
from rootless import as_user, ensure_user
from sandpod_image.layers import MEDIA_TYPE_TAR_GZIP, unpack_layer

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="mounting overlayfs and preparing the unprivileged user needs root"
)

LOWER = layer(
    directory("a"),
    file("a/keep", b"lower keep"),
    file("a/gone", b"lower gone"),
    directory("d"),
    file("d/old", b"old"),
    directory("d/sub"),
    file("d/sub/deep", b"deep"),
    file("bin/tool", b"tool", mode=0o4755),
    hardlink("bin/tool-link", "bin/tool"),
    symlink("bin/sh", "tool"),
)
UPPER = layer(
    file("a/.wh.gone"),
    file("a/added", b"upper added"),
    directory("d"),
    file("d/.wh..wh..opq"),
    file("d/new", b"new"),
)
# The merged view: "gone" whited out, everything lower under d/ hidden by the opaque marker.
MERGED = "\n".join(
    [
        "./a",
        "./a/added",
        "./a/keep",
        "./bin",
        "./bin/sh",
        "./bin/tool",
        "./bin/tool-link",
        "./d",
        "./d/new",
    ]
)
LIST = "cd {mnt} && find . -mindepth 1 | sort && cat a/keep a/added d/new bin/sh"


def mount_and_list(lowers: list[Path], mnt: Path, *, userxattr: bool) -> str:
    """Mount ``lowers`` (top first) read-only on ``mnt`` in a new mount namespace; list it."""
    options = "ro,lowerdir=" + ":".join(str(p) for p in lowers)
    if userxattr:
        options += ",userxattr"
    return f"mount -t overlay overlay -o {options} {mnt} && " + LIST.format(mnt=mnt)


def test_stacked_layers_mount_with_whiteouts_and_opaque_dirs(tmp_path: Path) -> None:
    """As root: the upper layer's whiteout and opaque marker take effect in a real overlay."""
    lowers = []
    for name, data in (("upper", UPPER), ("lower", LOWER)):
        dest = tmp_path / name
        dest.mkdir()
        unpack_layer(io.BytesIO(gzipped(data)), dest, media_type=MEDIA_TYPE_TAR_GZIP)
        lowers.append(dest)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = mount_and_list(lowers, mnt, userxattr=False)
    out = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == MERGED + "\nlower keepupper addednewtool"
    assert (tmp_path / "lower/bin/tool").stat().st_mode & 0o4000


@pytest.fixture
def user_dir() -> Iterator[tuple[int, int, Path]]:
    """The unprivileged test user and a directory it owns, where it can traverse."""
    uid, gid = ensure_user()
    work = Path(tempfile.mkdtemp(prefix="sandpod-layers-", dir="/tmp"))
    os.chown(work, uid, gid)
    try:
        yield uid, gid, work
    finally:
        shutil.rmtree(work)


UNPACK = """
import io, json, sys
from pathlib import Path
from sandpod_image.layers import unpack_layer
reports = []
for blob, dest in zip(sys.argv[1::2], sys.argv[2::2]):
    Path(dest).mkdir()
    with open(blob, "rb") as f:
        r = unpack_layer(f, Path(dest), media_type="application/vnd.oci.image.layer.v1.tar+gzip")
    reports.append(r.xattr_namespace)
print(json.dumps(reports))
"""


def test_rootless_unpack_mounts_with_userxattr(user_dir: tuple[int, int, Path]) -> None:
    """An unprivileged user unpacks both layers and mounts them in its user namespace."""
    uid, gid, work = user_dir
    args = []
    for name, data in (("upper", UPPER), ("lower", LOWER)):
        blob = work / f"{name}.tar.gz"
        blob.write_bytes(gzipped(data))
        args += [str(blob), str(work / name)]
    spare = Path("/run") / f"sandpod-expose-{uuid.uuid4().hex[:8]}"
    try:
        prefix = as_user(uid, gid, spare)
        done = subprocess.run(
            [*prefix, sys.executable, "-c", UNPACK, *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        if spare.exists():
            spare.rmdir()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["user", "user"]
    tool = (work / "lower/bin/tool").stat()
    assert (tool.st_uid, tool.st_gid, tool.st_mode & 0o4000) == (uid, gid, 0o4000)
    (work / "mnt").mkdir()
    os.chown(work / "mnt", uid, gid)
    script = mount_and_list([work / "upper", work / "lower"], work / "mnt", userxattr=True)
    drop = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]
    userns = ["unshare", "--user", "--map-root-user", "--mount", "--", "sh", "-c", script]
    out = subprocess.run([*drop, *userns], capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout == MERGED + "\nlower keepupper addednewtool"
