"""SDK surface for git checkout, status and diff (``sbx.git``): async and blocking twins."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandpod.aio import AsyncSandbox

__all__ = ["AsyncGit", "Git"]


class AsyncGit:
    def __init__(self, sbx: AsyncSandbox) -> None:
        self._sbx = sbx


class Git:
    """Blocking twin of :class:`AsyncGit` (each method runs it on the SDK loop)."""

    def __init__(self, inner: AsyncGit) -> None:
        self._inner = inner
