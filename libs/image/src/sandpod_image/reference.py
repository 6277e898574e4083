"""Image references: ``python:3.12-slim`` -> registry, repository, tag and digest.

A reference is parsed once, at the edge (the CLI, a template's ``image:``), into a
:class:`Reference`; everything below (the registry client, the store's records) works on that
value, never on the string. The grammar is the distribution project's (the one Docker, containerd
and every registry accept): the first path component is a registry host when it holds a ``.`` or a
``:`` or is ``localhost``, else the reference is on Docker Hub, whose one-component names live
under ``library/``. A reference without tag or digest means ``:latest``.

Bad input raises :class:`InvalidReference` (a ``bad_request`` naming what is wrong); a digest
algorithm other than sha256 raises ``image.unsupported``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from sandpod_contract.errors import BadRequest, ImageUnsupported
from sandpod_image import endpoints

__all__ = [
    "DOCKER_HUB",
    "InvalidReference",
    "Reference",
    "is_loopback",
    "parse_reference",
]

DOCKER_HUB: Final = "docker.io"
_MAX_NAME: Final = 255

_COMPONENT: Final = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_HOST_LABEL: Final = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST: Final = re.compile(
    rf"(?:{_HOST_LABEL}(?:\.{_HOST_LABEL})*|\[[0-9a-fA-F:.]+\])(?::[0-9]{{1,5}})?"
)
_TAG: Final = re.compile(r"[\w][\w.-]{0,127}")
_DIGEST: Final = re.compile(r"([a-z0-9]+(?:[.+_-][a-z0-9]+)*):([a-zA-Z0-9=_-]+)")
_SHA256_HEX: Final = re.compile(r"[0-9a-f]{64}")


def is_docker_hub(host: str) -> bool:
    """Whether ``host`` is one of Docker Hub's names (its own, its index's, its API's)."""
    host = host.lower()
    return host == DOCKER_HUB or host.endswith("." + DOCKER_HUB)


class InvalidReference(BadRequest):
    """The string is not an image reference; ``details.reference`` is the string as given."""


@dataclass(frozen=True, slots=True)
class Reference:
    """A parsed image reference.

    Attributes:
        registry: the registry host as named (``docker.io`` for Docker Hub, ``ghcr.io``,
            ``localhost:5000``).
        repository: the repository path (``library/python``, ``o/r``).
        tag: the tag, or None when the reference names only a digest.
        digest: ``sha256:<hex>`` when the reference pins one.
    """

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def name(self) -> str:
        """``registry/repository`` without tag or digest."""
        return f"{self.registry}/{self.repository}"

    @property
    def target(self) -> str:
        """What the manifest request asks for: the digest when pinned, else the tag."""
        return self.digest or self.tag or "latest"

    @property
    def api_host(self) -> str:
        """The host serving the distribution API: the host's containers configuration says
        (Docker Hub's differs from its name; see :mod:`sandpod_image.endpoints`).

        Raises:
            ImageError: Docker Hub, and nothing configures where its API is.
        """
        return endpoints.api_host(self.registry)

    def with_digest(self, digest: str) -> Reference:
        """This reference pinned to ``digest`` (the tag kept, for display)."""
        return Reference(self.registry, self.repository, self.tag, digest)

    def __str__(self) -> str:
        text = self.name
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def is_loopback(host: str) -> bool:
    """Whether ``host`` (``name[:port]``) is this machine: plain HTTP is allowed there only."""
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    name = name.strip("[]")
    return name == "localhost" or name.startswith("127.") or name == "::1"


def parse_reference(text: str) -> Reference:
    """Parse an image reference, normalising Docker Hub names.

    Args:
        text: ``python``, ``python:3.12-slim``, ``docker.io/library/x``, ``ghcr.io/o/r:tag``,
            ``host:5000/r@sha256:<hex>``, ``localhost:5000/x``...

    Returns:
        The reference; ``tag`` is ``latest`` when neither a tag nor a digest was given.

    Raises:
        InvalidReference: not a reference (empty, upper case in the path, a bad tag...).
        ImageUnsupported: a digest algorithm other than sha256.
    """
    if not text or text != text.strip():
        raise _invalid(text, "empty, or surrounded by white space")
    rest, digest = _split_digest(text)
    registry, path = _split_registry(rest)
    path, tag = _split_tag(text, path)
    if is_docker_hub(registry):
        registry = DOCKER_HUB
        if "/" not in path:
            path = f"library/{path}"
    for component in path.split("/"):
        if not _COMPONENT.fullmatch(component):
            raise _invalid(
                text, f"repository component {component!r} is not lower-case [a-z0-9._-]"
            )
    if len(f"{registry}/{path}") > _MAX_NAME:
        raise _invalid(text, f"the name is longer than {_MAX_NAME} characters")
    if tag is None and digest is None:
        tag = "latest"
    return Reference(registry, path, tag, digest)


def _split_digest(text: str) -> tuple[str, str | None]:
    if "@" not in text:
        return text, None
    rest, _, digest = text.partition("@")
    match = _DIGEST.fullmatch(digest)
    if not match:
        raise _invalid(text, f"{digest!r} is not a digest (algorithm:hex)")
    if match.group(1) != "sha256":
        raise ImageUnsupported(
            f"{text}: only sha256 digests are supported, not {match.group(1)}", reference=text
        )
    if not _SHA256_HEX.fullmatch(match.group(2)):
        raise _invalid(text, "a sha256 digest is 64 lower-case hex digits")
    return rest, digest


def _split_registry(rest: str) -> tuple[str, str]:
    first, sep, remainder = rest.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost" or first != first.lower()):
        if not _HOST.fullmatch(first):
            raise _invalid(rest, f"{first!r} is not a registry host[:port]")
        return first, remainder
    return DOCKER_HUB, rest


def _split_tag(text: str, path: str) -> tuple[str, str | None]:
    last = path.rsplit("/", 1)[-1]
    if ":" not in last:
        if not path:
            raise _invalid(text, "no repository name")
        return path, None
    path, _, tag = path.rpartition(":")
    if not _TAG.fullmatch(tag):
        raise _invalid(text, f"tag {tag!r} is not [A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}}")
    if not path:
        raise _invalid(text, "no repository name")
    return path, tag


def _invalid(text: str, why: str) -> InvalidReference:
    return InvalidReference(f"{text!r} is not an image reference: {why}", reference=text)
