"""SDK surface for files in the sandbox (``sbx.fs``): async and blocking twins."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandpod.aio import AsyncSandbox

__all__ = ["AsyncFiles", "Files"]


class AsyncFiles:
    def __init__(self, sbx: AsyncSandbox) -> None:
        self._sbx = sbx


class Files:
    """Blocking twin of :class:`AsyncFiles` (each method runs it on the SDK loop)."""

    def __init__(self, inner: AsyncFiles) -> None:
        self._inner = inner
