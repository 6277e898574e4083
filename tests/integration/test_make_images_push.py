"""``make images`` pushes its layouts where a registry is configured, with our own push code.

A real registry (Debian's docker-registry on loopback, htpasswd auth: tests/registry.py). The
base image is made from a small tree (``--base-rootfs``) so the test stays fast; the push path
is the same for every image. The pushed image is pulled back through ``sandpod_image`` (every
blob verified) and compared with the layout; a second push sends nothing; refused credentials
fail ``make images`` with the typed code.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from registry import TestRegistry
from runnable_image import docker_config
from sandpod_contract.errors import ImageNotFound
from sandpod_image.auth import AuthConfig, load_auth_file
from sandpod_image.makeimages import MakeImagesFailed, main, push_images
from sandpod_image.pushlayout import layout_manifest
from sandpod_image.store import ImageStore

AUTH = AuthConfig(username="maker", password="images-pw")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestRegistry]:
    reg = TestRegistry(tmp_path_factory.mktemp("images-registry"), users={"maker": "images-pw"})
    reg.start()
    yield reg
    reg.stop()


def _tree(root: Path) -> Path:
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "os-release").write_text("ID=sandpod-test\n")
    (root / "bin").mkdir()
    (root / "bin" / "tool").write_bytes(b"#!/bin/sh\necho tool\n")
    (root / "bin" / "tool").chmod(0o755)
    return root


def test_make_images_pushes_each_layout_and_skips_what_the_registry_has(
    registry: TestRegistry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With a registry set, the written image is pushed (a line per blob), pulls back
    byte-identical (same manifest digest, same files), and a second push uploads nothing."""
    creds = docker_config(tmp_path / "config.json", registry, AUTH)
    out = tmp_path / "images"
    argv = ["--only", "base", "--base-rootfs", str(_tree(tmp_path / "tree")), "--out", str(out)]
    argv += ["--push", f"{registry.host}/sandpod", "--auth-file", str(creds), "--tag", "t1"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "sandpod-base: layer sha256:" in printed and " pushed" in printed, printed
    _, digest = layout_manifest(out / "sandpod-base", "t1")
    assert f"sandpod-base: {registry.host}/sandpod/sandpod-base@{digest}" in printed

    store = ImageStore(tmp_path / "pulled", auth_file=load_auth_file(creds))
    image = asyncio.run(store.pull(f"{registry.host}/sandpod/sandpod-base:t1"))
    assert image.digest == digest
    (layer,) = image.layers
    assert (layer / "etc/os-release").read_text() == "ID=sandpod-test\n"
    assert (layer / "bin/tool").stat().st_mode & 0o111

    assert main(argv) == 0  # the same layout again: every blob is there
    again = capsys.readouterr().out
    assert again.count("exists, skipped") == 3 and " pushed" not in again, again


def test_make_images_push_with_refused_credentials_fails_typed(
    registry: TestRegistry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Wrong credentials: ``make images`` exits 1 naming ``image.auth_failed``."""
    wrong = docker_config(
        tmp_path / "config.json", registry, AuthConfig(username="maker", password="wrong")
    )
    assert json.loads(wrong.read_text())["auths"]
    argv = ["--only", "base", "--base-rootfs", str(_tree(tmp_path / "tree"))]
    argv += ["--out", str(tmp_path / "images"), "--push", f"{registry.host}/sandpod"]
    assert main([*argv, "--auth-file", str(wrong)]) == 1
    assert "[image.auth_failed]" in capsys.readouterr().err


def test_a_tampered_layout_blob_is_refused_before_anything_is_sent(
    registry: TestRegistry, tmp_path: Path
) -> None:
    """A layer blob of the layout that no longer matches its digest: the push stops with
    ``image.digest_mismatch`` and the registry never gets the image."""
    creds = docker_config(tmp_path / "config.json", registry, AUTH)
    out = tmp_path / "images"
    argv = ["--only", "base", "--base-rootfs", str(_tree(tmp_path / "tree")), "--out", str(out)]
    assert main(argv) == 0
    manifest, _ = layout_manifest(out / "sandpod-base", "latest")
    layer = json.loads(manifest)["layers"][0]["digest"].removeprefix("sha256:")
    blob = out / "sandpod-base" / "blobs" / "sha256" / layer
    data = blob.read_bytes()
    blob.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    target = f"{registry.host}/tampered"
    with pytest.raises(MakeImagesFailed, match=r"\[image.digest_mismatch\]"):
        push_images([out / "sandpod-base"], target, "latest", auth_file=creds)
    store = ImageStore(tmp_path / "pulled", auth_file=load_auth_file(creds))
    with pytest.raises(ImageNotFound):
        asyncio.run(store.pull(f"{target}/sandpod-base:latest"))
