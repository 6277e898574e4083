"""OCI and Docker v2 manifests, indexes, platforms and image configs, as typed values.

Registries serve four JSON documents for an image: an OCI index or a Docker manifest list (one
entry per platform), and an OCI or Docker v2 image manifest (a config blob and the layer blobs,
bottom first). :func:`parse_manifest` turns the bytes into an :class:`Index` or a
:class:`Manifest`; :func:`select_platform` picks one entry of an index; :func:`parse_config`
reads the parts of the config blob a sandbox honours (:class:`ImageConfig`). Raw dicts stay in
this module; anything else it does not understand (schema 1 manifests, artifact manifests)
raises ``image.unsupported``.
"""

from __future__ import annotations

import json
import platform as _platform
from dataclasses import dataclass, field
from typing import Any, Final

from sandpod_contract.errors import ImageNotFound, ImageUnsupported
from sandpod_image.blobs import hex_of

__all__ = [
    "ACCEPT",
    "CONFIG_TYPES",
    "DOCKER_CONFIG",
    "DOCKER_LAYER",
    "DOCKER_LIST",
    "DOCKER_MANIFEST",
    "INDEX_TYPES",
    "LAYER_TYPES",
    "MANIFEST_TYPES",
    "OCI_CONFIG",
    "OCI_INDEX",
    "OCI_MANIFEST",
    "Descriptor",
    "ImageConfig",
    "Index",
    "Manifest",
    "Platform",
    "host_platform",
    "manifest_json",
    "parse_config",
    "parse_manifest",
    "select_platform",
]

OCI_INDEX: Final = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST: Final = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG: Final = "application/vnd.oci.image.config.v1+json"
DOCKER_LIST: Final = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST: Final = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG: Final = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER: Final = "application/vnd.docker.image.rootfs.diff.tar.gzip"
INDEX_TYPES: Final = frozenset({OCI_INDEX, DOCKER_LIST})
MANIFEST_TYPES: Final = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})
CONFIG_TYPES: Final = frozenset({OCI_CONFIG, DOCKER_CONFIG})
LAYER_TYPES: Final = frozenset(
    {
        "application/vnd.oci.image.layer.v1.tar",
        "application/vnd.oci.image.layer.v1.tar+gzip",
        "application/vnd.oci.image.layer.v1.tar+zstd",
        DOCKER_LAYER,
    }
)
ACCEPT: Final = ", ".join((OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST))

# The CPU names Python reports -> OCI's (GOARCH) names.
_ARCH: Final = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
# A platform without a variant means the architecture's usual one.
_DEFAULT_VARIANT: Final = {"arm64": "v8", "arm": "v7"}


@dataclass(frozen=True, slots=True)
class Platform:
    """``os/architecture[/variant]``, e.g. ``linux/arm64/v8``."""

    os: str = "linux"
    architecture: str = "amd64"
    variant: str | None = None

    @classmethod
    def parse(cls, text: str) -> Platform:
        """``linux/amd64`` or ``linux/arm/v7``; raises ImageUnsupported for anything else."""
        parts = text.split("/")
        if len(parts) not in (2, 3) or not all(parts):
            raise ImageUnsupported(f"platform {text!r} is not os/arch[/variant]")
        return cls(parts[0], parts[1], parts[2] if len(parts) == 3 else None)

    def matches(self, other: Platform) -> bool:
        """Whether an index entry for ``other`` runs here (variants defaulted per arch)."""
        if (self.os, self.architecture) != (other.os, other.architecture):
            return False
        mine = self.variant or _DEFAULT_VARIANT.get(self.architecture)
        theirs = other.variant or _DEFAULT_VARIANT.get(other.architecture)
        return mine is None or theirs is None or mine == theirs

    def __str__(self) -> str:
        return "/".join(p for p in (self.os, self.architecture, self.variant) if p)


def host_platform() -> Platform:
    """This machine's platform (``linux/amd64`` unless the CPU says otherwise)."""
    machine = _platform.machine().lower()
    return Platform("linux", _ARCH.get(machine, machine or "amd64"))


@dataclass(frozen=True, slots=True)
class Descriptor:
    """A pointer to a blob: its media type, digest and size (and platform in an index)."""

    media_type: str
    digest: str
    size: int
    platform: Platform | None = None
    annotations: tuple[tuple[str, str], ...] = ()

    def annotation(self, key: str) -> str | None:
        return dict(self.annotations).get(key)


@dataclass(frozen=True, slots=True)
class Manifest:
    """An image manifest: the config blob and the layers, bottom first."""

    media_type: str
    config: Descriptor
    layers: tuple[Descriptor, ...]


@dataclass(frozen=True, slots=True)
class Index:
    """An OCI index or Docker manifest list: one manifest per platform."""

    media_type: str
    manifests: tuple[Descriptor, ...]


@dataclass(frozen=True, slots=True)
class ImageConfig:
    """What a sandbox honours from the image config (the rest stays in the config blob).

    Attributes:
        env: ``Env`` as (name, value) pairs, in order.
        workdir: ``WorkingDir``, or None.
        user: ``User`` (``name``, ``uid``, ``uid:gid``...), or None.
        entrypoint: ``Entrypoint``.
        cmd: ``Cmd``.
        labels: ``Labels``.
        exposed_ports: ``ExposedPorts`` keys (``80/tcp``).
        stop_signal: ``StopSignal``, or None.
        os: the config's ``os``.
        architecture: the config's ``architecture``.
        diff_ids: ``rootfs.diff_ids``, bottom first (the uncompressed layers' digests).
    """

    env: tuple[tuple[str, str], ...] = ()
    workdir: str | None = None
    user: str | None = None
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    exposed_ports: tuple[str, ...] = ()
    stop_signal: str | None = None
    os: str = "linux"
    architecture: str = "amd64"
    diff_ids: tuple[str, ...] = field(default=())


