"""SDK surface for long-lived shell sessions (``sbx.sessions``): async and blocking twins."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandpod.aio import AsyncSandbox

__all__ = ["AsyncSessions", "Sessions"]


class AsyncSessions:
    def __init__(self, sbx: AsyncSandbox) -> None:
        self._sbx = sbx


class Sessions:
    """Blocking twin of :class:`AsyncSessions` (each method runs it on the SDK loop)."""

    def __init__(self, inner: AsyncSessions) -> None:
        self._inner = inner
