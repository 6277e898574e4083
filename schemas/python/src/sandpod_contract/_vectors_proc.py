"""Hand-written schemagen inputs of the ``proc`` family (see ``_schemagen_data``).

``S604`` is ignored on examples: ``shell`` there is a wire field, not a subprocess call.
"""

from __future__ import annotations

from typing import Any

from sandpod_contract import errors
from sandpod_contract._patterns import NO_NUL as _NO_NUL
from sandpod_contract._patterns import NUL, SPACE, no_nul
from sandpod_contract.codec import Message, pack, to_map
from sandpod_contract.messages.proc import (
    ID_PATTERN,
    MAX_TAG_VALUE,
    MAX_TAGS,
    MAX_WAIT,
    TAG_KEY_PATTERN,
    ProcChunk,
    ProcInfo,
    ProcKill,
    ProcList,
    ProcListing,
    ProcLogPart,
    ProcLogs,
    ProcPortStatus,
    ProcRef,
    ProcSignal,
    ProcStart,
    ProcWait,
    ProcWaitPort,
)

__all__ = ["ACCEPT", "ERRORS", "EXAMPLES", "MESSAGE_RULES", "REJECT", "RULES"]

_TEXT: dict[str, Any] = {"type": "string", "pattern": _NO_NUL}
_ID: dict[str, Any] = {"pattern": ID_PATTERN}
_WAIT: dict[str, Any] = {"minimum": 0, "maximum": MAX_WAIT}
_SIGNAL: dict[str, Any] = {"minimum": 1, "maximum": 64}
_TAGS: dict[str, Any] = {
    "propertyNames": {"pattern": TAG_KEY_PATTERN},
    "additionalProperties": {"type": "string", "pattern": f"^[^{NUL}]{{0,{MAX_TAG_VALUE}}}$"},
}

# message TYPE -> field -> JSON Schema keywords for rules __post_init__ enforces
RULES: dict[str, dict[str, dict[str, Any]]] = {
    "proc.start": {
        "proc_id": _ID,
        "argv": {"minItems": 1, "prefixItems": [{**_TEXT, "minLength": 1}], "items": _TEXT},
        "shell": {"pattern": _NO_NUL},
        "cwd": {"pattern": _NO_NUL},
        "env": {
            "propertyNames": {"minLength": 1, "pattern": no_nul("=")},
            "additionalProperties": _TEXT,
        },
        "tags": {**_TAGS, "maxProperties": MAX_TAGS},  # a filter (proc.list) has no such limit
        "timeout": {"exclusiveMinimum": 0},
        "log_limit": {"minimum": 1},
    },
    "proc.ref": {"proc_id": _ID},
    "proc.list": {"tags": _TAGS},
    "proc.wait": {"proc_id": _ID, "wait": _WAIT},
    "proc.logs": {
        "proc_id": _ID,
        "cursor": {"minimum": 0},
        "max_bytes": {"minimum": 1},
        "wait": _WAIT,
    },
    "proc.signal": {"proc_id": _ID, "signal": _SIGNAL},
    "proc.kill": {"proc_id": _ID, "signal": _SIGNAL, "grace": _WAIT},
    "proc.wait_port": {
        "port": {"minimum": 1, "maximum": 65535},
        "path": {"pattern": f"^/[^{SPACE}]*$"},
        "proc_id": _ID,
        "wait": _WAIT,
    },
}
# message TYPE -> whole-message JSON Schema keywords (e.g. oneOf required)
MESSAGE_RULES: dict[str, dict[str, Any]] = {
    "proc.start": {"oneOf": [{"required": ["argv"]}, {"required": ["shell"]}]},
}

