"""Parsing untrusted JSON: bounded in size (by the caller) and in nesting depth.

``json.loads`` recurses once per level of ``[``/``{``; 100 000 levels raise ``RecursionError``
(a 500 and a traceback in the log, if uncaught), and a few hundred levels that do parse would
recurse again in every later walk of the value (msgpack, the contract codec). Any document
deeper than :data:`MAX_DEPTH` is refused with a typed 400 instead, whatever way it is deep.
"""

from __future__ import annotations

import json
from typing import Any

from sandpod_gateway.errors import JsonTooDeep

__all__ = ["MAX_DEPTH", "loads"]

MAX_DEPTH = 64


def loads(raw: bytes | bytearray | str) -> Any:
    """The JSON value of ``raw``.

    Raises:
        JsonTooDeep: nested deeper than ``MAX_DEPTH``.
        ValueError: not JSON (``json.JSONDecodeError``) or not UTF-8.
    """
    try:
        value = json.loads(raw)
    except RecursionError:
        raise JsonTooDeep(limit=MAX_DEPTH) from None
    if _depth(value) > MAX_DEPTH:
        raise JsonTooDeep(limit=MAX_DEPTH)
    return value


def _depth(value: Any) -> int:
    """The nesting depth of a parsed value, iteratively (no recursion to exhaust)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest
