"""SDK surface for pseudo-terminals (``sbx.pty``): async and blocking twins."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandpod.aio import AsyncSandbox

__all__ = ["AsyncPtys", "Ptys"]


class AsyncPtys:
    def __init__(self, sbx: AsyncSandbox) -> None:
        self._sbx = sbx


class Ptys:
    """Blocking twin of :class:`AsyncPtys` (each method runs it on the SDK loop)."""

    def __init__(self, inner: AsyncPtys) -> None:
        self._inner = inner
