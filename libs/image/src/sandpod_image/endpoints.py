"""Where a registry's distribution API is: the host's containers configuration decides.

A reference names a registry (``ghcr.io``, ``localhost:5000``), and that host serves its API --
except Docker Hub, whose API lives on another host than its name ``docker.io``. Sandpod does not
write that host (nor any package registry's) into its code: like podman, skopeo and buildah it
reads the host's containers configuration, ``registries.conf`` (``/etc/containers/``, the
``registries.conf.d`` drop-ins, or ``$CONTAINERS_REGISTRIES_CONF``; Debian's containers-common,
a dependency of skopeo), where an administrator says where a prefix is served::

    [[registry]]
    prefix = "docker.io"
    location = "<the API host, or a mirror on this network>"

The first ``[[registry.mirror]]`` of an entry wins over its ``location`` (a pull-through cache).
A registry without an entry is its own API host. Docker Hub without one is an error that says
what to add.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Final

from sandpod_contract.errors import ImageError

__all__ = ["api_host", "registries_conf"]

CONF: Final = Path("/etc/containers/registries.conf")
DROP_INS: Final = Path("/etc/containers/registries.conf.d")
_NAMED_ONLY: Final = frozenset({"docker.io"})  # registries whose name serves no API


def registries_conf() -> list[Path]:
    """The configuration files, in the order containers/image reads them."""
    override = os.environ.get("CONTAINERS_REGISTRIES_CONF")
    if override:
        return [Path(override)]
    files = [CONF] if CONF.is_file() else []
    if DROP_INS.is_dir():
        files += sorted(p for p in DROP_INS.iterdir() if p.suffix == ".conf")
    return files


def _entries(files: list[Path]) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    for path in files:
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
            continue  # containers/image refuses a bad file; a pull then says what is missing
        found = data.get("registry")
        if isinstance(found, list):
            entries += [e for e in found if isinstance(e, dict)]
    return entries


def api_host(registry: str, files: list[Path] | None = None) -> str:
    """The ``host[:port]`` serving ``registry``'s distribution API.

    Raises:
        ImageError: ``registry`` is Docker Hub and no configuration says where its API is.
    """
    for entry in _entries(registries_conf() if files is None else files):
        prefix = str(entry.get("prefix") or entry.get("location") or "")
        if prefix != registry:
            continue
        mirrors = [m for m in entry.get("mirror") or [] if isinstance(m, dict)]
        for mirror in mirrors:
            if isinstance(mirror.get("location"), str) and mirror["location"]:
                return str(mirror["location"]).split("/", 1)[0]
        location = entry.get("location")
        if isinstance(location, str) and location:
            return location.split("/", 1)[0]
    if registry in _NAMED_ONLY:
        where = ", ".join(str(p) for p in registries_conf()) or str(CONF)
        raise ImageError(
            f"no registries.conf entry says where {registry}'s API is served: add "
            f'[[registry]] prefix = "{registry}" location = "<host>" (or a mirror) to {where}, '
            "or name the image with its registry host",
            reference=registry,
        )
    return registry
