"""What the ``git`` family returns: the checked-out head, a status, a diff.

Plain frozen values built from the wire messages (``_head``); no NATS, no I/O.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from sandpod_contract.messages import git as wire

__all__ = ["GitDiff", "GitEntry", "GitHead", "GitStatus"]


@dataclasses.dataclass(frozen=True, slots=True)
class GitHead:
    """What is checked out after a clone or checkout."""

    path: str  # the repository's directory (/workspace/...)
    commit: str  # HEAD's full object id
    branch: str | None  # None when HEAD is detached
    url: str | None  # clone: the remote URL with credentials scrubbed
    duration: float


@dataclasses.dataclass(frozen=True, slots=True)
class GitEntry:
    """One changed path: ``index``/``worktree`` are git's X/Y letters, ``state`` sums them up."""

    path: str
    state: Literal[
        "modified",
        "added",
        "deleted",
        "renamed",
        "copied",
        "type_changed",
        "untracked",
        "ignored",
        "conflicted",
    ]
    index: str
    worktree: str
    orig_path: str | None

    @property
    def staged(self) -> bool:
        return self.index not in (".", "?", "!")

    @property
    def unstaged(self) -> bool:
        return self.worktree != "."


@dataclasses.dataclass(frozen=True, slots=True)
class GitStatus:
    """A repository's branch, distance to its upstream and changed paths."""

    path: str  # the repository's root
    commit: str | None
    branch: str | None
    upstream: str | None
    ahead: int
    behind: int
    entries: tuple[GitEntry, ...]
    truncated: bool

    @property
    def clean(self) -> bool:
        return not self.entries and not self.truncated


@dataclasses.dataclass(frozen=True, slots=True)
class GitDiff:
    """A unified diff (bytes that are not UTF-8 show as U+FFFD)."""

    path: str
    text: str
    size: int  # bytes git wrote
    truncated: bool


def _head(h: wire.GitHead) -> GitHead:
    return GitHead(h.path, h.commit, h.branch, h.url, h.duration)
