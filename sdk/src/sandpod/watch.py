"""SDK surface for file watching (``sbx.watch``): async and blocking twins."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandpod.aio import AsyncSandbox

__all__ = ["AsyncWatches", "Watches"]


class AsyncWatches:
    def __init__(self, sbx: AsyncSandbox) -> None:
        self._sbx = sbx


class Watches:
    """Blocking twin of :class:`AsyncWatches` (each method runs it on the SDK loop)."""

    def __init__(self, inner: AsyncWatches) -> None:
        self._inner = inner
