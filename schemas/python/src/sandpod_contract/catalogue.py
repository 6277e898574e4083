"""The operation catalogue: every data-plane verb with its request and reply message types.

Each family lists its own operations in ``messages/<family>.py``; this module only joins them.
The table is the single source for execd's router, the generated docs in ``schemas/`` and the
test vectors. An operation whose ``reply`` is ``None`` is publish-only (no reply is sent).
"""

from __future__ import annotations

from sandpod_contract.codec import Message
from sandpod_contract.messages import exec as exec_
from sandpod_contract.messages import fs, git, proc, pty, session, system, watch
from sandpod_contract.operations import Operation

__all__ = ["DATA_PLANE", "FAMILIES", "FRAMES", "PROTOCOL_VERSION", "Operation", "operation"]

PROTOCOL_VERSION = 1

FAMILIES = (system, exec_, fs, proc, session, pty, watch, git)

DATA_PLANE: tuple[Operation, ...] = tuple(op for fam in FAMILIES for op in fam.OPERATIONS)

# Frames published by execd to a client's deliver subject, told apart by their ``kind`` field.
FRAMES: tuple[type[Message], ...] = tuple(
    frame for fam in FAMILIES for frame in getattr(fam, "FRAMES", ())
)

_BY_KEY = {(op.family, op.verb): op for op in DATA_PLANE}
if len(_BY_KEY) != len(DATA_PLANE):  # pragma: no cover - a binding bug caught at import
    raise RuntimeError("duplicate (family, verb) in the operation catalogue")


def operation(family: str, verb: str) -> Operation | None:
    """The operation for ``family.verb``, or ``None`` if there is none."""
    return _BY_KEY.get((family, verb))
