"""SDK surface for background processes (``sbx.proc``): async and blocking twins."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandpod.aio import AsyncSandbox

__all__ = ["AsyncProcesses", "Processes"]


class AsyncProcesses:
    def __init__(self, sbx: AsyncSandbox) -> None:
        self._sbx = sbx


class Processes:
    """Blocking twin of :class:`AsyncProcesses` (each method runs it on the SDK loop)."""

    def __init__(self, inner: AsyncProcesses) -> None:
        self._inner = inner
