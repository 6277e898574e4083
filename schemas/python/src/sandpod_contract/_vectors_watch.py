"""Hand-written schemagen inputs of the ``watch`` family (see ``_schemagen_data``)."""

from __future__ import annotations

from typing import Any

from sandpod_contract import errors
from sandpod_contract._patterns import NO_NUL as _NO_NUL
from sandpod_contract.codec import Message, pack
from sandpod_contract.messages.watch import (
    WatchEvent,
    WatchEvents,
    WatchInfo,
    WatchList,
    WatchPoll,
    WatchRef,
    WatchStart,
)

__all__ = ["ACCEPT", "ERRORS", "EXAMPLES", "MESSAGE_RULES", "REJECT", "RULES"]

_GLOBS: dict[str, Any] = {"items": {"minLength": 1, "pattern": _NO_NUL}}
# message TYPE -> field -> JSON Schema keywords for rules __post_init__ enforces
RULES: dict[str, dict[str, dict[str, Any]]] = {
    "watch.start": {
        "path": {"minLength": 1, "pattern": _NO_NUL},
        "include": _GLOBS,
        "exclude": _GLOBS,
        "coalesce": {"minimum": 0, "maximum": 10},
        "queue": {"minimum": 1},
        "idle_timeout": {"exclusiveMinimum": 0},
    },
    "watch.poll": {"cursor": {"minimum": 0}, "max_events": {"minimum": 1}, "wait": {"minimum": 0}},
}
# message TYPE -> whole-message JSON Schema keywords (e.g. oneOf required)
MESSAGE_RULES: dict[str, dict[str, Any]] = {}

_W = "3f9a1c0d2e4b5a69"
_T = 1732900000.125
_INFO = WatchInfo(
    watch_id=_W,
    path="/workspace",
    state="active",
    recursive=True,
    include=("src/**/*.py",),
    exclude=("node_modules", ".git"),
    events=(),
    coalesce=0.05,
    queue=4096,
    idle_timeout=600.0,
    dirs=12,
    next_cursor=0,
    created=_T,
)
# message TYPE -> [(label, instance)]: "full" first (every field set), then variants, "minimal"
EXAMPLES: dict[str, list[tuple[str, Message]]] = {
    "watch.start": [
        (
            "full",
            WatchStart(
                path="/workspace",
                recursive=True,
                include=("src/**/*.py", "*.toml"),
                exclude=("node_modules", ".git", "**/__pycache__"),
                events=("create", "modify", "delete", "move"),
                coalesce=0.05,
                queue=1024,
                idle_timeout=300.0,
            ),
        ),
        ("minimal", WatchStart(path="src")),
    ],
    "watch.info": [
        ("full", _INFO),
        (
            "closed",
            WatchInfo(
                watch_id=_W,
                path="/workspace/notes.txt",
                state="closed",
                recursive=False,
                dirs=0,
                next_cursor=17,
                created=_T,
            ),
        ),
        ("minimal", WatchInfo(watch_id=_W, path="/workspace", state="active")),
    ],
    "watch.poll": [
        ("full", WatchPoll(watch_id=_W, cursor=42, max_events=256, wait=20.0)),
        ("minimal", WatchPoll(watch_id=_W, cursor=0)),
    ],
    "watch.events": [
        (
            "full",
            WatchEvents(
                watch_id=_W,
                cursor=40,
                next_cursor=45,
                skipped=2,
                events=(
                    WatchEvent(
                        seq=40, type="overflow", path="/workspace", time=_T, count=2, reason="queue"
                    ),
                    WatchEvent(
                        seq=40, type="create", path="/workspace/src/new", is_dir=True, time=_T
                    ),
                    WatchEvent(
                        seq=41, type="modify", path="/workspace/src/app.py", time=_T + 0.04, count=3
                    ),
                    WatchEvent(
                        seq=42,
                        type="move",
                        path="/workspace/b.txt",
                        old_path="/workspace/a.txt",
                        time=_T + 0.1,
                    ),
                    WatchEvent(seq=43, type="attrib", path="/workspace/run.sh", time=_T + 0.2),
                    WatchEvent(seq=44, type="delete", path="/workspace/tmp.log", time=_T + 0.3),
                ),
            ),
        ),
        (
            "kernel-overflow",
            WatchEvents(
                watch_id=_W,
                cursor=7,
                next_cursor=8,
                events=(
                    WatchEvent(
                        seq=7, type="overflow", path="/workspace", time=_T, count=0, reason="kernel"
                    ),
                ),
            ),
        ),
        ("closed", WatchEvents(watch_id=_W, cursor=9, next_cursor=9, closed=True)),
        ("minimal", WatchEvents(watch_id=_W)),
    ],
    "watch.ref": [("basic", WatchRef(watch_id=_W))],
    "watch.list": [
        ("full", WatchList(watches=(_INFO,), limit=32)),
        ("minimal", WatchList()),
    ],
    # nested in watch.events
    "watch.event": [
        (
            "move",
            WatchEvent(
                seq=42,
                type="move",
                path="/workspace/b.txt",
                old_path="/workspace/a.txt",
                time=_T + 0.1,
                count=2,
            ),
        ),
        (
            "overflow",
            WatchEvent(
                seq=40, type="overflow", path="/workspace", time=_T, count=0, reason="kernel"
            ),
        ),
        ("minimal", WatchEvent(seq=1, type="create", path="/workspace/new.txt")),
    ],
}
# (label, type, non-canonical map a decoder must accept, why)
ACCEPT: list[tuple[str, type[Message], dict[str, Any], str]] = [
    (
        "int-for-float-wait",
        WatchPoll,
        {"v": 1, "watch_id": _W, "cursor": 3, "wait": 5},
        "an int is accepted for a float",
    ),
]
_EMPTY_PATH = pack({"v": 1, "path": ""})
# (label, type, payload, error code, a JSON Schema validator catches it too, why)
REJECT: list[tuple[str, type[Message], bytes, str, bool, str]] = [
    ("empty-path", WatchStart, _EMPTY_PATH, "bad_request", True, "path is required and non-empty"),
    (
        "nul-in-path",
        WatchStart,
        pack({"v": 1, "path": "a\x00b"}),
        "bad_request",
        True,
        "no NUL in paths",
    ),
    (
        "empty-glob",
        WatchStart,
        pack({"v": 1, "path": "/workspace", "include": [""]}),
        "bad_request",
        True,
        "a pattern is non-empty",
    ),
    (
        "bad-event-type",
        WatchStart,
        pack({"v": 1, "path": "/workspace", "events": ["open"]}),
        "bad_request",
        True,
        "events are create, modify, delete, move, attrib, overflow",
    ),
    (
        "huge-coalesce",
        WatchStart,
        pack({"v": 1, "path": "/workspace", "coalesce": 60.0}),
        "bad_request",
        True,
        "coalesce is at most 10 s",
    ),
    (
        "negative-cursor",
        WatchPoll,
        pack({"v": 1, "watch_id": _W, "cursor": -1}),
        "bad_request",
        True,
        "cursors start at 0",
    ),
    (
        "negative-wait",
        WatchPoll,
        pack({"v": 1, "watch_id": _W, "cursor": 0, "wait": -1.0}),
        "bad_request",
        True,
        "wait >= 0",
    ),
]
# one error per code of this family
ERRORS: list[errors.SandpodError] = [
    errors.WatchError(),
    errors.WatchNotFound("no watch 'w1'", watch_id="w1"),
    errors.WatchLimit("64 watches open (limit 64)", limit=64),
]
