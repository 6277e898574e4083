"""The async client of git clone, checkout, status and diff (``sbx.git``); blocking: ``sync``.

execd runs the sandbox's own ``git``; credentials (in the URL or as ``token``) never reach its
command line and are scrubbed from every error. Failures are typed: ``GitAuthFailed``,
``GitNotFound`` (repository, branch or ref), ``GitNetwork``, ``GitTimeout``, else ``GitError``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandpod.channel import DEFAULT_TIMEOUT, REPLY_SLACK
from sandpod.git.types import GitDiff, GitEntry, GitHead, GitStatus, _head
from sandpod_contract.errors import BadRequest
from sandpod_contract.messages import git as wire

if TYPE_CHECKING:
    from sandpod.channel import Channel

__all__ = ["CLONE_TIMEOUT", "AsyncGit"]

CLONE_TIMEOUT = 600.0


class AsyncGit:
    """``sbx.git``: clone, checkout, status and diff in the sandbox."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel

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
        reply = await self._channel.call("git", "clone", req, wire.GitHead, timeout + REPLY_SLACK)
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
        reply = await self._channel.call(
            "git", "checkout", req, wire.GitHead, timeout + REPLY_SLACK
        )
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
        s = await self._channel.call("git", "status", req, wire.GitStatus, timeout + REPLY_SLACK)
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
        p = await self._channel.call("git", "diff", req, wire.GitPatch, timeout + REPLY_SLACK)
        return GitDiff(p.path, p.text, p.size, p.truncated)
