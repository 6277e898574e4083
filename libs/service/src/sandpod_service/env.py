"""Typed readers for settings from the environment.

Services read the environment exactly once, in their ``Settings.from_env``; deep code receives the
settings object. A malformed value fails start-up with a message naming the variable.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["SettingsError", "env_bool", "env_float", "env_int", "env_str"]


class SettingsError(ValueError):
    """A setting from the environment is malformed."""


def env_str(env: Mapping[str, str], names: str | tuple[str, ...], default: str) -> str:
    """First non-empty variable of ``names`` (in order), else ``default``."""
    for name in (names,) if isinstance(names, str) else names:
        value = env.get(name, "").strip()
        if value:
            return value
    return default


def env_int(env: Mapping[str, str], name: str, default: int, *, minimum: int = 0) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise SettingsError(f"{name}={raw!r} is not an integer") from exc
    if value < minimum:
        raise SettingsError(f"{name}={value} must be >= {minimum}")
    return value


def env_float(env: Mapping[str, str], name: str, default: float, *, minimum: float = 0.0) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise SettingsError(f"{name}={raw!r} is not a number") from exc
    if value < minimum:
        raise SettingsError(f"{name}={value} must be >= {minimum}")
    return value


def env_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name}={raw!r} is not a boolean (use true/false)")
