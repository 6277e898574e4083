"""OCI layouts written by ``sandpod_image.ocilayout`` read by other tools, and theirs read by us.

Interoperability is shown with the reference tools from Debian: ``skopeo inspect`` reads the
layout's index, manifest and config; ``umoci unpack`` applies our layers (whiteouts and opaque
directories included) into a root filesystem that must be the expected tree; and a layer
``umoci repack`` writes after a deletion unpacks here into an overlay whiteout.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sandpod_image.layers import unpack_layer
from sandpod_image.ocilayout import REF_NAME, HistoryEntry, ImageConfig, OciLayout

TOOLS = [t for t in ("skopeo", "umoci") if shutil.which(t) is None]
pytestmark = [
    pytest.mark.skipif(bool(TOOLS), reason=f"install Debian's {' and '.join(TOOLS)} packages"),
    pytest.mark.skipif(os.geteuid() != 0, reason="overlay whiteouts and umoci unpack need root"),
]

CONFIG = ImageConfig(
    env=("PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"),
    working_dir="/work",
    user="1000:1000",
    entrypoint=("/bin/sh", "-c"),
    cmd=("echo hi",),
    labels={"org.sandpod.test": "yes"},
)


def two_layers(tmp_path: Path) -> OciLayout:
    """A layout tagged ``v1``: a base, then a layer whiting out a file and making a dir opaque."""
    base, top = tmp_path / "base", tmp_path / "top"
    (base / "etc/conf.d").mkdir(parents=True)
    (base / "etc/keep").write_text("keep")
    (base / "etc/gone").write_text("gone")
    (base / "etc/conf.d/old").write_text("old")
    (top / "etc/conf.d").mkdir(parents=True)
    os.mknod(top / "etc/gone", stat.S_IFCHR, os.makedev(0, 0))
    os.setxattr(top / "etc/conf.d", "trusted.overlay.opaque", b"y")
    (top / "etc/conf.d/new").write_text("new")
    layout = OciLayout(tmp_path / "layout")
    layout.add_layer(base, created_by="base", mtime=0)
    layout.add_layer(top, created_by="top", mtime=0)
    layout.write_image(CONFIG, ref="v1", extra_history=[HistoryEntry("ENV", empty_layer=True)])
    return layout


def run(*argv: str, cwd: Path | None = None) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=cwd, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_skopeo_reads_the_layout_and_its_config(tmp_path: Path) -> None:
    """skopeo inspect finds the tag, the layers and the runtime config we wrote."""
    layout = two_layers(tmp_path)
    image = f"oci:{layout.root}:v1"
    info = json.loads(run("skopeo", "inspect", image))
    assert len(info["Layers"]) == 2
    assert info["Env"] == list(CONFIG.env)
    assert info["Labels"] == {"org.sandpod.test": "yes"}
    config = json.loads(run("skopeo", "inspect", "--config", image))
    assert config["config"]["WorkingDir"] == "/work"
    assert config["config"]["User"] == "1000:1000"
    assert config["config"]["Entrypoint"] == ["/bin/sh", "-c"]
    assert config["config"]["Cmd"] == ["echo hi"]
    assert len(config["rootfs"]["diff_ids"]) == 2
    assert [h.get("empty_layer", False) for h in config["history"]] == [False, False, True]


def test_rewriting_a_tag_keeps_the_others_and_is_reproducible(tmp_path: Path) -> None:
    """Writing the same image again gives the same manifest digest; other tags stay."""
    layout = two_layers(tmp_path)
    first = layout.write_image(CONFIG, ref="v1")
    again = layout.write_image(CONFIG, ref="v1")
    layout.write_image(CONFIG, ref="latest")
    assert first == again
    index = json.loads((layout.root / "index.json").read_text())
    refs = sorted(m["annotations"][REF_NAME] for m in index["manifests"])
    assert refs == ["latest", "v1"]


def test_umoci_unpacks_our_whiteouts_and_opaque_dirs(tmp_path: Path) -> None:
    """umoci applies our two layers into the tree the overlay semantics say."""
    layout = two_layers(tmp_path)
    bundle = tmp_path / "bundle"
    run("umoci", "unpack", "--image", f"{layout.root}:v1", str(bundle))
    rootfs = bundle / "rootfs"
    found = sorted(str(p.relative_to(rootfs)) for p in rootfs.rglob("*"))
    assert found == ["etc", "etc/conf.d", "etc/conf.d/new", "etc/keep"]
    process = json.loads((bundle / "config.json").read_text())["process"]
    assert process["args"] == ["/bin/sh", "-c", "echo hi"]
    assert process["cwd"] == "/work"


def test_a_umoci_layer_with_a_deletion_unpacks_to_an_overlay_whiteout(tmp_path: Path) -> None:
    """umoci repack's layer for a deleted file becomes a 0/0 character device here."""
    layout = two_layers(tmp_path)
    bundle = tmp_path / "bundle"
    run("umoci", "unpack", "--image", f"{layout.root}:v1", str(bundle))
    (bundle / "rootfs/etc/keep").unlink()
    (bundle / "rootfs/etc/added").write_text("added")
    run("umoci", "repack", "--image", f"{layout.root}:v2", str(bundle))
    manifest = manifest_of(layout.root, "v2")
    top = manifest["layers"][-1]
    dest = tmp_path / "unpacked"
    dest.mkdir()
    blob = layout.blobs / top["digest"].removeprefix("sha256:")
    with blob.open("rb") as f:
        report = unpack_layer(io.BufferedReader(f), dest, media_type=top["mediaType"])
    whiteout = os.lstat(dest / "etc/keep")
    assert stat.S_ISCHR(whiteout.st_mode) and whiteout.st_rdev == 0
    assert (dest / "etc/added").read_text() == "added"
    config = json.loads((layout.blobs / manifest["config"]["digest"][7:]).read_text())
    assert config["rootfs"]["diff_ids"][-1] == report.diff_id


def manifest_of(root: Path, ref: str) -> dict[str, Any]:
    index = json.loads((root / "index.json").read_text())
    (entry,) = [m for m in index["manifests"] if m["annotations"][REF_NAME] == ref]
    loaded: dict[str, Any] = json.loads((root / "blobs/sha256" / entry["digest"][7:]).read_text())
    return loaded
