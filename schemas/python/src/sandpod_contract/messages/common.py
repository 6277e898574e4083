"""Messages and validators shared by several families."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from sandpod_contract.codec import Message

__all__ = ["Empty", "check_env", "check_text"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Empty(Message):
    """A request that needs no fields (``sys.ping``, ``sys.info``)."""

    TYPE = "empty"


def check_text(name: str, values: Iterable[str]) -> None:
    """Reject strings that cannot cross into argv/env/paths (NUL bytes)."""
    for value in values:
        if "\x00" in value:
            raise ValueError(f"{name} must not contain NUL bytes")


def check_env(env: Mapping[str, str] | None) -> None:
    """Reject environment names a process could not receive."""
    if not env:
        return
    for key, value in env.items():
        if not key or "=" in key or "\x00" in key:
            raise ValueError(f"env name {key!r} is invalid (empty, or contains '=' or NUL)")
        check_text(f"env[{key}]", [value])
