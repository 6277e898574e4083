"""The shape of one data-plane operation; each ``messages/<family>.py`` lists its own."""

from __future__ import annotations

import dataclasses

from sandpod_contract.codec import Message

__all__ = ["Operation"]


@dataclasses.dataclass(frozen=True, slots=True)
class Operation:
    """One data-plane verb: ``<prefix>.sbx.<id>.<family>.<verb>``.

    ``reply`` is ``None`` for publish-only verbs (no reply is sent).
    """

    family: str
    verb: str
    request: type[Message]
    reply: type[Message] | None
    doc: str
