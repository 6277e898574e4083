"""Process-tree helpers shared by services that manage processes on the host."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["descendants", "signal_tree"]


def descendants(root: int) -> list[int]:
    """All live descendants of ``root`` (by parent pid), read from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        # the command name may contain spaces and parentheses: parse after the last ')'
        fields = stat[stat.rfind(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def signal_tree(root: int, sig: int) -> None:
    """Send ``sig`` to ``root`` and every descendant (those that left its group included)."""
    for pid in [root, *descendants(root)]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
