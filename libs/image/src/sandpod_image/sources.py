"""Where an image comes from: a registry, an OCI image layout directory, a ``docker save`` tarball.

The store pulls from any of them the same way: :meth:`ImageSource.resolve` gives the image's
manifest for a platform (its bytes verified against their digest), :meth:`ImageSource.fetch`
writes one blob to the store through a :class:`~sandpod_image.blobs.BlobWriter`, so offline
blobs are verified exactly like downloaded ones. :func:`open_source` maps a reference string to
its source: ``oci:/path[:tag]``, ``docker-archive:/path.tar[:name:tag]``, anything else a
registry reference.

A ``docker save`` tarball has no registry manifest: one is made here (an OCI manifest whose layer
digests are the layer files' own, i.e. their diff_ids in the classic format, the blob names in the
format Docker 25 writes), so the image gets a stable digest and pushes like any other.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final, Protocol

from sandpod_contract.errors import ImageError, ImageNotFound, ImageUnsupported
from sandpod_image.auth import AuthConfig
from sandpod_image.blobs import CHUNK, BlobWriter, digest_bytes, hex_of, verify_bytes
from sandpod_image.manifest import (
    OCI_CONFIG,
    OCI_MANIFEST,
    Descriptor,
    Index,
    Manifest,
    Platform,
    manifest_json,
    parse_config,
    parse_manifest,
    select_platform,
)
from sandpod_image.reference import Reference, parse_reference
from sandpod_image.registry import Registry

__all__ = [
    "DockerArchiveSource",
    "ImageSource",
    "OciLayoutSource",
    "RegistrySource",
    "Resolution",
    "open_source",
    "source_key",
]

_REF_NAME: Final = "org.opencontainers.image.ref.name"
_OCI_LAYER_TAR: Final = "application/vnd.oci.image.layer.v1.tar"
Progress = Callable[[int], None]


@dataclass(frozen=True, slots=True)
class Resolution:
    """A reference resolved to one platform's manifest."""

    manifest: Manifest
    body: bytes  # the manifest's bytes, as its digest covers them
    digest: str
    index_digest: str | None = None


class ImageSource(Protocol):
    """What the store pulls from."""

    label: str

    async def resolve(self, platform: Platform) -> Resolution: ...

    async def fetch(
        self, desc: Descriptor, dest: Path, *, tmp_dir: Path, progress: Progress | None
    ) -> None: ...

    async def aclose(self) -> None: ...


def source_key(text: str) -> str:
    """The canonical form of a reference string: the store's record key."""
    kind, _, rest = text.partition(":")
    if kind in ("oci", "docker-archive") and rest:
        path, tag = _split_path_tag(rest)
        return f"{kind}:{Path(path).resolve()}" + (f":{tag}" if tag else "")
    return str(parse_reference(text))


def open_source(
    text: str, *, auth: AuthConfig | None, insecure: bool = False, transport: Any = None
) -> ImageSource:
    """The source a reference string names (see the module docstring)."""
    kind, _, rest = text.partition(":")
    if kind in ("oci", "docker-archive") and rest:
        path, tag = _split_path_tag(rest)
        if kind == "oci":
            return OciLayoutSource(Path(path), tag)
        return DockerArchiveSource(Path(path), tag)
    ref = parse_reference(text)
    registry = Registry(ref.api_host, auth=auth, insecure=insecure, transport=transport)
    return RegistrySource(ref, registry)


def _split_path_tag(rest: str) -> tuple[str, str | None]:
    if Path(rest).exists():
        return rest, None
    path, sep, tag = rest.partition(":")
    return (path, tag) if sep and tag else (rest, None)


class RegistrySource:
    """An image in a registry (tag or digest; an index is narrowed to one platform)."""

    def __init__(self, ref: Reference, registry: Registry) -> None:
        self.ref = ref
        self.registry = registry
        self.label = str(ref)

    async def resolve(self, platform: Platform) -> Resolution:
        repo = self.ref.repository
        body, ctype, digest = await self.registry.get_manifest(repo, self.ref.target)
        doc = parse_manifest(body, ctype)
        if isinstance(doc, Manifest):
            return Resolution(doc, body, digest)
        entry = select_platform(doc, platform, self.label)
        inner, ctype, inner_digest = await self.registry.get_manifest(repo, entry.digest)
        manifest = parse_manifest(inner, ctype)
        if not isinstance(manifest, Manifest):
            raise ImageUnsupported(f"{self.label}: an index inside an index is not supported")
        return Resolution(manifest, inner, inner_digest, index_digest=digest)

    async def fetch(
        self, desc: Descriptor, dest: Path, *, tmp_dir: Path, progress: Progress | None
    ) -> None:
        await self.registry.fetch_blob(
            self.ref.repository,
            desc.digest,
            dest,
            tmp_dir=tmp_dir,
            size=desc.size,
            progress=progress,
        )

    async def aclose(self) -> None:
        await self.registry.aclose()


