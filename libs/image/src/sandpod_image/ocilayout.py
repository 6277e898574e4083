"""Writes OCI image layout directories: what template builds and ``make images`` produce.

An OCI image layout (image-spec ``image-layout.md``) is ``oci-layout`` + ``index.json`` +
``blobs/sha256/<hex>``; ``skopeo``, ``umoci``, containerd and registries (``skopeo copy
oci:dir:tag docker://...``) all read it. ``OciLayout`` packs layers straight into the blob
directory (``add_layer``, through ``layers.pack_layer``) or takes blobs packed elsewhere
(``add_blob``), then ``write_image`` writes the config, the manifest and the index entry named
by the ``org.opencontainers.image.ref.name`` annotation (an entry of the same name is replaced,
others are kept, so one layout can hold several tags).

Every JSON document is written with sorted keys and no spaces, so equal inputs give equal
digests (reproducible images when the layers are packed with a fixed mtime).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Final

from sandpod_image.layers import PackResult, compress_tar, pack_layer
from sandpod_image.manifest import OCI_CONFIG, OCI_INDEX, OCI_MANIFEST

__all__ = [
    "MEDIA_TYPE_CONFIG",
    "MEDIA_TYPE_INDEX",
    "MEDIA_TYPE_MANIFEST",
    "REF_NAME",
    "Descriptor",
    "HistoryEntry",
    "ImageConfig",
    "OciLayout",
]

# One spelling of each media type: the ones the pull side reads (sandpod_image.manifest).
MEDIA_TYPE_CONFIG: Final = OCI_CONFIG
MEDIA_TYPE_MANIFEST: Final = OCI_MANIFEST
MEDIA_TYPE_INDEX: Final = OCI_INDEX
REF_NAME: Final = "org.opencontainers.image.ref.name"


@dataclass(frozen=True, slots=True)
class Descriptor:
    """A content descriptor: what a manifest or index points at."""

    media_type: str
    digest: str
    size: int

    def to_json(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One ``history`` line of the config; ``empty_layer`` for steps that made no layer."""

    created_by: str
    created: str | None = None
    comment: str | None = None
    empty_layer: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"created_by": self.created_by}
        if self.created is not None:
            out["created"] = self.created
        if self.comment is not None:
            out["comment"] = self.comment
        if self.empty_layer:
            out["empty_layer"] = True
        return out


@dataclass(frozen=True, slots=True)
class ImageConfig:
    """The runtime part of an image config (``config`` in image-spec ``config.md``).

    Attributes:
        env: ``NAME=value`` lines.
        working_dir: the default cwd ('' for the runtime's default, ``/``).
        user: ``user``, ``uid``, ``user:group`` or ``uid:gid`` ('' for root).
        entrypoint, cmd: argv lists; None leaves the field out.
        labels: ``config.Labels``.
        architecture, os: the platform (GOARCH/GOOS spelling).
        created: RFC 3339 time, or None for a reproducible config.
    """

    env: tuple[str, ...] = ()
    working_dir: str = ""
    user: str = ""
    entrypoint: tuple[str, ...] | None = None
    cmd: tuple[str, ...] | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    architecture: str = "amd64"
    os: str = "linux"
    created: str | None = None

    def to_json(self, diff_ids: Sequence[str], history: Sequence[HistoryEntry]) -> dict[str, Any]:
        runtime: dict[str, Any] = {}
        if self.env:
            runtime["Env"] = list(self.env)
        if self.working_dir:
            runtime["WorkingDir"] = self.working_dir
        if self.user:
            runtime["User"] = self.user
        if self.entrypoint is not None:
            runtime["Entrypoint"] = list(self.entrypoint)
        if self.cmd is not None:
            runtime["Cmd"] = list(self.cmd)
        if self.labels:
            runtime["Labels"] = dict(self.labels)
        out: dict[str, Any] = {
            "architecture": self.architecture,
            "os": self.os,
            "config": runtime,
            "rootfs": {"type": "layers", "diff_ids": list(diff_ids)},
            "history": [h.to_json() for h in history],
        }
        if self.created is not None:
            out["created"] = self.created
        return out


