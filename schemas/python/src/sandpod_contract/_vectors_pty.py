"""Hand-written schemagen inputs of the ``pty`` family (see ``_schemagen_data``)."""

from __future__ import annotations

from typing import Any

from sandpod_contract import errors
from sandpod_contract._patterns import NO_NUL as _NO_NUL
from sandpod_contract._patterns import no_nul
from sandpod_contract.codec import Message, pack
from sandpod_contract.messages.pty import (
    MAX_SIZE,
    MAX_WAIT,
    PTY_ID_PATTERN,
    PtyInfo,
    PtyInput,
    PtyList,
    PtyOpen,
    PtyOutput,
    PtyRead,
    PtyRef,
    PtyResize,
    PtySignal,
    PtyWritten,
)

__all__ = ["ACCEPT", "ERRORS", "EXAMPLES", "MESSAGE_RULES", "REJECT", "RULES"]

_TEXT: dict[str, Any] = {"type": "string", "pattern": _NO_NUL}
_ID: dict[str, Any] = {"pattern": f"^{PTY_ID_PATTERN}$"}
_SIZE: dict[str, Any] = {"minimum": 1, "maximum": MAX_SIZE}

# message TYPE -> field -> JSON Schema keywords for rules __post_init__ enforces
RULES: dict[str, dict[str, dict[str, Any]]] = {
    "pty.open": {
        "pty_id": _ID,
        "argv": {"minItems": 1, "prefixItems": [{**_TEXT, "minLength": 1}], "items": _TEXT},
        "shell": {"pattern": _NO_NUL},
        "cwd": {"pattern": _NO_NUL},
        "env": {
            "propertyNames": {"minLength": 1, "pattern": no_nul("=")},
            "additionalProperties": _TEXT,
        },
        "cols": _SIZE,
        "rows": _SIZE,
        "buffer_bytes": {"minimum": 1},
        "abandon_after": {"exclusiveMinimum": 0},
    },
    "pty.resize": {"cols": _SIZE, "rows": _SIZE},
    "pty.signal": {"signal": {"minimum": 1, "maximum": 64}},
    "pty.read": {
        "cursor": {"minimum": 0},
        "max_bytes": {"minimum": 1},
        "wait": {"minimum": 0, "maximum": MAX_WAIT},
    },
}
# message TYPE -> whole-message JSON Schema keywords (e.g. oneOf required)
MESSAGE_RULES: dict[str, dict[str, Any]] = {
    "pty.open": {"not": {"required": ["argv", "shell"]}},  # at most one: neither runs a login shell
}

