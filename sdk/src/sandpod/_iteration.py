"""Iterating an SDK object that holds something open in the sandbox (a stream, a watch, reads).

``async for x in obj`` goes through :func:`items_then`: a generator, so leaving the loop early
(``break``, an exception, the abandoned generator being collected) runs ``left`` at once. Each
object's ``left`` closes it unless a ``with`` block owns it; otherwise a bare loop left early
would leave the command, the watch or the reads running in execd.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

__all__ = ["items_then"]

T = TypeVar("T")


async def items_then(
    step: Callable[[], Awaitable[T]], left: Callable[[], Awaitable[None]]
) -> AsyncIterator[T]:
    """The items ``step()`` gives until it raises ``StopAsyncIteration``; then, or when the
    iteration is left early, ``left()``."""
    try:
        while True:
            try:
                item = await step()
            except StopAsyncIteration:
                return
            yield item
    finally:
        await left()
