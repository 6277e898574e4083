"""What the lifecycle and a builder Pod tell each other: two versioned JSON documents.

- :class:`BuildRequest` goes in (the Pod's ``SANDPOD_BUILD_REQUEST`` env): the template, its
  ``spec.build``, the base pinned by the lifecycle (its cache key and image by digest), the
  result key the lifecycle computed, and where to push.
- :class:`BuildOutcome` comes out as the container's termination message (the kubelet copies
  the file at ``terminationMessagePath`` into the Pod's status, at most 4096 bytes): the pushed
  image by digest, or the typed error (its wire form, the log tail cut to fit).

Both sides import this one module, so a field can never mean two things.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from sandpod_contract.errors import InternalError, SandpodError, error_from_wire

__all__ = ["MESSAGE_LIMIT", "WIRE_VERSION", "BuildOutcome", "BuildRequest", "image_tag"]

WIRE_VERSION = 1
MESSAGE_LIMIT = 4096  # bytes of a termination message the kubelet keeps
_TAIL_LIMIT = 1500  # characters of the failing step's log tail carried back
TAG_KEY_CHARS = 32  # 128 bits of a result key name its tag


def image_tag(key: str) -> str:
    """The registry tag of the build result (or intermediate step result) ``key``."""
    return f"build-{key[:TAG_KEY_CHARS]}"


@dataclasses.dataclass(frozen=True, slots=True)
class BuildRequest:
    template: str
    build: dict[str, Any]  # spec.build, as on the wire (sandpod_contract.builds)
    base_key: str  # the chain's first key (an image's, or the base template's result)
    base_image: str  # the base, pinned: registry/repo@sha256:...
    key: str  # the result key the lifecycle expects (the Pod checks it got the same)
    target: str  # registry/repo:tag to push to (intermediate results: the same repo)
    steps_before: int = 0  # template steps already built: the base is their result
    version: int = WIRE_VERSION

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> BuildRequest:
        """Raises ValueError for a malformed or newer document."""
        raw = json.loads(text)
        if not isinstance(raw, dict) or raw.get("version") != WIRE_VERSION:
            raise ValueError(f"unsupported build request (version {raw.get('version')!r})")
        try:
            return cls(**raw)
        except TypeError as exc:
            raise ValueError(f"malformed build request: {exc}") from exc


@dataclasses.dataclass(frozen=True, slots=True)
class BuildOutcome:
    ok: bool
    key: str = ""
    image: str = ""  # registry/repo@sha256:... (ok)
    ran: int = 0  # steps that did work
    uploaded: int = 0  # blobs pushed (the rest were in the registry already)
    error: dict[str, Any] = dataclasses.field(default_factory=dict)  # wire form (not ok)
    version: int = WIRE_VERSION

    @classmethod
    def failed(cls, exc: SandpodError) -> BuildOutcome:
        wire = exc.to_wire()
        details = dict(wire.get("details") or {})
        tail = str(details.get("log_tail", ""))
        if len(tail) > _TAIL_LIMIT:
            details["log_tail"] = "…" + tail[-_TAIL_LIMIT:]
        wire["details"] = details
        wire["message"] = str(wire["message"])[:1000]
        return cls(ok=False, error=wire)

    def to_json(self) -> str:
        text = json.dumps(dataclasses.asdict(self), sort_keys=True)
        if len(text.encode()) > MESSAGE_LIMIT:  # never cut JSON in half: drop the details
            text = json.dumps(
                dataclasses.asdict(dataclasses.replace(self, error={**self.error, "details": {}}))
            )
        return text

    @classmethod
    def from_json(cls, text: str) -> BuildOutcome:
        """Raises ValueError for a malformed or newer document."""
        raw = json.loads(text)
        if not isinstance(raw, dict) or raw.get("version") != WIRE_VERSION:
            raise ValueError("unsupported build outcome")
        try:
            return cls(**raw)
        except TypeError as exc:
            raise ValueError(f"malformed build outcome: {exc}") from exc

    def raise_error(self) -> None:
        """Raise the typed error a failed outcome carries (InternalError if it has none)."""
        if self.error:
            raise error_from_wire(self.error)
        raise InternalError("the builder Pod failed without saying why")
