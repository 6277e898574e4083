"""The shape of one request/reply operation; each ``messages/<family>.py`` lists its own.

The same shape serves every plane (data, control, node): what differs between planes (the
subject, who answers, the queue group) lives on :class:`sandpod_contract.catalogue.Plane`.
"""

from __future__ import annotations

import dataclasses

from sandpod_contract.codec import Message
from sandpod_contract.errors import SandpodError

__all__ = ["Operation"]


@dataclasses.dataclass(frozen=True, slots=True)
class Operation:
    """One verb: ``<family>.<verb>`` on its plane's subject, e.g. ``<prefix>.sbx.<id>.exec.run``.

    ``reply`` is ``None`` for publish-only verbs (no reply is sent). ``errors`` lists the error
    codes this operation replies with beyond the ones every operation of its plane may get
    (:attr:`Plane.errors`); it documents the contract and generates ``schemas/subjects.json``.
    """

    family: str
    verb: str
    request: type[Message]
    reply: type[Message] | None
    doc: str
    errors: tuple[type[SandpodError], ...] = ()
