"""Blocking twin of the ``git`` family (:class:`~sandpod.git.api.AsyncGit`).

Each method runs its async twin on the SDK's private loop thread (:mod:`sandpod._loop`).
"""

from __future__ import annotations

from sandpod._loop import run
from sandpod.channel import DEFAULT_TIMEOUT
from sandpod.git.api import CLONE_TIMEOUT, AsyncGit
from sandpod.git.types import GitDiff, GitHead, GitStatus

__all__ = ["Git"]


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
