"""Push an image of an OCI image layout to a registry: how a build and ``make images`` publish.

Data flow: ``index.json`` names the image by its ``org.opencontainers.image.ref.name`` (the
``tag`` of ``oci:<dir>:<tag>``) -> the manifest blob is read and parsed -> every blob it names
(config first, then the layers) is hashed from the layout and compared with its digest (a
layout blob that does not match is ``image.digest_mismatch``, and nothing is sent) -> each is
pushed unless the registry has it already (:meth:`Registry.push_blob`: a HEAD, then POST + PUT)
-> the manifest is PUT under the tag (unless the tag names it already), its digest checked
against the layout's.

Progress is one :class:`PushProgress` per blob (``skipped`` when the registry had it), so a
CLI prints lines and a build streams them as events. Credentials come from the caller (an
``AuthFile`` lookup for the target's registry), plain HTTP only for loopback or ``insecure``
hosts, as every registry access of ``sandpod_image``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandpod_contract.errors import ImageDigestMismatch, ImageError, ImageNotFound
from sandpod_image.auth import AuthFile
from sandpod_image.manifest import OCI_MANIFEST
from sandpod_image.ocilayout import REF_NAME
from sandpod_image.reference import Reference, parse_reference
from sandpod_image.registry import Registry

__all__ = ["PushProgress", "PushedImage", "layout_manifest", "push_layout"]


@dataclass(frozen=True, slots=True)
class PushProgress:
    """One blob of a push: ``kind`` config | layer | manifest, ``skipped`` when present."""

    kind: str
    digest: str
    size: int
    skipped: bool


@dataclass(frozen=True, slots=True)
class PushedImage:
    """Where the image went: ``reference`` is ``registry/repo@sha256:...`` (by digest)."""

    reference: str
    digest: str
    uploaded: int  # blobs sent (not counting the manifest)
    skipped: int  # blobs the registry had


def layout_manifest(layout: Path, tag: str) -> tuple[bytes, str]:
    """The manifest bytes and digest of image ``tag`` in the layout at ``layout``.

    Raises:
        ImageNotFound: no such layout or tag.
        ImageDigestMismatch: the manifest blob does not match its digest.
    """
    try:
        index = json.loads((layout / "index.json").read_bytes())
    except (OSError, ValueError) as exc:
        raise ImageNotFound(
            f"{layout} is not an OCI image layout: {exc}", reference=str(layout)
        ) from exc
    entries = [
        m for m in index.get("manifests") or () if (m.get("annotations") or {}).get(REF_NAME) == tag
    ]
    if not entries:
        raise ImageNotFound(f"the layout {layout} has no image tagged {tag!r}", reference=tag)
    digest = str(entries[0]["digest"])
    body = _blob(layout, digest).read_bytes()
    actual = "sha256:" + hashlib.sha256(body).hexdigest()
    if actual != digest:
        raise ImageDigestMismatch(
            f"{layout}: manifest {digest} does not match its content",
            expected=digest,
            actual=actual,
        )
    return body, digest


def _blob(layout: Path, digest: str) -> Path:
    algo, _, hexdigest = digest.partition(":")
    if algo != "sha256" or len(hexdigest) != 64:
        raise ImageDigestMismatch(
            f"unsupported digest {digest!r} in the layout", expected=digest, actual=digest
        )
    return layout / "blobs" / "sha256" / hexdigest


def _verify(path: Path, digest: str) -> None:
    h = hashlib.sha256()
    try:
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    except FileNotFoundError as exc:
        raise ImageNotFound(f"blob {digest} is missing from the layout", reference=digest) from exc
    actual = "sha256:" + h.hexdigest()
    if actual != digest:
        raise ImageDigestMismatch(
            f"layout blob {digest} does not match its content", expected=digest, actual=actual
        )


async def _tagged(registry: Registry, repository: str, tag: str) -> str | None:
    """The digest ``tag`` names in the registry now (None: no such tag)."""
    try:
        _, _, digest = await registry.get_manifest(repository, tag)
    except ImageNotFound:
        return None
    return digest


async def push_layout(
    layout: Path,
    tag: str,
    target: str,
    *,
    auth_file: AuthFile | None = None,
    insecure: frozenset[str] = frozenset(),
    progress: Callable[[PushProgress], None] | None = None,
    transport: Any = None,
) -> PushedImage:
    """Push image ``tag`` of ``layout`` to ``target`` (``registry/repo:tag``).

    Returns:
        The pushed image (by digest).

    Raises:
        ImageNotFound, ImageDigestMismatch: the layout is incomplete or corrupt;
        ImageAuthFailed: the registry refused the credentials; ImageError: the registry or
        the network failed (retryable); InvalidReference: ``target`` is malformed.
    """
    dest: Reference = parse_reference(target)
    body, digest = await asyncio.to_thread(layout_manifest, layout, tag)
    manifest = json.loads(body)
    media_type = str(manifest.get("mediaType") or OCI_MANIFEST)
    blobs = [("config", manifest["config"])] + [("layer", d) for d in manifest.get("layers", [])]
    auth = auth_file.lookup(dest.registry) if auth_file is not None else None
    uploaded = skipped = 0
    registry = Registry(
        dest.api_host, auth=auth, insecure=dest.registry in insecure, transport=transport
    )
    async with registry:
        for kind, desc in blobs:
            path = _blob(layout, str(desc["digest"]))
            await asyncio.to_thread(_verify, path, str(desc["digest"]))
            sent = await registry.push_blob(dest.repository, str(desc["digest"]), path)
            uploaded, skipped = uploaded + sent, skipped + (not sent)
            if progress is not None:
                progress(PushProgress(kind, str(desc["digest"]), int(desc["size"]), not sent))
        there = await _tagged(registry, dest.repository, dest.tag or digest)
        if there != digest:
            pushed = await registry.put_manifest(
                dest.repository, dest.tag or digest, body, media_type
            )
            if pushed != digest:  # pragma: no cover - the same bytes hash the same
                raise ImageError(f"{target}: the manifest pushed as {pushed}, expected {digest}")
    if progress is not None:
        progress(PushProgress("manifest", digest, len(body), there == digest))
    return PushedImage(
        reference=f"{dest.registry}/{dest.repository}@{digest}",
        digest=digest,
        uploaded=uploaded,
        skipped=skipped,
    )
