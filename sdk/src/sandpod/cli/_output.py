"""``-o json|yaml`` for every read command, and the human units of the default output.

Machine formats print the data as it is (numbers stay numbers, times stay epoch seconds or the
object's own timestamps), so ``sandpod info -o json | jq .max_payload`` gets bytes; the default
output is for people: dates, durations, KiB/MiB and comma lists (:func:`human_bytes`,
:func:`human_time`, :func:`human_list`). PyYAML is imported only when ``-o yaml`` is asked for.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "MACHINE",
    "add_output",
    "dump",
    "human_bytes",
    "human_duration",
    "human_list",
    "human_time",
    "plain",
]

MACHINE = ("json", "yaml")


def add_output(
    p: argparse.ArgumentParser, human: Sequence[str] = ("table",), default: str | None = None
) -> None:
    """Give ``p`` ``-o/--output``: the ``human`` formats, then json and yaml (default: first)."""
    choices = [*human, *MACHINE]
    p.add_argument(
        "-o",
        "--output",
        choices=choices,
        default=default or choices[0],
        help=f"output format (default: {default or choices[0]})",
    )


def plain(value: Any) -> Any:
    """``value`` as JSON/YAML data: dataclasses to dicts, tuples to lists, mappings copied."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def dump(value: Any, fmt: str) -> str:
    """``value`` (see :func:`plain`) in machine format ``fmt`` (``json`` or ``yaml``)."""
    data = plain(value)
    if fmt == "yaml":
        import yaml  # lazy: only `-o yaml` pays for PyYAML

        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True).rstrip("\n")
    return json.dumps(data, indent=2)


def human_bytes(n: int | None) -> str:
    """``268435456`` -> ``256 MiB``; exact multiples print without decimals; None -> ``-``."""
    if n is None:
        return "-"
    from sandpod_bus.capacity import human_bytes as sized  # here: the CLI starts lazily

    return sized(n)


def human_duration(seconds: float) -> str:
    """``3725`` -> ``1h2m``: the two largest units."""
    s = max(int(seconds), 0)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (s, "s")]
    while len(parts) > 1 and parts[0][0] == 0:
        parts.pop(0)
    return "".join(f"{v}{u}" for v, u in parts[:2])


def human_time(epoch: float | None, *, now: float | None = None) -> str:
    """Epoch seconds as a local ISO date and time with its age: ``2026-12-02 00:41:07 (3m ago)``."""
    if epoch is None:
        return "-"
    stamp = datetime.datetime.fromtimestamp(epoch).astimezone()
    ago = (time.time() if now is None else now) - epoch
    return f"{stamp:%Y-%m-%d %H:%M:%S %Z} ({human_duration(ago)} ago)"


def human_list(items: Sequence[object] | None) -> str:
    """``("exec", "fs")`` -> ``exec, fs``; empty -> ``-``."""
    return ", ".join(str(i) for i in items) if items else "-"