_MiB = 1024 * 1024
_INFO = ProcInfo(
    proc_id="web",
    pid=4242,
    state="running",
    command="python3 -m http.server 8000",
    cwd="/workspace",
    tags={"role": "server"},
    started_at=1732900000.25,
    stdout_size=120,
    stderr_size=2048,
    log_limit=2 * _MiB,
    log_start=0,
    log_end=2168,
)
_DONE = ProcInfo(
    proc_id="build",
    pid=5150,
    state="exited",
    command="make -j4",
    cwd="/workspace/src",
    started_at=1732900000.0,
    ended_at=1732900093.5,
    exit_code=2,
    stdout_size=5 * _MiB,
    stderr_size=913,
    log_limit=2 * _MiB,
    log_start=3 * _MiB + 913,
    log_end=5 * _MiB + 913,
)
# message TYPE -> [(label, instance)]: "full" first (every field set), then variants, "minimal"
EXAMPLES: dict[str, list[tuple[str, Message]]] = {
    "proc.start": [
        (
            "full",
            ProcStart(
                proc_id="web",
                argv=("python3", "-m", "http.server", "8000"),
                cwd="/workspace/site",
                env={"PYTHONUNBUFFERED": "1"},
                tags={"role": "server", "task": "t-17"},
                stdin=b"",
                timeout=3600.0,
                log_limit=4 * _MiB,
            ),
        ),
        ("shell", ProcStart(proc_id="dev", shell="npm run dev 2>&1", tags={"role": "server"})),  # noqa: S604
        ("minimal", ProcStart(argv=("sleep", "600"))),
    ],
    "proc.info": [
        (
            "full",
            ProcInfo(
                proc_id="build",
                pid=5150,
                state="exited",
                command="make -j4",
                cwd="/workspace",
                tags={"task": "t-17"},
                started_at=1732900000.0,
                ended_at=1732900060.5,
                signal=9,
                killed=True,
                timed_out=True,
                stdout_size=3 * _MiB,
                stderr_size=10,
                log_limit=2 * _MiB,
                log_start=_MiB + 10,
                log_end=3 * _MiB + 10,
            ),
        ),
        ("running", _INFO),
        ("exited", _DONE),
        (
            "minimal",
            ProcInfo(
                proc_id="p1",
                pid=7,
                state="running",
                command="sleep 600",
                cwd="/srv",
                started_at=1732900000.0,
                log_limit=2 * _MiB,
            ),
        ),
    ],
    "proc.ref": [("basic", ProcRef(proc_id="web"))],
    "proc.list": [
        ("full", ProcList(tags={"role": "server"}, state="running")),
        ("minimal", ProcList()),
    ],
    "proc.listing": [
        ("full", ProcListing(procs=(_DONE, _INFO), truncated=True)),
        ("minimal", ProcListing()),
    ],
    "proc.wait": [
        ("full", ProcWait(proc_id="build", wait=30.0)),
        ("minimal", ProcWait(proc_id="build")),
    ],
    "proc.logs": [
        (
            "full",
            ProcLogs(proc_id="web", cursor=2048, max_bytes=512 * 1024, wait=25.0, stream="stderr"),
        ),
        ("minimal", ProcLogs(proc_id="web")),
    ],
    "proc.log_part": [
        (
            "full",
            ProcLogPart(
                proc_id="build",
                cursor=3 * _MiB + 913,
                next_cursor=3 * _MiB + 929,
                skipped=3 * _MiB,
                eof=True,
                state="exited",
                chunks=(
                    ProcChunk(offset=3 * _MiB + 913, stream="stdout", data=b"ok\n"),
                    ProcChunk(offset=3 * _MiB + 916, stream="stderr", data=b"\x1b[31mErr\x1b[0m\n"),
                ),
            ),
        ),
        ("no-news", ProcLogPart(proc_id="web", cursor=2168, next_cursor=2168, state="running")),
        ("minimal", ProcLogPart(proc_id="web", cursor=0, next_cursor=0, state="running")),
    ],
    "proc.signal": [("sighup", ProcSignal(proc_id="web", signal=1))],
    "proc.kill": [
        ("full", ProcKill(proc_id="web", signal=2, grace=10.0)),
        ("minimal", ProcKill(proc_id="web")),
    ],
    "proc.wait_port": [
        ("full", ProcWaitPort(port=8000, kind="http", path="/healthz", proc_id="web", wait=20.0)),
        ("minimal", ProcWaitPort(port=5432)),
    ],
    "proc.port_status": [
        (
            "full",
            ProcPortStatus(
                port=8000,
                ready=False,
                status_code=503,
                reason="HTTP status 503",
                proc_state="running",
            ),
        ),
        ("ready", ProcPortStatus(port=8000, ready=True, status_code=200, proc_state="running")),
        ("minimal", ProcPortStatus(port=5432, ready=True)),
    ],
    # nested in proc.log_part
    "proc.chunk": [("basic", ProcChunk(offset=913, stream="stderr", data=b"warn: \xff\n"))],
}

