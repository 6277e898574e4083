"""Messages and validators shared by several families."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from sandpod_contract.codec import Message

__all__ = ["Empty", "check_deliver", "check_env", "check_text"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Empty(Message):
    """A request that needs no fields (``sys.ping``, ``sys.info``)."""

    TYPE = "empty"


def check_text(name: str, values: Iterable[str]) -> None:
    """Reject strings that cannot cross into argv/env/paths (NUL bytes)."""
    for value in values:
        if "\x00" in value:
            raise ValueError(f"{name} must not contain NUL bytes")


def check_deliver(subject: str) -> None:
    """A reply/deliver subject must be one concrete subject: no wildcards, no whitespace."""
    tokens = subject.split(".")
    if not subject or not all(tokens) or any(t in ("*", ">") for t in tokens):
        raise ValueError(f"deliver subject {subject!r} must be concrete (no wildcards or empties)")
    if any(c.isspace() or c == "\x00" for c in subject):
        raise ValueError("deliver subject must not contain whitespace or NUL")


def check_env(env: Mapping[str, str] | None) -> None:
    """Reject environment names a process could not receive."""
    if not env:
        return
    for key, value in env.items():
        if not key or "=" in key or "\x00" in key:
            raise ValueError(f"env name {key!r} is invalid (empty, or contains '=' or NUL)")
        check_text(f"env[{key}]", [value])
