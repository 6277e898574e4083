"""The pieces of a watch on their own: globs, inotify parsing, the coalescing window, limits."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from sandpod_execd import inotify
from sandpod_execd.coalesce import Coalescer, Event
from sandpod_execd.pathglob import GlobSet
from sandpod_execd.watching import WatchCapacity, Watcher


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("*.py", "a/b/c.py", True),
        ("*.py", "c.pyc", False),
        ("node_modules", "x/node_modules/y/z.js", True),
        ("src/**/*.py", "src/a.py", True),
        ("src/**/*.py", "src/x/y/a.py", True),
        ("src/**/*.py", "lib/src/a.py", False),
        ("**/*.txt", "b.txt", True),
        ("build/**", "build/x/y", True),
        ("/src/*.py", "src/x.py", True),
        ("[!ab].txt", "c.txt", True),
        ("[!ab].txt", "a.txt", False),
        ("a?c", "abc", True),
        ("a.c", "abc", False),  # regex metacharacters are literal
    ],
)
def test_glob_rules(pattern: str, path: str, expected: bool) -> None:
    """Globs follow the documented gitignore-like rules, ancestors included."""
    assert GlobSet([pattern]).matches(path) is expected


def test_invalid_glob_is_a_value_error() -> None:
    """A pattern that cannot compile is refused up front."""
    with pytest.raises(ValueError, match="invalid glob"):
        GlobSet(["[z-a]"])


def test_parse_splits_events_and_strips_name_padding() -> None:
    """Raw inotify records (header + NUL-padded name) parse into events."""
    data = struct.pack("iIII", 1, inotify.IN_CREATE, 0, 8) + b"a.txt\0\0\0"
    data += struct.pack("iIII", -1, inotify.IN_Q_OVERFLOW, 0, 0)
    assert inotify.parse(data) == [
        inotify.RawEvent(1, inotify.IN_CREATE, 0, b"a.txt"),
        inotify.RawEvent(-1, inotify.IN_Q_OVERFLOW, 0, b""),
    ]


class Sink:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.moved_out: list[str] = []

    def coalescer(self, window: float = 10.0, max_pending: int = 100) -> Coalescer:
        return Coalescer(
            self.events.append,
            window=window,
            max_pending=max_pending,
            on_moved_out=lambda rel, _: self.moved_out.append(rel),
        )


async def test_merges_only_with_the_last_event_of_the_same_path() -> None:
    """modify+modify merge; a delete in between keeps the order; create absorbs a modify."""
    sink = Sink()
    co = sink.coalescer()
    for kind in ("modify", "modify", "delete", "create", "modify"):
        co.add(Event(kind, "f", False, 0.0))
    co.add(Event("modify", "g", False, 0.0))
    co.flush(force=True)
    assert [(e.type, e.rel, e.count) for e in sink.events] == [
        ("modify", "f", 2),
        ("delete", "f", 1),
        ("create", "f", 2),
        ("modify", "g", 1),
    ]


async def test_moves_pair_by_cookie_and_lone_halves_become_deletes() -> None:
    """from+to with one cookie is one move in place; a lone from is a delete (moved out)."""
    sink = Sink()
    co = sink.coalescer()
    co.add(Event("create", "x", False, 0.0))
    co.move_from(7, "a", False, 0.0)
    co.move_from(8, "dir", True, 0.0)
    co.add(Event("create", "y", False, 0.0))
    assert co.move_to(7, "b", 0.0) == "a"
    assert co.move_to(9, "c", 0.0) is None  # no from-half: the caller reports a create
    co.flush(force=True)
    got = [(e.type, e.old_rel, e.rel) for e in sink.events]
    assert got == [
        ("create", None, "x"),
        ("move", "a", "b"),
        ("delete", None, "dir"),
        ("create", None, "y"),
    ]
    assert sink.moved_out == ["dir"]


async def test_unflushed_move_waits_for_its_pair_but_not_forever() -> None:
    """A flush stops at a fresh lone from-half, and what follows waits with it."""
    sink = Sink()
    co = sink.coalescer()
    co.move_from(1, "a", False, 0.0)
    co.add(Event("create", "z", False, 0.0))
    co.flush()
    assert sink.events == []
    co.close(flush=True)
    assert [e.type for e in sink.events] == ["delete", "create"]


async def test_pending_list_is_bounded() -> None:
    """At max_pending events the list is handed over at once."""
    sink = Sink()
    co = sink.coalescer(max_pending=3)
    for name in "abc":
        co.add(Event("create", name, False, 0.0))
    assert [e.rel for e in sink.events] == ["a", "b", "c"]
    co.close(flush=False)


def watcher(root: Path, **overrides: object) -> Watcher:
    opts: dict[str, object] = {
        "recursive": True,
        "include": GlobSet([]),
        "exclude": GlobSet([]),
        "types": frozenset(),
        "window": 0.0,
        "queue": 16,
        "max_dirs": 100,
    }
    opts.update(overrides)
    return Watcher("w", str(root), **opts)  # type: ignore[arg-type]


async def test_kernel_queue_overflow_becomes_an_overflow_event(tmp_path: Path) -> None:
    """IN_Q_OVERFLOW is reported as overflow (reason kernel) and new directories get watched."""
    w = watcher(tmp_path)
    await w.start()
    try:
        (tmp_path / "made-during-overflow").mkdir()
        w._handle(inotify.RawEvent(-1, inotify.IN_Q_OVERFLOW, 0, b""))
        w._co.flush(force=True)
        read = w.log.read(0, 10)
        assert [(e.type, e.reason, e.rel) for e in read.events] == [("overflow", "kernel", "")]
        assert w.dirs == 2
    finally:
        w.close()


async def test_too_many_directories_is_a_capacity_error(tmp_path: Path) -> None:
    """A tree larger than max_dirs refuses the watch instead of watching part of it silently."""
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    w = watcher(tmp_path, max_dirs=2)
    with pytest.raises(WatchCapacity):
        await w.start()
    assert w.closed


async def test_directories_past_the_bound_later_are_an_overflow_event(tmp_path: Path) -> None:
    """A directory that cannot be watched after start is reported (reason limit), not skipped."""
    w = watcher(tmp_path, max_dirs=1)
    await w.start()
    try:
        (tmp_path / "late").mkdir()
        wd = next(iter(w._wds))
        w._handle(inotify.RawEvent(wd, inotify.IN_CREATE | inotify.IN_ISDIR, 0, b"late"))
        w._co.flush(force=True)
        got = [(e.type, e.rel, e.reason) for e in w.log.read(0, 10).events]
        assert got == [("create", "late", None), ("overflow", "late", "limit")]
    finally:
        w.close()
