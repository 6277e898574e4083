"""The CLI's human units and machine formats (`sandpod.cli._output`)."""

from __future__ import annotations

import dataclasses
import json

import yaml

from sandpod.cli._output import dump, human_bytes, human_duration, human_list, human_time


@dataclasses.dataclass(frozen=True)
class Sample:
    name: str
    families: tuple[str, ...]
    limit: int | None


def test_sizes_print_in_binary_units() -> None:
    """Bytes below 1 KiB stay bytes; exact multiples have no decimals; others one."""
    assert [human_bytes(n) for n in (0, 1023, 1024, 1536, 64 << 20, 3 << 40, None)] == [
        "0 B",
        "1023 B",
        "1 KiB",
        "1.5 KiB",
        "64 MiB",
        "3 TiB",
        "-",
    ]


def test_durations_use_the_two_largest_units() -> None:
    """Seconds, then minutes and seconds, up to days and hours; negative is zero."""
    assert [human_duration(s) for s in (0, 59, 61, 3725, 90061, -5)] == [
        "0s",
        "59s",
        "1m1s",
        "1h2m",
        "1d1h",
        "0s",
    ]


def test_times_are_local_dates_with_their_age() -> None:
    """An epoch float prints as YYYY-MM-DD HH:MM:SS ZONE and how long ago it was."""
    out = human_time(1_800_000_000.5, now=1_800_000_125.0)
    date, clock, _zone, ago = out.split(" ", 3)
    assert len(date) == 10 and clock.count(":") == 2 and ago == "(2m4s ago)"
    assert human_time(None) == "-"


def test_lists_are_comma_lists() -> None:
    """A tuple prints as `a, b`, never as a Python tuple; empty as `-`."""
    assert (human_list(("exec", "fs")), human_list(())) == ("exec, fs", "-")


def test_json_and_yaml_carry_the_same_data() -> None:
    """Dataclasses become mappings and tuples lists, in both formats alike."""
    value = [Sample("a", ("x", "y"), None)]
    expected = [{"name": "a", "families": ["x", "y"], "limit": None}]
    assert json.loads(dump(value, "json")) == expected
    assert yaml.safe_load(dump(value, "yaml")) == expected
