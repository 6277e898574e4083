"""The build cache: one entry per (parent, step), content-addressed by its key.

Keys chain: a base's key hashes what the base is (a root directory's path, an image's digest),
and each step's key is ``sha256(parent key, the step's canonical JSON)`` (a ``copy`` step's JSON
names its tar by content digest, so new files make a new key). An entry is a directory of the
node's image area (the image store's ``<state dir>/images``)::

    <root>/<key>/meta.json   LayerMeta: parent, what made it, the config in force after it
    <root>/<key>/fs/         the layer in overlay format (run and copy steps only)

Config steps (env, workdir, user) have no ``fs``: cheap entries that carry the config. An entry
is written under a temporary name and renamed into place, so a crash never leaves a half layer
behind a valid key. :meth:`BuildCache.chain` walks parents back to the base, which is how a
sandbox of a built template gets its lower layers from the result key alone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from sandpod_contract.builds import BuildStep
from sandpod_contract.errors import ResourceNotFound

__all__ = ["BuildCache", "Chain", "ImageConfig", "LayerMeta", "base_key", "step_key"]

META_VERSION = 1
MAX_DEPTH = 512  # a chain longer than this is a corrupt cache (a parent loop)


def _sha(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def base_key(descriptor: dict[str, str]) -> str:
    """The key of a base (``{"rootfs": "/path"}`` or ``{"image": "sha256:..."}``)."""
    return _sha("base", json.dumps(descriptor, sort_keys=True))


def step_key(parent: str, step: BuildStep) -> str:
    """The key of ``step`` on top of ``parent``."""
    return _sha("step", parent, step.canonical())


@dataclasses.dataclass(frozen=True, slots=True)
class ImageConfig:
    """What env/workdir/user steps set (and a base image's config): inherited down the chain."""

    env: tuple[tuple[str, str], ...] = ()
    workdir: str = ""
    user: str = ""

    def apply(self, step: BuildStep) -> ImageConfig:
        """The config after ``step`` (unchanged for run and copy)."""
        if step.kind == "env":
            env = dict(self.env)
            env.update(step.env)
            return dataclasses.replace(self, env=tuple(sorted(env.items())))
        if step.kind == "workdir":
            return dataclasses.replace(self, workdir=step.value)
        if step.kind == "user":
            return dataclasses.replace(self, user=step.value)
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"env": dict(self.env), "workdir": self.workdir, "user": self.user}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ImageConfig:
        env = raw.get("env") or {}
        return cls(
            env=tuple(sorted((str(k), str(v)) for k, v in env.items())),
            workdir=str(raw.get("workdir", "")),
            user=str(raw.get("user", "")),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class LayerMeta:
    """``meta.json`` of one entry (versioned: another process, the driver, reads it)."""

    key: str
    parent: str  # "" for a base
    kind: str  # base | run | copy | env | workdir | user
    description: str
    has_fs: bool
    config: ImageConfig
    rootfs: str = ""  # a base's root directory
    version: int = META_VERSION
    # An image base: its unpacked layer directories in the node's image store, bottom first
    # (the chain stacks them with no rootfs below), and ``reference@digest``.
    image_layers: tuple[str, ...] = ()
    image: str = ""

    def to_json(self) -> str:
        raw = dataclasses.asdict(self)
        raw["config"] = self.config.to_dict()
        return json.dumps(raw, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> LayerMeta:
        raw = json.loads(text)
        if raw.get("version") != META_VERSION:
            raise ValueError(f"unsupported build cache entry version {raw.get('version')!r}")
        raw["config"] = ImageConfig.from_dict(raw["config"])
        raw["image_layers"] = tuple(str(x) for x in raw.get("image_layers") or ())
        return cls(**raw)


@dataclasses.dataclass(frozen=True, slots=True)
class Chain:
    """A result's root: the base directory, the layers above it bottom first, the config."""

    rootfs: Path | None  # None: an image base (its layers are the bottom of ``layers``)
    layers: tuple[Path, ...]
    config: ImageConfig
    keys: tuple[str, ...]  # every entry's key, bottom first (the base's included)


class BuildCache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def entry(self, key: str) -> Path:
        if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
            raise ValueError(f"not a build cache key: {key!r}")
        return self.root / key

    def get(self, key: str) -> LayerMeta | None:
        """The entry's meta, or None when ``key`` is not cached."""
        try:
            return LayerMeta.from_json((self.entry(key) / "meta.json").read_text())
        except FileNotFoundError:
            return None

    def put(self, meta: LayerMeta, fs: Path | None = None) -> LayerMeta:
        """Store ``meta`` (and move the directory ``fs`` in as its layer) under its key.

        ``fs`` must be on the cache's filesystem (prepare it in :meth:`scratch`). An entry that
        appeared meanwhile wins (same key, same content): ours is discarded.
        """
        tmp = self.scratch(meta.key)
        if fs is not None:
            fs.rename(tmp / "fs")
        (tmp / "meta.json").write_text(meta.to_json())
        try:
            tmp.rename(self.entry(meta.key))
        except OSError:
            if self.get(meta.key) is None:
                raise
            shutil.rmtree(tmp, ignore_errors=True)
        return meta

    def scratch(self, key: str) -> Path:
        """A fresh private directory beside the entries (renamed into place by :meth:`put`)."""
        tmp = self.root / f".tmp-{key[:16]}-{os.getpid()}-{os.urandom(4).hex()}"
        tmp.mkdir(parents=True, mode=0o700)
        return tmp

    def chain(self, key: str) -> Chain:
        """The root of result ``key``. Raises ResourceNotFound when an entry is missing."""
        metas: list[LayerMeta] = []
        current = key
        while current:
            meta = self.get(current)
            if meta is None or len(metas) > MAX_DEPTH:
                raise ResourceNotFound(
                    f"build cache entry {current[:12]} of result {key[:12]} is missing: "
                    "rebuild the template",
                    key=current,
                )
            metas.append(meta)
            current = meta.parent
        base = metas[-1]
        layers = tuple(self.entry(m.key) / "fs" for m in reversed(metas) if m.has_fs)
        images = tuple(Path(p) for p in base.image_layers)
        return Chain(
            rootfs=None if images else Path(base.rootfs or "/"),
            layers=images + layers,
            config=metas[0].config,
            keys=tuple(m.key for m in reversed(metas)),
        )
