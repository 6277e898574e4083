"""Hand-written schemagen inputs of the ``session`` family (see ``_schemagen_data``)."""

from __future__ import annotations

from typing import Any

from sandpod_contract import errors
from sandpod_contract._patterns import NO_NUL as _NO_NUL
from sandpod_contract._patterns import no_nul
from sandpod_contract.codec import Message, pack
from sandpod_contract.messages.proc import ID_PATTERN
from sandpod_contract.messages.session import (
    SessionCommandRef,
    SessionCreate,
    SessionFetch,
    SessionInfo,
    SessionListing,
    SessionOutputPart,
    SessionRef,
    SessionResult,
    SessionRun,
)

__all__ = ["ACCEPT", "ERRORS", "EXAMPLES", "MESSAGE_RULES", "REJECT", "RULES"]

_ID: dict[str, Any] = {"pattern": ID_PATTERN}
# message TYPE -> field -> JSON Schema keywords for rules __post_init__ enforces
RULES: dict[str, dict[str, dict[str, Any]]] = {
    "session.create": {
        "session_id": _ID,
        "cwd": {"pattern": _NO_NUL},
        "env": {
            "propertyNames": {"minLength": 1, "pattern": no_nul("=")},
            "additionalProperties": {"type": "string", "pattern": _NO_NUL},
        },
    },
    "session.ref": {"session_id": _ID},
    "session.run": {
        "session_id": _ID,
        "command": {"pattern": _NO_NUL},
        "command_id": _ID,
        "timeout": {"exclusiveMinimum": 0},
        "max_output": {"minimum": 0},
    },
    "session.command_ref": {"session_id": _ID, "command_id": _ID},
    "session.fetch": {
        "session_id": _ID,
        "command_id": _ID,
        "offset": {"minimum": 0},
        "max_bytes": {"minimum": 1},
    },
}
# message TYPE -> whole-message JSON Schema keywords (e.g. oneOf required)
MESSAGE_RULES: dict[str, dict[str, Any]] = {}

_CMD = "c0ffee0123456789abcdef0123456789"
_WS = "/workspace"
_IDLE = SessionInfo(
    session_id="build",
    pid=4242,
    state="idle",
    cwd=_WS + "/src",
    created_at=1732900000.25,
    commands=12,
)
# message TYPE -> [(label, instance)]: "full" first (every field set), then variants, "minimal"
EXAMPLES: dict[str, list[tuple[str, Message]]] = {
    "session.create": [
        (
            "full",
            SessionCreate(
                session_id="build", cwd="/workspace/src", env={"CI": "1", "LANG": "C.UTF-8"}
            ),
        ),
        ("minimal", SessionCreate()),
    ],
    "session.info": [
        (
            "full",
            SessionInfo(
                session_id="build",
                pid=4242,
                state="dead",
                cwd=_WS,
                created_at=1732900000.25,
                commands=40,
                queued=2,
                running=_CMD,
                exit_code=1,
                signal=9,
            ),
        ),
        (
            "busy",
            SessionInfo(
                session_id="build",
                pid=4242,
                state="busy",
                cwd=_WS,
                created_at=1732900000.25,
                commands=13,
                queued=1,
                running=_CMD,
            ),
        ),
        (
            "dead",
            SessionInfo(
                session_id="build",
                pid=4242,
                state="dead",
                cwd=_WS,
                created_at=1732900000.25,
                commands=14,
                exit_code=3,
            ),
        ),
        ("minimal", _IDLE),
    ],
    "session.ref": [("basic", SessionRef(session_id="build"))],
    "session.listing": [
        ("full", SessionListing(sessions=(_IDLE,))),
        ("minimal", SessionListing()),
    ],
    "session.run": [
        (
            "full",
            SessionRun(
                session_id="build",
                command="cd src && make test 2>&1 | tail -n 5",
                command_id=_CMD,
                timeout=600.0,
                stdin=b"y\n",
                max_output=1 << 20,
            ),
        ),
        (
            "multi-line",
            SessionRun(session_id="build", command='greet() {\n  echo "hi $1"\n}\ngreet there'),
        ),
        ("minimal", SessionRun(session_id="build", command="pwd")),
    ],
    "session.result": [
        (
            "full",
            SessionResult(
                session_id="build",
                command_id=_CMD,
                exit_code=124,
                stdout=b"step 1\n",
                stderr=b"\xff\xfebinary",
                stdout_size=7,
                stderr_size=3 << 20,
                stdout_truncated=True,
                stderr_truncated=True,
                timed_out=True,
                cancelled=True,
                shell_exited=True,
                duration=600.0,
                cwd=_WS + "/src",
            ),
        ),
        (
            "ok",
            SessionResult(
                session_id="build",
                command_id=_CMD,
                exit_code=0,
                stdout=b"/workspace\n",
                stdout_size=33,
                duration=0.002,
                cwd=_WS,
            ),
        ),
        (
            "exit",
            SessionResult(
                session_id="build", command_id=_CMD, exit_code=3, shell_exited=True, duration=0.001
            ),
        ),
        ("minimal", SessionResult(session_id="build", command_id=_CMD)),
    ],
    "session.command_ref": [("basic", SessionCommandRef(session_id="build", command_id=_CMD))],
    "session.fetch": [
        (
            "full",
            SessionFetch(
                session_id="build",
                command_id=_CMD,
                stream="stderr",
                offset=1 << 20,
                max_bytes=512 * 1024,
            ),
        ),
        ("minimal", SessionFetch(session_id="build", command_id=_CMD, stream="stdout", offset=0)),
    ],
    "session.output_part": [
        (
            "basic",
            SessionOutputPart(
                session_id="build",
                command_id=_CMD,
                stream="stderr",
                offset=1 << 20,
                data=b"tail\n",
                eof=True,
            ),
        ),
    ],
}
# (label, type, non-canonical map a decoder must accept, why)
ACCEPT: list[tuple[str, type[Message], dict[str, Any], str]] = []
# (label, type, payload, error code, a JSON Schema validator catches it too, why)
REJECT: list[tuple[str, type[Message], bytes, str, bool, str]] = [
    (
        "id-slash",
        SessionRef,
        pack({"v": 1, "session_id": "a/b"}),
        "bad_request",
        True,
        "ids are letters, digits, '.', '_', '-'",
    ),
    (
        "nul-in-command",
        SessionRun,
        pack({"v": 1, "session_id": "s", "command": "ls\x00-l"}),
        "bad_request",
        True,
        "a command line has no NUL",
    ),
    (
        "missing-command",
        SessionRun,
        pack({"v": 1, "session_id": "s"}),
        "bad_request",
        True,
        "command is required",
    ),
    (
        "zero-timeout",
        SessionRun,
        pack({"v": 1, "session_id": "s", "command": "ls", "timeout": 0.0}),
        "bad_request",
        True,
        "timeout > 0",
    ),
    (
        "argv-for-command",
        SessionRun,
        pack({"v": 1, "session_id": "s", "command": ["ls"]}),
        "bad_request",
        True,
        "a session command is one shell string",
    ),
]
# one error per code of this family
ERRORS: list[errors.SandpodError] = [
    errors.SessionError(),
    errors.SessionNotFound("no session 'build'", session_id="build"),
    errors.SessionAlreadyExists("session 'build' exists", session_id="build"),
    errors.SessionDead("the shell of session 'build' exited with 1", session_id="build"),
]
