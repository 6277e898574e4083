"""A built template as an OCI image layout: the way a build reaches a registry or a cluster.

Data flow: the result key's chain (:meth:`BuildCache.chain`) is read bottom first; the base
directory becomes the image's first layer and each cached layer (already in overlay format:
whiteouts and opaque directories, which ``sandpod_image.layers.pack_layer`` turns into the
OCI ``.wh.`` entries) one more, in order; the chain's config (env, workdir, user) becomes the
image config. The layout can then be pushed (``sandpod_image``'s registry push, or
``skopeo copy oci:<dir> docker://…``), which is what Kubernetes mode needs to run a built
template as a Pod image.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sandpod_image.ocilayout import ImageConfig as OciConfig
from sandpod_image.ocilayout import OciLayout
from sandpod_lifecycle.builds.cache import BuildCache

__all__ = ["export_chain", "export_oci"]


def export_oci(cache: BuildCache, key: str, out: Path, *, ref: str = "latest") -> str:
    """Write result ``key`` as an OCI image layout at ``out``, tagged ``ref``.

    Returns:
        The manifest's digest.

    Raises:
        ResourceNotFound: an entry of the chain is missing from the cache.
    """
    chain = cache.chain(key)
    layout = OciLayout(out)
    base = cache.get(chain.keys[0])
    if chain.rootfs is not None:
        layout.add_layer(chain.rootfs, created_by=f"base {chain.rootfs}")
    elif base is not None:  # an image base: its own layers, bottom first
        for layer in base.image_layers:
            layout.add_layer(Path(layer), created_by=base.description)
    metas = [cache.get(k) for k in chain.keys[1:]]
    for meta in metas:
        if meta is not None and meta.has_fs:
            layout.add_layer(cache.entry(meta.key) / "fs", created_by=meta.description)
    config = OciConfig(
        env=tuple(f"{k}={v}" for k, v in chain.config.env),
        working_dir=chain.config.workdir,
        user=chain.config.user,
    )
    return layout.write_image(config, ref=ref).digest


def export_chain(cache: BuildCache, key: str, out: Path, tag: Callable[[str], str]) -> list[str]:
    """Write result ``key`` and every intermediate result of its chain (each step's) as images
    of one OCI layout at ``out``, tagged ``tag(step key)``: each layer is packed once, and a
    later build whose steps share a prefix resumes from the longest one pushed.

    Returns:
        The step keys written (bottom first; the last is ``key``).

    Raises:
        ResourceNotFound: an entry of the chain is missing from the cache.
    """
    chain = cache.chain(key)
    layout = OciLayout(out)
    base = cache.get(chain.keys[0])
    if chain.rootfs is not None:
        layout.add_layer(chain.rootfs, created_by=f"base {chain.rootfs}")
    elif base is not None:
        for layer in base.image_layers:
            layout.add_layer(Path(layer), created_by=base.description)
    written = []
    for step in chain.keys[1:]:
        meta = cache.get(step)
        if meta is None:  # chain() found every entry a moment ago
            continue
        if meta.has_fs:
            layout.add_layer(cache.entry(step) / "fs", created_by=meta.description)
        config = OciConfig(
            env=tuple(f"{k}={v}" for k, v in meta.config.env),
            working_dir=meta.config.workdir,
            user=meta.config.user,
        )
        layout.write_image(config, ref=tag(step))
        written.append(step)
    return written
