"""``make images`` without Docker: the layouts are valid OCI images with the expected content.

``sandpod_image.makeimages`` is run as ``make images`` runs it. The execd image's layer is
unpacked with ``unpack_layer`` and compared file by file with a bundle the recipe script builds
directly (the interpreter is this machine's, linked in as test_execd_bundle.py does: the image
build would copy uv's standalone CPython there); ``skopeo inspect`` must read every layout. The
base image is built from the real ``mmdebstrap`` tarball, cached under ~/.cache/sandpod/images
so the suite builds it at most once per machine.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sandpod_image.layers import unpack_layer
from sandpod_image.makeimages import Build, base_image, main, service_image
from sandpod_image.ocilayout import REF_NAME

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "images" / "build-execd-bundle.sh"
pytestmark = pytest.mark.skipif(
    shutil.which("skopeo") is None, reason="install Debian's skopeo package"
)


def fake_python_home(root: Path) -> Path:
    """A python home whose interpreter is this machine's (bin/python3 only)."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python3").symlink_to(Path(sys.base_prefix) / "bin" / "python3")
    return root


def uv_env() -> dict[str, str]:
    return {**os.environ, "UV": shutil.which("uv") or f"{sys.executable} -m uv"}


def tree_digest(root: Path) -> dict[str, str]:
    """relative path -> sha256 of a file, the target of a symlink, or 'dir'.

    A ``RECORD`` is listed but not hashed: it holds the hash of each console script uv wrote
    with the build directory's absolute shebang (the script then deletes them: bin/ is ours).
    """
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.name == "RECORD" and path.parent.name.endswith(".dist-info"):
            found[rel] = "record"
        elif path.is_symlink():
            found[rel] = "-> " + os.readlink(path)
        elif path.is_dir():
            found[rel] = "dir"
        else:
            found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def read_image(layout: Path, tag: str) -> tuple[dict[str, Any], dict[str, Any]]:
    index = json.loads((layout / "index.json").read_text())
    (entry,) = [m for m in index["manifests"] if m["annotations"][REF_NAME] == tag]
    blobs = layout / "blobs" / "sha256"
    manifest: dict[str, Any] = json.loads((blobs / entry["digest"][7:]).read_text())
    config: dict[str, Any] = json.loads((blobs / manifest["config"]["digest"][7:]).read_text())
    return manifest, config