def parse_manifest(body: bytes, content_type: str | None = None) -> Manifest | Index:
    """Parse a manifest or index; the body's ``mediaType`` wins over the HTTP header.

    Raises:
        ImageUnsupported: not JSON, schema 1, or a media type that is not an image's.
    """
    doc = _json(body, "manifest")
    media_type = doc.get("mediaType") or (content_type or "").split(";")[0].strip()
    if not media_type:
        # An OCI document may omit mediaType; its shape says which it is.
        media_type = OCI_INDEX if "manifests" in doc else OCI_MANIFEST
    if media_type in INDEX_TYPES:
        return Index(media_type, tuple(_descriptor(d) for d in _list(doc, "manifests")))
    if media_type in MANIFEST_TYPES:
        layers = tuple(_descriptor(d) for d in _list(doc, "layers"))
        for layer in layers:
            if layer.media_type not in LAYER_TYPES:
                raise ImageUnsupported(
                    f"layer media type {layer.media_type} is not supported",
                    media_type=layer.media_type,
                )
        return Manifest(media_type, _descriptor(doc.get("config")), layers)
    raise ImageUnsupported(
        f"manifest media type {media_type or '(none)'} is not an image Sandpod can run "
        "(schema 1 manifests are not supported: push the image again with a current tool)",
        media_type=media_type or None,
    )


def select_platform(index: Index, wanted: Platform, reference: str) -> Descriptor:
    """The index entry for ``wanted``.

    Raises:
        ImageNotFound: no entry for that platform (the message lists the ones there are).
    """
    for entry in index.manifests:
        if entry.platform is not None and wanted.matches(entry.platform):
            return entry
    offered = ", ".join(str(e.platform) for e in index.manifests if e.platform) or "none"
    raise ImageNotFound(
        f"{reference} has no image for {wanted} (it has: {offered}); pass --platform",
        reference=reference,
        platform=str(wanted),
    )


def parse_config(body: bytes) -> ImageConfig:
    """Read an image config blob (OCI or Docker; the same fields)."""
    doc = _json(body, "image config")
    conf = doc.get("config") or {}
    if not isinstance(conf, dict):
        raise ImageUnsupported("the image config's 'config' is not an object")
    env = []
    for item in _strings(conf.get("Env")):
        name, _, value = item.partition("=")
        env.append((name, value))
    rootfs = doc.get("rootfs") or {}
    return ImageConfig(
        env=tuple(env),
        workdir=conf.get("WorkingDir") or None,
        user=conf.get("User") or None,
        entrypoint=_strings(conf.get("Entrypoint")),
        cmd=_strings(conf.get("Cmd")),
        labels=tuple(sorted((str(k), str(v)) for k, v in (conf.get("Labels") or {}).items())),
        exposed_ports=tuple(sorted(str(k) for k in (conf.get("ExposedPorts") or {}))),
        stop_signal=conf.get("StopSignal") or None,
        os=str(doc.get("os") or "linux"),
        architecture=str(doc.get("architecture") or "amd64"),
        diff_ids=_strings(rootfs.get("diff_ids") if isinstance(rootfs, dict) else None),
    )


def manifest_json(manifest: Manifest) -> bytes:
    """An OCI manifest's canonical bytes (for images made here: docker-archive imports, builds)."""
    doc = {
        "schemaVersion": 2,
        "mediaType": manifest.media_type,
        "config": _descriptor_json(manifest.config),
        "layers": [_descriptor_json(d) for d in manifest.layers],
    }
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def _descriptor_json(d: Descriptor) -> dict[str, Any]:
    return {"mediaType": d.media_type, "digest": d.digest, "size": d.size}


def _json(body: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ImageUnsupported(f"the {what} is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ImageUnsupported(f"the {what} is not a JSON object")
    return doc


def _list(doc: dict[str, Any], key: str) -> list[Any]:
    value = doc.get(key)
    if not isinstance(value, list):
        raise ImageUnsupported(f"the manifest's {key!r} is not a list")
    return value


def _descriptor(raw: Any) -> Descriptor:
    if not isinstance(raw, dict):
        raise ImageUnsupported("a manifest descriptor is not an object")
    digest, size, media_type = raw.get("digest"), raw.get("size"), raw.get("mediaType")
    if not isinstance(digest, str):
        raise ImageUnsupported(f"descriptor digest {digest!r} is not sha256:<hex>")
    hex_of(digest)  # a digest becomes a file name in the store: 64 hex digits or nothing
    if not isinstance(size, int) or size < 0:
        raise ImageUnsupported(f"descriptor {digest} has no valid size")
    plat = raw.get("platform")
    annotations = raw.get("annotations") or {}
    return Descriptor(
        media_type=str(media_type or ""),
        digest=digest,
        size=size,
        platform=_platform_of(plat) if isinstance(plat, dict) else None,
        annotations=tuple(sorted((str(k), str(v)) for k, v in annotations.items())),
    )


def _platform_of(raw: dict[str, Any]) -> Platform:
    return Platform(
        str(raw.get("os", "")), str(raw.get("architecture", "")), raw.get("variant") or None
    )


def _strings(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        return tuple(str(v) for v in value)
    raise ImageUnsupported(f"expected a list of strings in the image config, got {value!r}")
