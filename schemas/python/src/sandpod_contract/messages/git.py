"""``git`` family: clone/checkout, status and diff, with credentials scrubbed.

execd runs the sandbox's own ``git`` binary (never a library), with ``GIT_TERMINAL_PROMPT=0`` so it
never waits for a password, and kills its whole process tree on timeout. Credentials (in the URL,
``https://user:token@host/...``, or as ``username``/``token``) reach git through a ``GIT_ASKPASS``
helper's environment, never its argv, and are scrubbed from every reply, error and log line.
Failures are typed: ``git.auth_failed``, ``git.not_found`` (repository, branch or ref),
``git.network``, ``git.timeout``, else ``git.error`` with the scrubbed tail of git's stderr.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from sandpod_contract.codec import Message
from sandpod_contract.messages.common import check_text
from sandpod_contract.operations import Operation

__all__ = [
    "FRAMES",
    "OPERATIONS",
    "EntryState",
    "GitCheckout",
    "GitClone",
    "GitDiff",
    "GitEntry",
    "GitHead",
    "GitPatch",
    "GitRepo",
    "GitStatus",
]

EntryState = Literal[
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


def _check_ref(name: str, value: str | None) -> None:
    if value is None:
        return
    if not value or value.startswith("-"):
        raise ValueError(f"{name} must be non-empty and must not start with '-'")
    if any(c.isspace() or not c.isprintable() for c in value):
        raise ValueError(f"{name} must not contain whitespace or control characters")


def _check_timeout(timeout: float | None) -> None:
    if timeout is not None and not timeout > 0:
        raise ValueError("timeout must be > 0")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GitClone(Message):
    """``git.clone``: clone a repository into the sandbox and check out a branch or ref."""

    TYPE = "git.clone"
    url: str  # https://, ssh://, git@host:path, file:// or a path (/workspace/... resolves)
    target: str | None = None  # directory to create (default: /workspace/<repository name>)
    branch: str | None = None  # branch or tag to clone (default: the remote's HEAD)
    ref: str | None = None  # commit or ref to check out after cloning (detached HEAD)
    depth: int | None = None  # shallow clone: this many commits
    username: str | None = None  # for HTTP(S) auth (default: the URL's, else "git")
    token: str | None = None  # password or token; goes to git via GIT_ASKPASS, never argv
    timeout: float | None = None  # seconds (default 600); the whole git tree is killed on expiry

    def __post_init__(self) -> None:
        if not self.url:
            raise ValueError("url must be non-empty")
        if self.url.startswith("-"):
            raise ValueError("url must not start with '-'")
        check_text("url", [self.url])
        check_text("target", [self.target or ""])
        check_text("username", [self.username or ""])
        check_text("token", [self.token or ""])
        _check_ref("branch", self.branch)
        _check_ref("ref", self.ref)
        if self.depth is not None and self.depth < 1:
            raise ValueError("depth must be >= 1")
        _check_timeout(self.timeout)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GitCheckout(Message):
    """``git.checkout``: switch a repository's work tree to a branch, tag or commit."""

    TYPE = "git.checkout"
    path: str  # the repository's directory
    ref: str  # branch, tag or commit
    create: bool = False  # create branch ``ref`` at the current HEAD (git checkout -b)
    timeout: float | None = None  # seconds (default 60)

    def __post_init__(self) -> None:
        check_text("path", [self.path])
        _check_ref("ref", self.ref)
        _check_timeout(self.timeout)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GitHead(Message):
    """Reply to ``git.clone`` and ``git.checkout``: what is checked out now."""

    TYPE = "git.head"
    path: str  # the repository's directory, as clients see it
    commit: str  # full object id of HEAD
    branch: str | None = None  # absent when HEAD is detached
    url: str | None = None  # clone: the remote URL, credentials scrubbed
    duration: float = 0.0  # seconds git ran


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GitRepo(Message):
    """``git.status``: names a repository (or any directory inside one)."""

    TYPE = "git.repo"
    path: str
    timeout: float | None = None  # seconds (default 60)

    def __post_init__(self) -> None:
        check_text("path", [self.path])
        _check_timeout(self.timeout)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GitEntry(Message):
    """One changed, untracked or conflicted path (``git status --porcelain=v2``).

    ``index`` and ``worktree`` are git's X and Y letters (``.`` unchanged, ``M``, ``A``, ``D``,
    ``R``, ``C``, ``T``, ``U``; ``?`` untracked, ``!`` ignored); ``state`` sums them up.
    """

    TYPE = "git.entry"
    path: str  # relative to the repository root
    state: EntryState
    index: str = "."  # staged change
    worktree: str = "."  # unstaged change
    orig_path: str | None = None  # renamed/copied: the source path


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GitStatus(Message):
    """Reply to ``git.status``."""

    TYPE = "git.status"
    path: str  # the repository's root directory, as clients see it
    commit: str | None = None  # HEAD's object id; absent before the first commit
    branch: str | None = None  # absent when HEAD is detached
    upstream: str | None = None  # e.g. origin/main
    ahead: int = 0  # commits on branch not on upstream
    behind: int = 0  # commits on upstream not on branch
    entries: tuple[GitEntry, ...] = ()
    truncated: bool = False  # more entries than fit in one reply; the rest were left out


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GitDiff(Message):
    """``git.diff``: the unified diff of the work tree (or of the index with ``staged``)."""

    TYPE = "git.diff"
    path: str  # the repository's directory
    file: str | None = None  # limit to this path (relative to ``path``)
    staged: bool = False  # diff the index against HEAD (git diff --cached)
    max_bytes: int | None = None  # cap on the text (default and maximum: what fits one message)
    timeout: float | None = None  # seconds (default 60)

    def __post_init__(self) -> None:
        check_text("path", [self.path])
        check_text("file", [self.file or ""])
        if self.max_bytes is not None and self.max_bytes < 1:
            raise ValueError("max_bytes must be >= 1")
        _check_timeout(self.timeout)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GitPatch(Message):
    """Reply to ``git.diff``. Bytes that are not UTF-8 appear as U+FFFD."""

    TYPE = "git.patch"
    path: str
    text: str  # unified diff (binary files show as "Binary files ... differ")
    size: int = 0  # bytes git wrote (more than len(text) when truncated)
    truncated: bool = False


OPERATIONS: tuple[Operation, ...] = (
    Operation("git", "clone", GitClone, GitHead, "clone a repository (branch, ref, depth)"),
    Operation("git", "checkout", GitCheckout, GitHead, "check out a branch, tag or commit"),
    Operation("git", "status", GitRepo, GitStatus, "branch, ahead/behind and changed paths"),
    Operation("git", "diff", GitDiff, GitPatch, "unified diff of the work tree or the index"),
)
FRAMES: tuple[type[Message], ...] = ()
