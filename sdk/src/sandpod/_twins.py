"""Blocking twins of async SDK methods, without restating every signature by hand.

``name = twin(AsyncThing.name)`` in a blocking class gives a method with the async one's
parameters, docstring and (unwrapped) return type that runs it on the SDK loop
(:func:`sandpod._loop.run`) on ``self._inner``. ``iterate`` drives an async iterator from
blocking code and closes it when the caller stops early.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, Concatenate, ParamSpec, TypeVar

from sandpod._loop import run

__all__ = ["iterate", "twin"]

P = ParamSpec("P")
T = TypeVar("T")


def twin(
    method: Callable[Concatenate[Any, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[Any, P], T]:
    """The blocking twin of async ``method``: calls it on ``self._inner`` and waits."""

    def blocking(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> T:
        coro: Coroutine[Any, Any, T] = getattr(self._inner, method.__name__)(*args, **kwargs)
        return run(coro)

    functools.update_wrapper(blocking, method)
    return blocking


def iterate(agen: AsyncIterator[T]) -> Iterator[T]:
    """Iterate ``agen`` from blocking code; closes it if the caller stops early."""

    async def step() -> T:
        return await agen.__anext__()

    try:
        while True:
            try:
                yield run(step())
            except StopAsyncIteration:
                return
    finally:
        aclose = getattr(agen, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                run(aclose())