_PID = 31337
_T = "build-1"
_MiB = 1024 * 1024
_INFO = PtyInfo(
    pty_id=_T,
    pid=_PID,
    argv=("/bin/bash", "-i", "-l"),
    cwd="/workspace",
    cols=120,
    rows=40,
    state="running",
    started_at=1732900000.5,
    end_cursor=18231,
    start_cursor=0,
    buffer_bytes=_MiB,
    abandon_after=600.0,
)
# message TYPE -> [(label, instance)]: "full" first (every field set), then variants, "minimal"
EXAMPLES: dict[str, list[tuple[str, Message]]] = {
    "pty.open": [
        (
            "full",
            PtyOpen(
                pty_id=_T,
                argv=("python3", "-q"),
                cwd="/workspace/src",
                env={"TERM": "xterm", "LANG": "C.UTF-8"},
                cols=132,
                rows=50,
                buffer_bytes=4 * _MiB,
                abandon_after=600.0,
            ),
        ),
        ("shell", PtyOpen(shell="htop -d 10", cols=200, rows=60)),  # noqa: S604
        ("minimal", PtyOpen()),
    ],
    "pty.info": [
        (
            "full",
            PtyInfo(
                pty_id=_T,
                pid=_PID,
                argv=("python3", "-q"),
                cwd="/srv/ws/src",
                cols=132,
                rows=50,
                state="exited",
                exit_code=None,
                signal=9,
                abandoned=True,
                started_at=1732900000.5,
                end_cursor=3 * _MiB,
                start_cursor=2 * _MiB,
                buffer_bytes=_MiB,
                abandon_after=600.0,
            ),
        ),
        (
            "exited",
            PtyInfo(
                pty_id=_T,
                pid=_PID,
                argv=("/bin/bash", "-i", "-l"),
                cwd="/srv/ws",
                cols=80,
                rows=24,
                state="exited",
                exit_code=7,
                started_at=1732900000.5,
                end_cursor=412,
                buffer_bytes=_MiB,
            ),
        ),
        (
            "minimal",
            PtyInfo(
                pty_id=_T,
                pid=_PID,
                argv=("/bin/bash", "-i", "-l"),
                cwd="/srv/ws",
                cols=80,
                rows=24,
                state="running",
                started_at=1732900000.5,
                end_cursor=0,
                buffer_bytes=_MiB,
            ),
        ),
    ],
    "pty.ref": [("basic", PtyRef(pty_id=_T))],
    "pty.input": [
        ("keys", PtyInput(pty_id=_T, data=b"ls -l\r")),
        ("control", PtyInput(pty_id=_T, data=b"\x03\x1b[A\x04")),
    ],
    "pty.written": [("basic", PtyWritten(pty_id=_T, written=6))],
    "pty.resize": [("basic", PtyResize(pty_id=_T, cols=132, rows=50))],
    "pty.signal": [("sigint", PtySignal(pty_id=_T, signal=2))],
    "pty.read": [
        ("full", PtyRead(pty_id=_T, cursor=18231, max_bytes=65536, wait=30.0)),
        ("minimal", PtyRead(pty_id=_T)),
    ],
    "pty.output": [
        (
            "full",
            PtyOutput(
                pty_id=_T,
                data=b"\x1b[?2004hhi\r\n$ ",
                cursor=1_048_576 + 4096,
                next_cursor=1_048_576 + 4110,
                skipped=4096,
                exited=True,
                exit_code=0,
            ),
        ),
        ("killed", PtyOutput(pty_id=_T, cursor=52, next_cursor=52, exited=True, signal=9)),
        ("minimal", PtyOutput(pty_id=_T, cursor=0, next_cursor=0)),
    ],
    "pty.list": [
        ("full", PtyList(ptys=(_INFO,))),
        ("minimal", PtyList()),
    ],
}
# (label, type, non-canonical map a decoder must accept, why)
ACCEPT: list[tuple[str, type[Message], dict[str, Any], str]] = [
    (
        "pty-read-int-wait",
        PtyRead,
        {"v": 1, "pty_id": _T, "cursor": 5, "wait": 10},
        "an int is accepted for a float (wait)",
    ),
]

_REF = {"v": 1, "pty_id": _T}
# (label, type, payload, error code, a JSON Schema validator catches it too, why)
REJECT: list[tuple[str, type[Message], bytes, str, bool, str]] = [
    (
        "pty-negative-cols",
        PtyResize,
        pack({**_REF, "cols": -1, "rows": 24}),
        "bad_request",
        True,
        "cols and rows are 1..4096",
    ),
    (
        "pty-zero-rows",
        PtyOpen,
        pack({"v": 1, "rows": 0}),
        "bad_request",
        True,
        "cols and rows are 1..4096",
    ),
    (
        "pty-huge-cols",
        PtyResize,
        pack({**_REF, "cols": 65536, "rows": 24}),
        "bad_request",
        True,
        "cols and rows are 1..4096",
    ),
    (
        "pty-bad-id",
        PtyOpen,
        pack({"v": 1, "pty_id": "../x"}),
        "bad_request",
        True,
        "pty ids are 1-128 of [A-Za-z0-9_.:-], starting with a letter or digit",
    ),
    (
        "pty-argv-and-shell",
        PtyOpen,
        pack({"v": 1, "argv": ["vi"], "shell": "vi"}),
        "bad_request",
        True,
        "at most one of argv or shell",
    ),
    (
        "pty-negative-cursor",
        PtyRead,
        pack({**_REF, "cursor": -1}),
        "bad_request",
        True,
        "cursors are >= 0",
    ),
    (
        "pty-wait-too-long",
        PtyRead,
        pack({**_REF, "wait": 3600.0}),
        "bad_request",
        True,
        "wait is 0..60 s",
    ),
    (
        "pty-str-input",
        PtyInput,
        pack({**_REF, "data": "ls\r"}),
        "bad_request",
        False,
        "input is msgpack bin, never str",
    ),
]
# one error per code of this family
ERRORS: list[errors.SandpodError] = [
    errors.PtyError(),
    errors.PtyNotFound("no pty 't1'", pty_id="t1"),
    errors.PtyClosed("pty 't1' exited with 0", pty_id="t1"),
    errors.PtyIdInUse("pty id 't1' is in use; choose another or close it", pty_id="t1"),
]
