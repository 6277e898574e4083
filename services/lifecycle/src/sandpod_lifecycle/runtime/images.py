"""A template's ``image`` as the local runtime's root: the node's layers and the image's config.

The local driver asks :func:`image_root` for a template naming an ``image``: the node's image
store (``sandpod_image.store``, shared by every sandbox of the node) resolves the reference from
its cache or pulls it -- once per node, whatever the number of sandboxes -- and this module
turns the result into what :class:`~sandpod_lifecycle.runtime.base.InstanceSpec` takes: the
layers (bottom first), the image's environment (below the template's and the sandbox's own),
its working directory, and its shell when its ``Cmd`` names one.

The image is recorded as used by the sandbox (``store.use``) before the instance is made, and
released when it is destroyed, so the store's garbage collection never removes a layer that a
sandbox stacks. Errors of the store are the contract's ``image.*`` errors; :func:`unhealthy`
maps them to the Sandbox's stable reasons, the same ones the Kubernetes runtime reports for a
Pod (``ImagePullFailed`` transient, ``InvalidImage`` terminal).
"""

from __future__ import annotations

import asyncio
import dataclasses
import posixpath
from pathlib import Path

from sandpod_contract.errors import (
    ImageAuthFailed,
    ImageDigestMismatch,
    ImageError,
    ImageNotFound,
)
from sandpod_contract.resources import ConditionReason
from sandpod_image.manifest import ImageConfig
from sandpod_image.store import ImageStore, ResolvedImage
from sandpod_lifecycle.runtime.base import InstanceUnhealthy

__all__ = ["ImageRoot", "image_root", "shell_of", "unhealthy"]

SHELLS = frozenset({"sh", "bash", "dash", "ash", "zsh", "fish", "ksh", "mksh"})
SEARCH = ("/usr/local/bin", "/usr/bin", "/bin")  # where a bare shell name is looked up


@dataclasses.dataclass(frozen=True, slots=True)
class ImageRoot:
    """What an image gives an instance."""

    layers: tuple[Path, ...]  # bottom first
    image: str  # reference@digest
    env: dict[str, str]
    workdir: str | None
    shell: str | None
    user: str | None  # the image's User: reported, never a host identity (see notes)


async def image_root(store: ImageStore, reference: str, sandbox_id: str) -> ImageRoot:
    """The root an instance of ``reference`` gets (pulled first if the node lacks it, with the
    store's credentials file).

    Raises:
        ImageError: the store's typed errors (not found, auth failed, digest mismatch,
            unsupported); the driver maps them with :func:`unhealthy`.
    """
    resolved = store.resolve(reference) or await store.pull(reference)
    # use() takes the store's lock, which a pull on this loop may hold: never on the loop.
    await asyncio.to_thread(store.use, sandbox_id, resolved)
    return _root(resolved)


def _root(resolved: ResolvedImage) -> ImageRoot:
    config = resolved.config
    return ImageRoot(
        layers=tuple(resolved.layers),
        image=f"{resolved.reference}@{resolved.digest}",
        env=dict(config.env),
        workdir=config.workdir if config.workdir and config.workdir.startswith("/") else None,
        shell=shell_of(config, resolved.layers),
        user=config.user or None,
    )


def shell_of(config: ImageConfig, layers: tuple[Path, ...]) -> str | None:
    """The image's shell: the program of ``Entrypoint + Cmd`` when it is a shell (``bash``,
    ``/bin/sh``...), as an absolute path found in the layers; None otherwise (a server's
    command is no shell for an agent: execd keeps its own choice)."""
    argv = (*config.entrypoint, *config.cmd)
    if not argv or posixpath.basename(argv[0]) not in SHELLS:
        return None
    name = argv[0]
    candidates = [name] if name.startswith("/") else [f"{d}/{name}" for d in SEARCH]
    for candidate in candidates:
        if any(_exists(layer, candidate) for layer in reversed(layers)):
            return candidate
    return None


def _exists(layer: Path, path: str) -> bool:
    target = layer / path.lstrip("/")
    return target.is_file() or target.is_symlink()


def unhealthy(exc: ImageError, reference: str) -> InstanceUnhealthy:
    """The Sandbox condition for an image that cannot be had: retried while the cause can go
    away (a registry down, credentials fixed, a tag pushed), terminal otherwise."""
    transient = isinstance(exc, ImageNotFound | ImageAuthFailed | ImageDigestMismatch)
    if exc.retryable or transient:
        return InstanceUnhealthy(
            f"cannot pull image {reference!r}: {exc}",
            reason=ConditionReason.IMAGE_PULL_FAILED,
            terminal=False,
        )
    return InstanceUnhealthy(
        f"image {reference!r} cannot be used: {exc}",
        reason=ConditionReason.INVALID_IMAGE,
        terminal=True,
    )
