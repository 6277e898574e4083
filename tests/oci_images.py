"""Images the tests build themselves: layers made with ``tarfile``, configs and manifests by hand.

:func:`build_image` makes an OCI (or Docker v2) image from a list of layers (each a mapping of
path -> bytes), :func:`build_index` a multi-platform index over some images; :func:`push_image`
and :func:`push_index` send them to a registry through ``sandpod_image.registry`` (the push code
under test); :func:`write_oci_layout` and :func:`write_docker_save` write the offline forms.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandpod_image.manifest import DOCKER_CONFIG, DOCKER_LAYER, DOCKER_MANIFEST, OCI_INDEX
from sandpod_image.registry import Registry

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def layer_tar(files: dict[str, bytes], *, mtime: int = 1_700_000_000) -> bytes:
    """An uncompressed layer tar with these regular files (parent dirs added)."""
    buf = io.BytesIO()
    dirs: set[str] = set()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(files):
            parts = name.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, mtime
                    tar.addfile(info)
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(files[name]), 0o644, mtime
            tar.addfile(info, io.BytesIO(files[name]))
    return buf.getvalue()


@dataclass
class BuiltImage:
    """An image's documents and blobs (digest -> bytes)."""

    manifest: bytes
    media_type: str
    config: bytes
    layer_tars: list[bytes]
    blobs: dict[str, bytes] = field(default_factory=dict)
    layer_digests: list[str] = field(default_factory=list)

    @property
    def digest(self) -> str:
        return sha(self.manifest)

    @property
    def diff_ids(self) -> list[str]:
        return [sha(t) for t in self.layer_tars]


def build_image(
    layers: list[dict[str, bytes]],
    *,
    config: dict[str, Any] | None = None,
    arch: str = "amd64",
    docker: bool = False,
    compress: bool = True,
) -> BuiltImage:
    """An image of these layers (bottom first); ``config``: the config's ``config`` part."""
    return image_of_tars(
        [layer_tar(files) for files in layers],
        config=config,
        arch=arch,
        docker=docker,
        compress=compress,
    )


def image_of_tars(
    tars: list[bytes],
    *,
    config: dict[str, Any] | None = None,
    arch: str = "amd64",
    docker: bool = False,
    compress: bool = True,
) -> BuiltImage:
    """An image of these uncompressed layer tars (bottom first), like :func:`build_image`."""
    blobs = [gzip.compress(t, mtime=0) if compress else t for t in tars]
    cfg = {
        "architecture": arch,
        "os": "linux",
        "config": config or {"Env": ["PATH=/usr/bin:/bin"], "Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": [sha(t) for t in tars]},
    }
    config_bytes = json.dumps(cfg).encode()
    layer_type = DOCKER_LAYER if docker else OCI_LAYER_GZIP
    if not compress:
        layer_type = "application/vnd.oci.image.layer.v1.tar"
    doc = {
        "schemaVersion": 2,
        "mediaType": DOCKER_MANIFEST if docker else OCI_MANIFEST,
        "config": {
            "mediaType": DOCKER_CONFIG if docker else OCI_CONFIG,
            "digest": sha(config_bytes),
            "size": len(config_bytes),
        },
        "layers": [{"mediaType": layer_type, "digest": sha(b), "size": len(b)} for b in blobs],
    }
    image = BuiltImage(
        manifest=json.dumps(doc).encode(),
        media_type=str(doc["mediaType"]),
        config=config_bytes,
        layer_tars=tars,
    )
    image.blobs = {sha(config_bytes): config_bytes, **{sha(b): b for b in blobs}}
    image.layer_digests = [sha(b) for b in blobs]
    return image


def base_image(tag: str = "v1") -> BuiltImage:
    """Two layers: a base every call shares and an app layer holding ``tag``; a full config."""
    config = {
        "Env": ["PATH=/bin", "A=b=c"],
        "WorkingDir": "/app",
        "User": "1000:1000",
        "Entrypoint": ["python3"],
        "Cmd": ["main.py"],
    }
    base = {"etc/os-release": b"ID=test\n", "bin/tool": b"#!/bin/sh\n"}
    return build_image([base, {"app/main.py": tag.encode()}], config=config)


def build_index(images: list[tuple[BuiltImage, str, str | None]]) -> bytes:
    """An OCI index over (image, architecture, variant) entries."""
    entries = []
    for image, arch, variant in images:
        platform: dict[str, str] = {"os": "linux", "architecture": arch}
        if variant:
            platform["variant"] = variant
        entries.append(
            {
                "mediaType": image.media_type,
                "digest": image.digest,
                "size": len(image.manifest),
                "platform": platform,
            }
        )
    return json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}).encode()


async def push_image(registry: Registry, repo: str, tag: str, image: BuiltImage, tmp: Path) -> str:
    """Push an image's blobs and manifest (under ``tag``); returns the manifest digest."""
    tmp.mkdir(parents=True, exist_ok=True)
    for digest, data in image.blobs.items():
        path = tmp / digest.removeprefix("sha256:")
        path.write_bytes(data)
        await registry.push_blob(repo, digest, path)
    return await registry.put_manifest(repo, tag, image.manifest, image.media_type)


async def push_index(
    registry: Registry,
    repo: str,
    tag: str,
    images: list[tuple[BuiltImage, str, str | None]],
    tmp: Path,
) -> str:
    """Push each image by digest, then an index over them under ``tag``."""
    for image, _, _ in images:
        await push_image(registry, repo, image.digest, image, tmp)
    return await registry.put_manifest(repo, tag, build_index(images), OCI_INDEX)


def write_oci_layout(root: Path, image: BuiltImage, tag: str) -> None:
    """An OCI image layout directory holding ``image`` as ``tag``."""
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    for digest, data in {**image.blobs, image.digest: image.manifest}.items():
        (blobs / digest.removeprefix("sha256:")).write_bytes(data)
    (root / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    entry = {
        "mediaType": image.media_type,
        "digest": image.digest,
        "size": len(image.manifest),
        "annotations": {"org.opencontainers.image.ref.name": tag},
    }
    (root / "index.json").write_text(
        json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [entry]})
    )


def write_docker_save(path: Path, image: BuiltImage, repo_tag: str, *, new_format: bool) -> None:
    """A ``docker save`` tarball: classic (``<id>/layer.tar``) or Docker 25's (``blobs/``)."""
    config_hex = sha(image.config).removeprefix("sha256:")
    members: dict[str, bytes] = {}
    if new_format:
        config_name = f"blobs/sha256/{config_hex}"
        layer_names = [f"blobs/sha256/{sha(t).removeprefix('sha256:')}" for t in image.layer_tars]
    else:
        config_name = f"{config_hex}.json"
        layer_names = [f"{sha(t).removeprefix('sha256:')[:12]}/layer.tar" for t in image.layer_tars]
    members[config_name] = image.config
    members.update(zip(layer_names, image.layer_tars, strict=True))
    manifest = [{"Config": config_name, "RepoTags": [repo_tag], "Layers": layer_names}]
    members["manifest.json"] = json.dumps(manifest).encode()
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