def _canonical(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


class OciLayout:
    """An OCI image layout directory being written (created if missing)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.blobs = root / "blobs" / "sha256"
        self.blobs.mkdir(parents=True, exist_ok=True)
        marker = root / "oci-layout"
        if not marker.exists():
            marker.write_bytes(_canonical({"imageLayoutVersion": "1.0.0"}))
        self._layers: list[tuple[Descriptor, str, HistoryEntry]] = []

    def add_layer(
        self,
        src: Path,
        *,
        created_by: str,
        compress: str = "gzip",
        mtime: int | None = None,
        owner: tuple[int, int] | None = None,
    ) -> PackResult:
        """Pack the directory ``src`` into a layer blob of this layout and append it.

        Raises:
            ImageUnsupported: unknown ``compress``.
        """
        return self._blob_from(
            lambda out: pack_layer(src, out, compress=compress, mtime=mtime, owner=owner),
            created_by,
        )

    def add_tar(self, tar: Path, *, created_by: str, compress: str = "gzip") -> PackResult:
        """Compress the layer tarball ``tar`` into a blob of this layout and append it."""
        with tar.open("rb") as src:
            return self._blob_from(
                lambda out: compress_tar(src, out, compress=compress), created_by
            )

    def _blob_from(self, write: Callable[[BinaryIO], PackResult], created_by: str) -> PackResult:
        fd, tmp = tempfile.mkstemp(dir=self.blobs, prefix=".layer-")
        try:
            with os.fdopen(fd, "wb") as out:
                packed = write(out)
            os.replace(tmp, self.blobs / packed.digest.removeprefix("sha256:"))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.append(packed, HistoryEntry(created_by=created_by))
        return packed

    def adopt(self, blob: Path, packed: PackResult, history: HistoryEntry) -> None:
        """Append a layer blob of another layout (hard-linked when on the same filesystem)."""
        target = self.blobs / packed.digest.removeprefix("sha256:")
        if not target.exists():
            try:
                os.link(blob, target)
            except OSError:
                shutil.copyfile(blob, target)
        self.append(packed, history)

    def append(self, packed: PackResult, history: HistoryEntry) -> None:
        """Append a layer whose blob is already in ``blobs/`` (``add_blob`` or ``add_layer``)."""
        descriptor = Descriptor(packed.media_type, packed.digest, packed.size)
        self._layers.append((descriptor, packed.diff_id, history))

    def add_blob(self, data: bytes, media_type: str) -> Descriptor:
        """Store ``data`` as a blob; returns its descriptor."""
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        path = self.blobs / digest.removeprefix("sha256:")
        if not path.exists():
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        return Descriptor(media_type, digest, len(data))

    def write_image(
        self,
        config: ImageConfig,
        *,
        ref: str,
        extra_history: Sequence[HistoryEntry] = (),
        annotations: Mapping[str, str] | None = None,
    ) -> Descriptor:
        """Write the config and manifest of the layers appended so far, tagged ``ref``.

        Args:
            config: the runtime config.
            ref: the index's ref name (the ``tag`` of ``oci:<dir>:<tag>``).
            extra_history: history of steps without a layer (``ENV``, ``USER``...).
            annotations: manifest annotations.

        Returns:
            The manifest's descriptor.
        """
        history = [h for _, _, h in self._layers] + list(extra_history)
        diff_ids = [d for _, d, _ in self._layers]
        config_desc = self.add_blob(
            _canonical(config.to_json(diff_ids, history)), MEDIA_TYPE_CONFIG
        )
        manifest: dict[str, Any] = {
            "schemaVersion": 2,
            "mediaType": MEDIA_TYPE_MANIFEST,
            "config": config_desc.to_json(),
            "layers": [desc.to_json() for desc, _, _ in self._layers],
        }
        if annotations:
            manifest["annotations"] = dict(annotations)
        manifest_desc = self.add_blob(_canonical(manifest), MEDIA_TYPE_MANIFEST)
        self._index(manifest_desc, ref, config)
        return manifest_desc

    def _index(self, manifest: Descriptor, ref: str, config: ImageConfig) -> None:
        path = self.root / "index.json"
        entries: list[dict[str, Any]] = []
        if path.exists():
            old = json.loads(path.read_bytes())
            entries = [
                m for m in old.get("manifests", []) if m.get("annotations", {}).get(REF_NAME) != ref
            ]
        entry = manifest.to_json()
        entry["annotations"] = {REF_NAME: ref}
        entry["platform"] = {"architecture": config.architecture, "os": config.os}
        entries.append(entry)
        index = {"schemaVersion": 2, "mediaType": MEDIA_TYPE_INDEX, "manifests": entries}
        tmp = path.with_name(".index.json.tmp")
        tmp.write_bytes(_canonical(index))
        os.replace(tmp, path)
