"""``watch`` family: inotify-based file watching with cursors and explicit overflow."""

from __future__ import annotations

from sandpod_contract.codec import Message
from sandpod_contract.operations import Operation

__all__ = ["FRAMES", "OPERATIONS"]

OPERATIONS: tuple[Operation, ...] = ()
FRAMES: tuple[type[Message], ...] = ()
