"""What a build returns and what it is told, whichever builds it (``executor.Builder`` on this
node, ``kube.PodBuilds`` as a builder Pod): the loop (``builds.loop``) speaks only these."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

__all__ = ["BuildOwner", "BuildResult", "BuiltRef", "Log"]

Log = Callable[[str], Awaitable[None]]  # one progress line of a build


@dataclasses.dataclass(frozen=True, slots=True)
class BuildResult:
    key: str
    layers: tuple[str, ...]  # every key of the chain, bottom first
    ran: int  # steps that did work (not cached)
    image: str = ""  # Kubernetes mode: the pushed image, ``registry/repo@sha256:...``


@dataclasses.dataclass(frozen=True, slots=True)
class BuiltRef:
    """Another template's build, as a base: its result key (and pushed image, Kubernetes)."""

    key: str
    image: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class BuildOwner:
    """The SandboxTemplate being built (Kubernetes mode: the builder Pod's owner)."""

    namespace: str
    name: str
    uid: str
