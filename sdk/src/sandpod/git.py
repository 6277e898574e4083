"""SDK surface for git checkout, status and diff (``sbx.git``): async and blocking twins.

execd runs the sandbox's own ``git``; credentials (in the URL or as ``token``) never reach its
command line and are scrubbed from every error. Failures are typed: ``GitAuthFailed``,
``GitNotFound`` (repository, branch or ref), ``GitNetwork``, ``GitTimeout``, else ``GitError``.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

from sandpod._loop import run
from sandpod.exec_args import DEFAULT_TIMEOUT, REPLY_SLACK
from sandpod_contract.errors import BadRequest
from sandpod_contract.messages import git as wire

if TYPE_CHECKING:
    from sandpod.aio import AsyncSandbox

__all__ = ["AsyncGit", "Git", "GitDiff", "GitEntry", "GitHead", "GitStatus"]

CLONE_TIMEOUT = 600.0


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


class AsyncGit:
    """``sbx.git``: clone, checkout, status and diff in the sandbox."""

    def __init__(self, sbx: AsyncSandbox) -> None:
        self._sbx = sbx

    async def clone(
        self,
        url: str,
        target: str | None = None,
        *,
        branch: str | None = None,
        ref: str | None = None,
        depth: int | None = None,
        username: str | None = None,
        token: str | None = None,
        timeout: float = CLONE_TIMEOUT,
    ) -> GitHead:
        """Clone ``url`` into ``target`` (default ``/workspace/<repository name>``).

        Args:
            url: https://, ssh://, git@host:path, file:// or a path in the sandbox. Credentials
                in it (``https://user:token@host/...``) are used, then scrubbed everywhere.
            branch: branch or tag to clone; ref: commit/ref to check out afterwards (detached).
            depth: shallow clone with this many commits.
            username, token: HTTP(S) credentials, passed to git without touching its argv.
            timeout: seconds; the whole git process tree is killed on expiry.

        Raises:
            GitAuthFailed, GitNotFound, GitNetwork, GitTimeout, GitError: git failed.
            FsAlreadyExists: ``target`` exists and is not an empty directory.
        """
        try:
            req = wire.GitClone(
                url=url,
                target=target,
                branch=branch,
                ref=ref,
                depth=depth,
                username=username,
                token=token,
                timeout=timeout,
            )
        except ValueError as exc:
            raise BadRequest(str(exc)) from None  # never echo the arguments: one is a token
        reply = await self._sbx._call("git", "clone", req, wire.GitHead, timeout + REPLY_SLACK)
        return _head(reply)

    async def checkout(
        self, path: str, ref: str, *, create: bool = False, timeout: float = DEFAULT_TIMEOUT
    ) -> GitHead:
        """Check out branch, tag or commit ``ref`` in the repository at ``path``.

        Args:
            create: create branch ``ref`` at the current HEAD (``git checkout -b``).

        Raises:
            GitNotFound: no such ref, or ``path`` is not a repository.
            FsNotFound: ``path`` does not exist.
        """
        try:
            req = wire.GitCheckout(path=path, ref=ref, create=create, timeout=timeout)
        except ValueError as exc:
            raise BadRequest(str(exc)) from exc
        reply = await self._sbx._call("git", "checkout", req, wire.GitHead, timeout + REPLY_SLACK)
        return _head(reply)

    async def status(self, path: str, *, timeout: float = DEFAULT_TIMEOUT) -> GitStatus:
        """Branch, ahead/behind its upstream, and changed/untracked paths of a repository.

        Raises:
            GitNotFound: ``path`` is not inside a repository.
            FsNotFound: ``path`` does not exist.
        """
        try:
            req = wire.GitRepo(path=path, timeout=timeout)
        except ValueError as exc:
            raise BadRequest(str(exc)) from exc
        s = await self._sbx._call("git", "status", req, wire.GitStatus, timeout + REPLY_SLACK)
        entries = tuple(
            GitEntry(e.path, e.state, e.index, e.worktree, e.orig_path) for e in s.entries
        )
        return GitStatus(
            s.path, s.commit, s.branch, s.upstream, s.ahead, s.behind, entries, s.truncated
        )

    async def diff(
        self,
        path: str,
        file: str | None = None,
        *,
        staged: bool = False,
        max_bytes: int | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> GitDiff:
        """The unified diff of the work tree (or, with ``staged``, of the index) against HEAD.

        Args:
            file: limit the diff to this path (relative to ``path``, or ``/workspace/...``).
            max_bytes: cap on the text (default: what fits one message; ``truncated`` says so).

        Raises:
            GitNotFound: ``path`` is not inside a repository.
        """
        try:
            req = wire.GitDiff(
                path=path, file=file, staged=staged, max_bytes=max_bytes, timeout=timeout
            )
        except ValueError as exc:
            raise BadRequest(str(exc)) from exc
        p = await self._sbx._call("git", "diff", req, wire.GitPatch, timeout + REPLY_SLACK)
        return GitDiff(p.path, p.text, p.size, p.truncated)


class Git:
    """Blocking twin of :class:`AsyncGit` (each method runs it on the SDK loop)."""

    def __init__(self, inner: AsyncGit) -> None:
        self._inner = inner

    def clone(
        self,
        url: str,
        target: str | None = None,
        *,
        branch: str | None = None,
        ref: str | None = None,
        depth: int | None = None,
        username: str | None = None,
        token: str | None = None,
        timeout: float = CLONE_TIMEOUT,
    ) -> GitHead:
        """Clone a repository (see :meth:`AsyncGit.clone`)."""
        return run(
            self._inner.clone(
                url,
                target,
                branch=branch,
                ref=ref,
                depth=depth,
                username=username,
                token=token,
                timeout=timeout,
            )
        )

    def checkout(
        self, path: str, ref: str, *, create: bool = False, timeout: float = DEFAULT_TIMEOUT
    ) -> GitHead:
        """Check out a ref (see :meth:`AsyncGit.checkout`)."""
        return run(self._inner.checkout(path, ref, create=create, timeout=timeout))

    def status(self, path: str, *, timeout: float = DEFAULT_TIMEOUT) -> GitStatus:
        """Repository status (see :meth:`AsyncGit.status`)."""
        return run(self._inner.status(path, timeout=timeout))

    def diff(
        self,
        path: str,
        file: str | None = None,
        *,
        staged: bool = False,
        max_bytes: int | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> GitDiff:
        """A unified diff (see :meth:`AsyncGit.diff`)."""
        return run(
            self._inner.diff(path, file, staged=staged, max_bytes=max_bytes, timeout=timeout)
        )