def test_execd_image_holds_exactly_the_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sandpod-execd layout's one layer is the recipe's bundle, owned by root."""
    monkeypatch.setenv("UV", uv_env()["UV"])
    home = fake_python_home(tmp_path / "home")
    out = tmp_path / "images"
    argv = ["--only", "execd", "--out", str(out), "--repo", str(REPO), "--python-home", str(home)]
    assert main(argv) == 0
    layout = out / "sandpod-execd"
    info = json.loads(
        subprocess.run(
            ["skopeo", "inspect", f"oci:{layout}:latest"],
            capture_output=True,
            check=True,
            text=True,
        ).stdout
    )
    assert len(info["Layers"]) == 1
    manifest, config = read_image(layout, "latest")
    assert config["config"]["User"] == "65532:65532"
    assert config["config"]["Cmd"] == ["/bin/cp", "-a", "/sandpod-bundle/.", "/opt/sandpod/"]
    (layer,) = manifest["layers"]
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    with (layout / "blobs/sha256" / layer["digest"][7:]).open("rb") as blob:
        report = unpack_layer(io.BufferedReader(blob), unpacked, media_type=layer["mediaType"])
    assert config["rootfs"]["diff_ids"] == [report.diff_id]
    expected = tmp_path / "direct" / "sandpod-bundle"
    shutil.copytree(home, expected / "python", symlinks=True)
    subprocess.run(
        ["bash", str(SCRIPT), str(expected / "python/bin/python3"), str(expected)],
        cwd=REPO,
        env=uv_env(),
        check=True,
        timeout=300,
    )
    assert tree_digest(unpacked / "sandpod-bundle") == tree_digest(expected)
    # The copy the Pod's init container runs needs no libc: a static busybox, nothing else.
    assert sorted(p.name for p in unpacked.iterdir()) == ["bin", "sandpod-bundle"]
    assert os.readlink(unpacked / "bin/cp") == "busybox"
    assert (
        b"statically linked"
        in subprocess.run(
            ["file", str(unpacked / "bin/busybox")], capture_output=True, check=True
        ).stdout
    )
    launcher = (unpacked / "sandpod-bundle/bin/sandpod-execd").stat()
    assert (launcher.st_uid, launcher.st_gid, launcher.st_mode & 0o777) == (0, 0, 0o755)


@pytest.mark.skipif(shutil.which("mmdebstrap") is None, reason="install Debian's mmdebstrap")
def test_base_image_is_the_default_base_and_runs_python(tmp_path: Path) -> None:
    """sandpod-base's layer is the default sandbox base; unpacked, its python3 runs."""
    out = tmp_path / "images"
    # Uncompressed: gzip of the ~500 MB tree costs ~50 s here and is tested on small layers.
    assert main(["--only", "base", "--out", str(out), "--compress", "none"]) == 0
    layout = out / "sandpod-base"
    subprocess.run(["skopeo", "inspect", f"oci:{layout}:latest"], capture_output=True, check=True)
    manifest, config = read_image(layout, "latest")
    assert config["config"]["Cmd"] == ["/bin/bash"]
    (layer,) = manifest["layers"]
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    with (layout / "blobs/sha256" / layer["digest"][7:]).open("rb") as blob:
        report = unpack_layer(
            io.BufferedReader(blob, 1 << 20), rootfs, media_type=layer["mediaType"]
        )
    assert config["rootfs"]["diff_ids"] == [report.diff_id]
    assert all(name.lstrip("./").startswith("dev/") for name in report.skipped), report.skipped
    ran = subprocess.run(
        ["chroot", str(rootfs), "/usr/bin/python3", "-c", "import venv, ssl; print('ok')"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0 and ran.stdout == "ok\n", ran.stderr
    assert not (rootfs / "usr/lib/python3.11/EXTERNALLY-MANAGED").exists()


@pytest.mark.skipif(shutil.which("mmdebstrap") is None, reason="install Debian's mmdebstrap")
def test_service_image_runs_its_service_on_the_base(tmp_path: Path) -> None:
    """sandpod-pool = the base's layer blob + its packages; stacked, python3 imports it."""
    build = Build(
        repo=REPO,
        out=tmp_path / "images",
        cache=Path.home() / ".cache/sandpod/images",
        tag="t",
        uv=tuple(uv_env()["UV"].split()),
        compress="none",
    )
    base = base_image(build, None)
    layout = service_image(build, base, "pool", Path("/usr/bin/python3.11"))
    subprocess.run(["skopeo", "inspect", f"oci:{layout}:t"], capture_output=True, check=True)
    manifest, config = read_image(layout, "t")
    assert manifest["layers"][0]["digest"] == base.packed.digest  # shared, not repacked
    assert config["config"]["User"] == "10001:10001"
    lowers = []
    for n, layer in enumerate(reversed(manifest["layers"])):
        dest = tmp_path / f"layer{n}"
        dest.mkdir()
        with (layout / "blobs/sha256" / layer["digest"][7:]).open("rb") as blob:
            unpack_layer(io.BufferedReader(blob, 1 << 20), dest, media_type=layer["mediaType"])
        lowers.append(str(dest))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = " ".join(config["config"]["Env"])
    script = (
        f"mount -t overlay overlay -o ro,lowerdir={':'.join(reversed(lowers))} {mnt} && "
        f"chroot {mnt} env -i {env} python3 -c 'import sandpod_pool.service; print(\"ok\")'"
    )
    ran = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0 and ran.stdout == "ok\n", ran.stderr
