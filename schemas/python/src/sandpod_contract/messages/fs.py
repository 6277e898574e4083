"""``fs`` family: files (read/write streamed in chunks, stat, list, glob, mkdir, remove, move,
chmod/chown, exists, search and replace)."""

from __future__ import annotations

from sandpod_contract.codec import Message
from sandpod_contract.operations import Operation

__all__ = ["FRAMES", "OPERATIONS"]

OPERATIONS: tuple[Operation, ...] = ()
FRAMES: tuple[type[Message], ...] = ()