def _copy(
    src: IO[bytes], desc: Descriptor, dest: Path, tmp: Path, progress: Progress | None
) -> None:
    with BlobWriter(tmp, desc.digest, desc.size) as out:
        while chunk := src.read(CHUNK):
            out.write(chunk)
            if progress is not None:
                progress(out.count)
        out.commit(dest)


class OciLayoutSource:
    """An OCI image layout directory (``oci-layout``, ``index.json``, ``blobs/sha256/...``)."""

    def __init__(self, root: Path, tag: str | None) -> None:
        self.root = root
        self.tag = tag
        self.label = f"oci:{root}" + (f":{tag}" if tag else "")

    def _read(self, digest: str, limit: int = 4 << 20) -> bytes:
        path = self.root / "blobs" / "sha256" / hex_of(digest)
        try:
            with path.open("rb") as f:
                data = f.read(limit + 1)
        except OSError as exc:
            raise ImageNotFound(f"{self.label}: no blob {digest}", reference=self.label) from exc
        verify_bytes(data, digest, what=f"{self.label} blob")
        return data

    def _resolve(self, platform: Platform) -> Resolution:
        try:
            index_body = (self.root / "index.json").read_bytes()
        except OSError as exc:
            raise ImageNotFound(
                f"{self.root} is not an OCI image layout (no index.json)", reference=self.label
            ) from exc
        index = parse_manifest(index_body)
        if not isinstance(index, Index):
            raise ImageUnsupported(f"{self.label}: index.json is not an OCI index")
        entries = [
            e for e in index.manifests if self.tag is None or e.annotation(_REF_NAME) == self.tag
        ]
        if len(entries) != 1:
            names = sorted({e.annotation(_REF_NAME) or "(untagged)" for e in index.manifests})
            raise ImageNotFound(
                f"{self.label}: {len(entries)} images match; name one of: {', '.join(names)}",
                reference=self.label,
            )
        body = self._read(entries[0].digest)
        doc = parse_manifest(body, entries[0].media_type)
        if isinstance(doc, Manifest):
            return Resolution(doc, body, entries[0].digest)
        entry = select_platform(doc, platform, self.label)
        inner = self._read(entry.digest)
        manifest = parse_manifest(inner, entry.media_type)
        if not isinstance(manifest, Manifest):
            raise ImageUnsupported(f"{self.label}: an index inside an index is not supported")
        return Resolution(manifest, inner, entry.digest, index_digest=entries[0].digest)

    async def resolve(self, platform: Platform) -> Resolution:
        return await asyncio.to_thread(self._resolve, platform)

    def _fetch(self, desc: Descriptor, dest: Path, tmp: Path, progress: Progress | None) -> None:
        path = self.root / "blobs" / "sha256" / hex_of(desc.digest)
        try:
            src = path.open("rb")
        except OSError as exc:
            raise ImageNotFound(
                f"{self.label}: no blob {desc.digest}", reference=self.label
            ) from exc
        with src:
            _copy(src, desc, dest, tmp, progress)

    async def fetch(
        self, desc: Descriptor, dest: Path, *, tmp_dir: Path, progress: Progress | None
    ) -> None:
        await asyncio.to_thread(self._fetch, desc, dest, tmp_dir, progress)

    async def aclose(self) -> None:
        return None


def _follow(tar: tarfile.TarFile, name: str) -> tarfile.TarInfo:
    """The member ``name`` names, through the symlinks ``docker save`` writes for shared layers."""
    for _ in range(8):
        try:
            member = tar.getmember(name)
        except KeyError as exc:
            raise ImageUnsupported(f"the docker save tarball has no file {name!r}") from exc
        if not member.issym():
            return member
        name = posixpath.normpath(posixpath.join(posixpath.dirname(name), member.linkname))
    raise ImageUnsupported(f"the docker save tarball's {name!r} is a symlink loop")