# (label, type, non-canonical map a decoder must accept, why)
ACCEPT: list[tuple[str, type[Message], dict[str, Any], str]] = [
    (
        "nested-unknown-fields",
        ProcLogPart,
        {
            **to_map(EXAMPLES["proc.log_part"][0][1]),
            "chunks": [{"v": 1, "offset": 0, "stream": "stdout", "data": b"ok\n", "ts": 1.5}],
        },
        "unknown fields inside nested messages are ignored too",
    ),
]

_REF = {"v": 1, "proc_id": "web"}
# (label, type, payload, error code, a JSON Schema validator catches it too, why)
REJECT: list[tuple[str, type[Message], bytes, str, bool, str]] = [
    (
        "id-path",
        ProcRef,
        pack({"v": 1, "proc_id": "../etc"}),
        "bad_request",
        True,
        "ids are letters, digits, '.', '_', '-', starting with a letter or digit",
    ),
    (
        "id-too-long",
        ProcRef,
        pack({"v": 1, "proc_id": "a" * 129}),
        "bad_request",
        True,
        "ids are at most 128 characters",
    ),
    ("id-nul", ProcRef, pack({"v": 1, "proc_id": "a\x00b"}), "bad_request", True, "no NUL"),
    (
        "too-many-tags",
        ProcStart,
        pack({"v": 1, "shell": "true", "tags": {f"t{i}": "" for i in range(MAX_TAGS + 1)}}),
        "bad_request",
        True,
        "at most 16 tags",
    ),
    (
        "bad-tag-name",
        ProcList,
        pack({"v": 1, "tags": {"a b": "x"}}),
        "bad_request",
        True,
        "tag names are label-like",
    ),
    (
        "no-command",
        ProcStart,
        pack({"v": 1, "proc_id": "web"}),
        "bad_request",
        True,
        "exactly one of argv or shell",
    ),
    (
        "wait-too-long",
        ProcWait,
        pack({**_REF, "wait": 61.0}),
        "bad_request",
        True,
        "long-polls are at most 60 s: ask again",
    ),
    (
        "negative-cursor",
        ProcLogs,
        pack({**_REF, "cursor": -1}),
        "bad_request",
        True,
        "cursors are absolute byte positions",
    ),
    (
        "bad-stream",
        ProcLogs,
        pack({**_REF, "stream": "both"}),
        "bad_request",
        True,
        "stream is stdout or stderr (unset for both)",
    ),
    ("signal-zero", ProcSignal, pack({**_REF, "signal": 0}), "bad_request", True, "signal 1..64"),
    ("port-zero", ProcWaitPort, pack({"v": 1, "port": 0}), "bad_request", True, "port 1..65535"),
    (
        "path-not-absolute",
        ProcWaitPort,
        pack({"v": 1, "port": 80, "path": "health"}),
        "bad_request",
        True,
        "an HTTP path starts with '/'",
    ),
    (
        "bad-kind",
        ProcWaitPort,
        pack({"v": 1, "port": 80, "kind": "udp"}),
        "bad_request",
        True,
        "kind is tcp or http",
    ),
]
# one error per code of this family
ERRORS: list[errors.SandpodError] = [
    errors.ProcError(),
    errors.ProcNotFound("no background process 'web'", proc_id="web"),
    errors.ProcIdInUse("background process 'web' exists", proc_id="web"),
]
