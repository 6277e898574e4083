"""``session`` family: long-lived shells whose state (cwd, env, functions) persists."""

from __future__ import annotations

from sandpod_contract.codec import Message
from sandpod_contract.operations import Operation

__all__ = ["FRAMES", "OPERATIONS"]

OPERATIONS: tuple[Operation, ...] = ()
FRAMES: tuple[type[Message], ...] = ()