class DockerArchiveSource:
    """A ``docker save`` tarball: ``manifest.json`` + config + layer tars (both formats)."""

    def __init__(self, path: Path, tag: str | None) -> None:
        self.path = path
        self.tag = tag
        self.label = f"docker-archive:{path}" + (f":{tag}" if tag else "")
        self._members: dict[str, str] = {}  # layer digest -> member name

    def _open(self) -> tarfile.TarFile:
        try:
            return tarfile.open(self.path, "r:*")
        except (OSError, tarfile.TarError) as exc:
            raise ImageNotFound(
                f"{self.path} is not a readable docker save tarball: {exc}", reference=self.label
            ) from exc

    @staticmethod
    def _member(tar: tarfile.TarFile, name: str, limit: int | None = None) -> bytes:
        try:
            f = tar.extractfile(name)
        except KeyError:
            f = None
        if f is None:
            raise ImageUnsupported(f"the docker save tarball has no file {name!r}")
        with f:
            return f.read() if limit is None else f.read(limit)

    def _entry(self, tar: tarfile.TarFile) -> dict[str, Any]:
        try:
            doc = json.loads(self._member(tar, "manifest.json", 4 << 20))
        except ValueError as exc:
            raise ImageUnsupported(f"{self.label}: manifest.json is not JSON") from exc
        if not isinstance(doc, list) or not all(isinstance(e, dict) for e in doc):
            raise ImageUnsupported(f"{self.label}: manifest.json is not a list of images")
        matches = [
            e
            for e in doc
            if self.tag is None
            or any(t == self.tag or t.endswith(f"/{self.tag}") for t in e.get("RepoTags") or [])
        ]
        if len(matches) != 1:
            tags = sorted(t for e in doc for t in (e.get("RepoTags") or []))
            raise ImageNotFound(
                f"{self.label}: {len(matches)} images match; name one of: {', '.join(tags)}",
                reference=self.label,
            )
        entry: dict[str, Any] = matches[0]
        return entry

    def _resolve(self) -> Resolution:
        with self._open() as tar:
            entry = self._entry(tar)
            config_name, layer_names = entry.get("Config"), entry.get("Layers")
            if not isinstance(config_name, str) or not isinstance(layer_names, list):
                raise ImageUnsupported(f"{self.label}: manifest.json lacks Config or Layers")
            config_body = self._member(tar, config_name, 4 << 20)
            diff_ids = parse_config(config_body).diff_ids
            if len(diff_ids) != len(layer_names):
                raise ImageUnsupported(f"{self.label}: the config lists other layers")
            layers = []
            for name, diff_id in zip(layer_names, diff_ids, strict=True):
                # Docker 25+ names a layer by its blob digest; older ones by directory.
                digest = (
                    f"sha256:{name.rsplit('/', 1)[-1]}" if name.startswith("blobs/") else diff_id
                )
                member = _follow(tar, name)
                self._members[digest] = name
                layers.append(Descriptor(_OCI_LAYER_TAR, digest, member.size))
            self._members[digest_bytes(config_body)] = config_name
        config = Descriptor(OCI_CONFIG, digest_bytes(config_body), len(config_body))
        manifest = Manifest(OCI_MANIFEST, config, tuple(layers))
        body = manifest_json(manifest)
        return Resolution(manifest, body, digest_bytes(body))

    async def resolve(self, platform: Platform) -> Resolution:
        return await asyncio.to_thread(self._resolve)

    def _fetch(self, desc: Descriptor, dest: Path, tmp: Path, progress: Progress | None) -> None:
        name = self._members.get(desc.digest)
        if name is None:
            raise ImageError(f"{self.label}: blob {desc.digest} is not in the tarball")
        with self._open() as tar:
            f = tar.extractfile(name)
            if f is None:
                raise ImageUnsupported(f"{self.label}: {name} is not a file")
            with f:
                _copy(f, desc, dest, tmp, progress)

    async def fetch(
        self, desc: Descriptor, dest: Path, *, tmp_dir: Path, progress: Progress | None
    ) -> None:
        await asyncio.to_thread(self._fetch, desc, dest, tmp_dir, progress)

    async def aclose(self) -> None:
        return None
