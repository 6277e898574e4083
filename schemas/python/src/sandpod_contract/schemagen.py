"""Generate the language-neutral contract in ``schemas/`` from this binding.

A client in another language must be writable from ``schemas/`` alone, and this binding is the
source of truth, so those files are derived from it, never written by hand:

- ``messages/<TYPE>.schema.json``: JSON Schema (draft 2020-12) per message, from the dataclass type
  hints, defaults and trailing field comments, plus the value rules ``__post_init__`` enforces
  (``_RULES``); ``messages/error.schema.json`` for the error reply envelope;
- ``vectors/<family>.json``: realistic examples (``_EXAMPLES``) encoded by the real codec, payloads
  a decoder must accept although they are not canonical, and payloads it must reject (``_REJECT``)
  with the expected error code; ``vectors/error.json``: one error envelope per error code;
- ``errors.json`` (error catalogue) and ``subjects.json`` (operation catalogue).

Output is deterministic (sorted keys, indent 2, trailing newline) so ``--check`` can fail CI when a
file is stale: ``python -m sandpod_contract.schemagen [--check] [--root DIR]``.
"""

from __future__ import annotations

import argparse
import ast
import base64
import dataclasses
import inspect
import json
import sys
import tokenize
import types
import typing
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from sandpod_contract import errors, subjects
from sandpod_contract.catalogue import DATA_PLANE, FRAMES, PROTOCOL_VERSION
from sandpod_contract.codec import Message, decode, encode, encode_error, pack, to_map, unpack
from sandpod_contract.messages.common import Empty
from sandpod_contract.messages.exec import (
    ExecExit,
    ExecFetch,
    ExecRef,
    ExecRequest,
    ExecResult,
    ExecResume,
    ExecSignal,
    ExecStart,
    ExecStarted,
    ExecStatus,
    OutputChunk,
    OutputPart,
    StdinWrite,
    StreamAck,
)
from sandpod_contract.messages.system import Info, Pong

__all__ = ["error_schema", "main", "message_schema", "message_types", "render", "stale", "write"]

DIALECT = "https://json-schema.org/draft/2020-12/schema"
DATA_SUBJECT = "<prefix>.sbx.<sandbox>.{}.{}"
DELIVER = "<deliver>"
BIN_NOTE = "msgpack bin on the wire, never base64; base64 only in this JSON view"
LENIENCY = (
    "Wire form: a msgpack map with string keys, 'v' first, then the set fields in "
    "x-sandpod-field-order; nil fields are omitted. This schema describes what encoders send. "
    "Decoders also accept unknown fields (ignored), any key order, nil on a non-required field "
    "(= absent: the default applies) and an integer where a number is expected."
)

# -- value rules enforced by __post_init__ (a rule naming a missing field fails generation) -------

_NO_NUL = "^[^\\u0000]*$"
_TEXT = {"type": "string", "pattern": _NO_NUL}
_COMMAND = {
    "argv": {"minItems": 1, "prefixItems": [{**_TEXT, "minLength": 1}], "items": _TEXT},
    "shell": {"pattern": _NO_NUL},
    "cwd": {"pattern": _NO_NUL},
    "env": {
        "propertyNames": {"minLength": 1, "pattern": "^[^=\\u0000]*$"},
        "additionalProperties": _TEXT,
    },
    "timeout": {"exclusiveMinimum": 0},
}
_RULES: dict[str, dict[str, dict[str, Any]]] = {
    "exec.request": {**_COMMAND, "max_output": {"minimum": 0}},
    "exec.start": {
        **_COMMAND,
        "deliver": {"minLength": 1, "pattern": _NO_NUL},
        "window": {"minimum": 1},
        "abandon_after": {"exclusiveMinimum": 0},
    },
    "exec.fetch": {"offset": {"minimum": 0}, "max_bytes": {"minimum": 1}},
    "exec.signal": {"signal": {"minimum": 1, "maximum": 64}},
    "exec.resume": {"from_seq": {"minimum": 1}},
}
_ONE_COMMAND = {"oneOf": [{"required": ["argv"]}, {"required": ["shell"]}]}
_MESSAGE_RULES = {"exec.request": _ONE_COMMAND, "exec.start": _ONE_COMMAND}

# -- examples: realistic instances, "full" first (every field set), then variants and "minimal" ---

_ID = "8c1f0e5a2b3d4c6e9f7a1b2c3d4e5f60"
_INBOX = "_INBOX.Qm9kX2y7Lh3Tz1Wb8Vc4Nf"
_MiB = 1024 * 1024
_EXAMPLES: dict[str, list[tuple[str, Message]]] = {
    "empty": [("basic", Empty())],
    "sys.pong": [("basic", Pong(sandbox_id="demo", time=1732900000.25))],
    "sys.info": [
        ("full", Info(sandbox_id="demo", execd_version="0.1.0", protocol_version=1,
                      runtime="process", isolation="none", hostname="worker-1", pid=4242,
                      started_at=1732899000.5, workspace="/var/lib/sandpod/workspaces/demo",
                      max_request_bytes=_MiB, max_payload=_MiB, default_window=4 * _MiB,
                      max_window=16 * _MiB, default_max_output=16 * _MiB,
                      families=("exec", "sys"))),
    ],
    "exec.request": [
        ("full", ExecRequest(exec_id=_ID, argv=("python3", "-c", "print(input().upper())"),
                             cwd="/workspace/src", env={"LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1"},
                             stdin=b"hello\n", timeout=30.0, max_output=_MiB)),
        ("shell", ExecRequest(exec_id=_ID, shell="make test 2>&1 | tail -n 20", timeout=600.0)),
        ("minimal", ExecRequest(argv=("true",))),
    ],
    "exec.result": [
        ("full", ExecResult(exec_id=_ID, exit_code=0, stdout=b"HELLO\n", stderr=b"warn\n",
                            stdout_size=6, stderr_size=5, duration=0.042)),
        ("timed-out", ExecResult(exec_id=_ID, signal=9, stdout=b"step 1\n", stdout_size=7,
                                 timed_out=True, duration=30.001)),
        ("needs-fetch", ExecResult(exec_id=_ID, exit_code=0, stdout=b"\x00\x01\xfe\xff",
                                   stdout_size=3 * _MiB, duration=1.5)),
        ("truncated", ExecResult(exec_id=_ID, exit_code=0, stdout=b"y\n" * 4, stdout_size=8,
                                 stdout_truncated=True, duration=2.0)),
        ("minimal", ExecResult(exec_id=_ID, exit_code=0)),
    ],
    "exec.fetch": [
        ("full", ExecFetch(exec_id=_ID, stream="stdout", offset=4, max_bytes=_MiB - 1024)),
        ("minimal", ExecFetch(exec_id=_ID, stream="stderr", offset=0)),
    ],
    "exec.output_part": [
        ("basic", OutputPart(exec_id=_ID, stream="stdout", offset=4, data=b"\xfe\xff\n", eof=True)),
    ],
    "exec.start": [
        ("full", ExecStart(deliver=_INBOX, exec_id=_ID, argv=("python3", "-i"), cwd="/workspace",
                           env={"TERM": "dumb"}, stdin=b"import sys\n", stdin_open=True,
                           timeout=3600.0, window=_MiB, abandon_after=30.0)),
        ("shell", ExecStart(deliver=_INBOX, exec_id=_ID, shell="tail -f /var/log/app.log")),
        ("minimal", ExecStart(deliver=_INBOX, argv=("ls", "-l"))),
    ],
    "exec.started": [("basic", ExecStarted(exec_id=_ID, pid=31337, window=4 * _MiB))],
    "exec.ack": [
        ("basic", StreamAck(exec_id=_ID, seq=17)),
        ("keepalive", StreamAck(exec_id=_ID, seq=0)),
    ],
    "exec.stdin": [
        ("full", StdinWrite(exec_id=_ID, data=b"print(1)\n", eof=True)),
        ("data", StdinWrite(exec_id=_ID, data=b"\x04binary\x00")),
        ("minimal", StdinWrite(exec_id=_ID, eof=True)),
    ],
    "exec.signal": [("sigterm", ExecSignal(exec_id=_ID, signal=15))],
    "exec.ref": [("basic", ExecRef(exec_id=_ID))],
    "exec.resume": [
        ("full", ExecResume(exec_id=_ID, from_seq=18, deliver=_INBOX)),
        ("minimal", ExecResume(exec_id=_ID, from_seq=1)),
    ],
    "exec.status": [
        ("stream", ExecStatus(exec_id=_ID, state="running", pid=31337, next_seq=42, acked_seq=40)),
        ("minimal", ExecStatus(exec_id=_ID, state="exited")),
    ],
    "exec.chunk": [
        ("stdout", OutputChunk(exec_id=_ID, seq=1, stream="stdout", data=b"line 1\n")),
        ("stderr", OutputChunk(exec_id=_ID, seq=2, stream="stderr", data=b"\x1b[31merr\x1b[0m\n")),
    ],
    "exec.exit": [
        ("full", ExecExit(exec_id=_ID, seq=42, exit_code=0, duration=12.5, stdout_size=1048576,
                          stderr_size=12)),
        ("cancelled", ExecExit(exec_id=_ID, seq=3, signal=9, cancelled=True, duration=0.5)),
        ("abandoned", ExecExit(exec_id=_ID, seq=9, signal=9, abandoned=True, duration=60.0)),
        ("minimal", ExecExit(exec_id=_ID, seq=1)),
    ],
}  # fmt: skip

_REQ = to_map(_EXAMPLES["exec.request"][0][1])
_ACCEPT: list[tuple[str, type[Message], dict[str, Any], str]] = [
    ("unknown-fields", ExecRequest, {**_REQ, "priority": 5, "x_new": {"a": [1, b"\x00"]}},
     "unknown fields are ignored (and dropped on re-encoding)"),
    ("int-for-float", ExecRequest, {**_REQ, "timeout": 30}, "an int is accepted for a float"),
    ("nil-is-absent", ExecRequest, {**_REQ, "cwd": None}, "nil on a non-required field = absent"),
    ("any-key-order", ExecStatus, dict(reversed(to_map(_EXAMPLES["exec.status"][0][1]).items())),
     "keys may come in any order ('v' too)"),
]  # fmt: skip

_REF = {"v": 1, "exec_id": _ID}
_REJECT: list[tuple[str, type[Message], bytes, str, bool, str]] = [
    # (label, type, payload, error code, a JSON Schema validator catches it too, why)
    ("empty-payload", Empty, b"", "bad_request", False, "even an empty request is {'v': 1}"),
    ("garbage", ExecRef, b"\xc1", "bad_request", False, "0xc1 is never valid msgpack"),
    ("truncated", ExecRef, pack(_REF)[:-3], "bad_request", False, "msgpack cut short"),
    ("trailing-bytes", ExecRef, pack(_REF) + b"\x00", "bad_request", False, "data after the map"),
    ("not-a-map", ExecRef, pack([1, _ID]), "bad_request", True, "a message is always a map"),
    ("int-key", ExecRef, pack({**_REF, 1: 2}), "bad_request", False, "map keys are strings"),
    ("missing-v", ExecRef, pack({"exec_id": _ID}), "bad_request", True, "'v' is required"),
    ("missing-field", ExecRef, pack({"v": 1}), "bad_request", True, "exec_id is required"),
    ("version-too-new", ExecRef, pack({**_REF, "v": 2}), "bad_request.unsupported_version", True,
     "v newer than the receiver knows"),
    ("wrong-type", ExecRef, pack({"v": 1, "exec_id": 42}), "bad_request", True, "int for str"),
    ("bin-for-str", ExecRef, pack({"v": 1, "exec_id": _ID.encode()}), "bad_request", False,
     "text is msgpack str, never bin"),
    ("str-for-bin", StdinWrite, pack({**_REF, "data": "hi"}), "bad_request", False,
     "bytes are msgpack bin, never str (nor base64)"),
    ("bool-for-int", StreamAck, pack({**_REF, "seq": True}), "bad_request", True,
     "a bool is not an int"),
    ("float-for-int", StreamAck, pack({**_REF, "seq": 1.0}), "bad_request", True,
     "a float is not an int"),
    ("bad-enum", ExecFetch, pack({**_REF, "stream": "stdin", "offset": 0}), "bad_request", True,
     "stream is stdout or stderr"),
    ("argv-and-shell", ExecRequest, pack({"v": 1, "argv": ["ls"], "shell": "ls"}), "bad_request",
     True, "exactly one of argv or shell"),
    ("no-command", ExecRequest, pack({"v": 1, "cwd": "/workspace"}), "bad_request", True,
     "exactly one of argv or shell"),
    ("empty-argv", ExecRequest, pack({"v": 1, "argv": []}), "bad_request", True,
     "argv needs a program"),
    ("nul-in-argv", ExecRequest, pack({"v": 1, "argv": ["ls", "a\x00b"]}), "bad_request", True,
     "no NUL in argv, env, cwd, shell"),
    ("bad-env-name", ExecRequest, pack({"v": 1, "shell": "env", "env": {"A=B": "1"}}),
     "bad_request", True, "env names have no '=' or NUL"),
    ("zero-timeout", ExecRequest, pack({"v": 1, "shell": "ls", "timeout": 0.0}), "bad_request",
     True, "timeout > 0"),
    ("str-list-for-array", ExecRequest, pack({"v": 1, "argv": "ls -l"}), "bad_request", True,
     "argv is an array"),
    ("empty-deliver", ExecStart, pack({"v": 1, "deliver": "", "shell": "ls"}), "bad_request", True,
     "deliver must be a subject"),
    ("bad-signal", ExecSignal, pack({**_REF, "signal": 0}), "bad_request", True, "signal 1..64"),
    ("resume-from-zero", ExecResume, pack({**_REF, "from_seq": 0}), "bad_request", True,
     "seq starts at 1"),
    ("wrong-kind", OutputChunk, pack({**_REF, "kind": "exit", "seq": 1, "stream": "stdout",
     "data": b""}), "bad_request", True, "kind tells the frame types apart"),
]  # fmt: skip

_ERRORS: list[errors.SandpodError] = [
    errors.InternalError("RuntimeError in exec.run"),
    errors.BadRequest("exec.request: exactly one of 'argv' or 'shell' is required"),
    errors.PayloadTooLarge("request of 2097152 bytes exceeds 1048576", size=2097152, limit=_MiB),
    errors.UnsupportedVersion("exec.ref: version 2 is newer than supported 1", type="exec.ref",
                              version=2, supported=1),
    errors.UnknownSubject("no operation exec.frobnicate; see schemas/README.md",
                          subject="sandpod.sbx.demo.exec.frobnicate"),
    errors.ConnectionLost("NATS connection is closed"),
    errors.RequestTimeout("no reply on sandpod.sbx.demo.exec.status within 5s",
                          subject="sandpod.sbx.demo.exec.status", timeout=5.0),
    errors.Busy("1024 execs running (limit 1024)", limit=1024),
    errors.SandboxError(),
    errors.SandboxNotFound("sandpod.sbx.gone.exec.run is not served here"),
    errors.SandboxUnavailable("execd stopped answering during exec " + _ID),
    errors.ExecError(),
    errors.ExecNotFound(f"no streaming exec {_ID!r} in this execd", exec_id=_ID),
    errors.ExecLost(f"exec {_ID} finished but its reply never arrived"),
    errors.SpawnFailed("cannot start './build.sh': Permission denied", program="./build.sh",
                       errno=13),
    errors.CommandNotFound("'pytohn': command not found", program="pytohn"),
    errors.InvalidCwd("working directory '/workspace/nope' does not exist", cwd="/workspace/nope"),
    errors.StreamClosed("stdin is closed (already at EOF, or never opened)"),
    errors.error_from_wire({"code": "exec.quota_exceeded", "message": "CPU quota used up",
                            "retryable": True, "details": {"quota": "cpu"}}),
]  # fmt: skip


# -- schemas ---------------------------------------------------------------------------------------


def message_types() -> tuple[type[Message], ...]:
    """Every message type reachable from the catalogue: requests, replies, frames, nested ones."""
    seen: dict[str, type[Message]] = {}

    def visit(cls: type[Message]) -> None:
        if cls.TYPE not in seen:
            seen[cls.TYPE] = cls
            for tp in typing.get_type_hints(cls).values():
                for inner in _flatten(tp):
                    if isinstance(inner, type) and issubclass(inner, Message):
                        visit(inner)

    for op in DATA_PLANE:
        visit(op.request)
        if op.reply is not None:
            visit(op.reply)
    for frame in FRAMES:
        visit(frame)
    return tuple(seen.values())


def _flatten(tp: Any) -> Iterable[Any]:
    yield tp
    for arg in get_args(tp):
        yield from _flatten(arg)


def _type_schema(tp: Any) -> dict[str, Any]:  # noqa: PLR0911 - one branch per wire type
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        if len(options) != 1:
            raise TypeError(f"no schema for a union of several types: {tp!r}")
        return _type_schema(options[0])
    if origin is Literal:
        values = list(get_args(tp))
        out: dict[str, Any] = {"type": "string"} if all(isinstance(v, str) for v in values) else {}
        return {**out, "const": values[0]} if len(values) == 1 else {**out, "enum": values}
    if origin is tuple:
        return {"type": "array", "items": _type_schema(get_args(tp)[0])}
    if origin is dict:
        return {"type": "object", "additionalProperties": _type_schema(get_args(tp)[1])}
    if isinstance(tp, type) and issubclass(tp, Message):
        return {"$ref": f"{tp.TYPE}.schema.json"}
    if tp is bytes:
        return {"type": "string", "contentEncoding": "base64", "x-msgpack": "bin",
                "$comment": BIN_NOTE}  # fmt: skip
    if tp is float:
        return {"type": "number", "x-msgpack": "float64"}
    if tp in (str, int, bool):
        return {"type": {str: "string", int: "integer", bool: "boolean"}[tp]}
    raise TypeError(f"no schema for field type {tp!r}")


def _default(f: dataclasses.Field[Any]) -> tuple[bool, Any]:
    """(has a non-None default, its JSON form); a None default means "omitted", not a value."""
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return False, None
    return value is not None, to_json(value)


def message_schema(cls: type[Message]) -> dict[str, Any]:
    """The JSON Schema of message ``cls``.

    Raises:
        TypeError: a field type has no JSON Schema form.
        KeyError: ``_RULES`` names a field ``cls`` does not have.
    """
    hints = typing.get_type_hints(cls)
    comments = _field_comments(cls)
    fields = dataclasses.fields(cls)
    props: dict[str, Any] = {
        "v": {
            "type": "integer",
            "minimum": 1,
            "maximum": cls.VERSION,
            "description": f"schema version: encoders send {cls.VERSION}; a newer one is refused "
            "with bad_request.unsupported_version",
        }
    }
    for f in fields:
        props[f.name] = prop = _type_schema(hints[f.name])
        has_default, default = _default(f)
        if has_default:
            prop["default"] = default
        if f.name in comments:
            prop["description"] = comments[f.name]
    for name, rule in _RULES.get(cls.TYPE, {}).items():
        props[name].update(rule)  # KeyError for a stale rule
    required = [f.name for f in fields if not _default(f)[0] and _is_required(f)]
    return {
        "$schema": DIALECT,
        "$comment": LENIENCY,
        "title": cls.TYPE,
        "description": inspect.cleandoc(cls.__doc__ or cls.TYPE),
        "type": "object",
        "properties": props,
        "required": ["v", *required],
        "additionalProperties": True,
        "x-sandpod-type": cls.TYPE,
        "x-sandpod-version": cls.VERSION,
        "x-sandpod-field-order": ["v", *(f.name for f in fields)],
        **_MESSAGE_RULES.get(cls.TYPE, {}),
    }


def _is_required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def error_schema() -> dict[str, Any]:
    """The JSON Schema of the error reply envelope (vector type ``error``)."""
    order = ["code", "message", "retryable", "details"]
    error = {
        "type": "object",
        "description": "branch on code (or its family, see errors.json) and retryable; the "
        "message is for humans",
        "properties": {
            "code": {"type": "string"},
            "message": {"type": "string"},
            "retryable": {"type": "boolean"},
            "details": {"type": "object", "additionalProperties": True},
        },
        "required": order,
        "additionalProperties": True,
        "x-sandpod-field-order": order,
    }
    return {
        "$schema": DIALECT,
        "$comment": LENIENCY,
        "title": "error",
        "description": "A failed request's reply, sent instead of the reply message: a reply map "
        "with an 'error' key is an error.",
        "type": "object",
        "properties": {"v": {"type": "integer", "const": 1}, "error": error},
        "required": ["v", "error"],
        "additionalProperties": True,
        "x-sandpod-type": "error",
        "x-sandpod-version": 1,
        "x-sandpod-field-order": ["v", "error"],
    }


@cache
def _module_source(module: str) -> tuple[ast.Module, dict[int, str]]:
    """A module's syntax tree and its comments by line number."""
    source = Path(str(sys.modules[module].__file__)).read_text(encoding="utf-8")
    lines = iter(source.splitlines(keepends=True))
    comments = {
        tok.start[0]: tok.string.lstrip("#").strip()
        for tok in tokenize.generate_tokens(lines.__next__)
        if tok.type == tokenize.COMMENT
    }
    return ast.parse(source), comments


def _field_comments(cls: type) -> dict[str, str]:
    """The comment trailing each field's declaration: where the messages document fields."""
    tree, comments = _module_source(cls.__module__)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            return {
                stmt.target.id: comments[stmt.end_lineno]
                for stmt in node.body
                if isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and stmt.end_lineno in comments
            }
    return {}


# -- vectors ---------------------------------------------------------------------------------------


def to_json(value: Any) -> Any:
    """The JSON view of a msgpack value: bytes become ``{"$bytes": "<base64>"}``."""
    if isinstance(value, bytes):
        return {"$bytes": base64.b64encode(value).decode("ascii")}
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    return value


def _positive(name: str, cls: type[Message], wire: bytes, **meta: Any) -> dict[str, Any]:
    """A vector decoders must accept; carries the canonical form when ``wire`` is not canonical."""
    vector = {"name": name, "type": cls.TYPE, **meta}
    vector["json"], vector["msgpack_hex"] = to_json(unpack(wire)), wire.hex()
    canonical = encode(decode(cls, wire))
    if canonical != wire:
        vector["canonical_json"] = to_json(unpack(canonical))
        vector["canonical_msgpack_hex"] = canonical.hex()
    return vector


def _sparse(msg: Message) -> bytes:
    """``msg`` with the fields equal to their default left out (``kind`` discriminators stay)."""
    wire = to_map(msg)
    hints = typing.get_type_hints(type(msg))
    for f in dataclasses.fields(msg):
        has_default, default = _default(f)
        if has_default and get_origin(hints[f.name]) is not Literal:
            if to_json(wire.get(f.name)) == default:
                del wire[f.name]
    return pack(wire)


def _examples(cls: type[Message], prefix: str, meta: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for label, msg in _EXAMPLES[cls.TYPE]:
        out.append(_positive(f"{prefix}/{label}", cls, encode(msg), **meta))
        if (sparse := _sparse(msg)) != encode(msg):
            doc = "fields equal to their default left out: decoders fill the defaults in"
            out.append(_positive(f"{prefix}/{label}-sparse", cls, sparse, description=doc, **meta))
    return out


def _ops(cls: type[Message], role: Literal["request", "reply"]) -> list[str]:
    return [
        f"{op.family}.{op.verb}"
        for op in DATA_PLANE
        if (op.request if role == "request" else op.reply) is cls
    ]


def _family(cls: type[Message]) -> str:
    ops = _ops(cls, "request") or _ops(cls, "reply")
    return ops[0].split(".", 1)[0] if ops else cls.TYPE.split(".", 1)[0]


def _meta(cls: type[Message]) -> dict[str, Any]:
    if cls in FRAMES:
        return {"role": "frame", "subject_pattern": DELIVER}
    if ops := _ops(cls, "request"):
        return {"role": "request", "operations": ops, "subject_pattern": _subject(ops[0])}
    return {"role": "reply", "operations": _ops(cls, "reply")}


def _subject(operation: str) -> str:
    return DATA_SUBJECT.format(*operation.split("."))


def _vectors() -> dict[str, list[dict[str, Any]]]:
    """Test vectors by file stem: the family, or ``error`` for the error envelopes."""
    out: dict[str, list[dict[str, Any]]] = {}
    for op in DATA_PLANE:  # a request type shared by operations gets vectors on each subject
        meta = {**_meta(op.request), "operations": [name := f"{op.family}.{op.verb}"]}
        meta["subject_pattern"] = _subject(name)
        out.setdefault(op.family, []).extend(_examples(op.request, f"{name}/request", meta))
    replies = dict.fromkeys(op.reply for op in DATA_PLANE if op.reply is not None)
    for cls in [*(r for r in replies if r is not None), *FRAMES]:
        out.setdefault(_family(cls), []).extend(_examples(cls, cls.TYPE, _meta(cls)))
    for label, cls, wire, doc in _ACCEPT:
        name = f"{cls.TYPE}/{label}"
        out[_family(cls)].append(_positive(name, cls, pack(wire), description=doc, **_meta(cls)))
    for label, cls, payload, code, by_schema, why in _REJECT:
        out[_family(cls)].append({
            "name": f"{cls.TYPE}/reject/{label}",
            "type": cls.TYPE,
            "description": why,
            "msgpack_hex": payload.hex(),
            "error_code": code,
            "detected_by_schema": by_schema,
        })  # fmt: skip
    known = {cls.code for cls in _error_classes()}
    out["error"] = []
    for err in _ERRORS:
        vector = _positive_error(err)
        if err.code not in known:
            vector["description"] = "an unknown code: decoders map it to its family's base class"
            vector["family_fallback"] = type(err).code
        out["error"].append(vector)
    return out


def _positive_error(err: errors.SandpodError) -> dict[str, Any]:
    wire = encode_error(err)
    return {"name": f"error/{err.code}", "type": "error", "role": "error",
            "json": to_json(unpack(wire)), "msgpack_hex": wire.hex()}  # fmt: skip


# -- catalogues ------------------------------------------------------------------------------------


def _error_classes() -> list[type[errors.SandpodError]]:
    found = [getattr(errors, name) for name in errors.__all__]
    root = errors.SandpodError
    return [c for c in found if isinstance(c, type) and issubclass(c, root) and c is not root]


def _errors_doc() -> dict[str, Any]:
    parent: dict[str, str | None] = {}
    for cls in _error_classes():
        base = cls.__mro__[1]
        parent[cls.code] = None if base is errors.SandpodError else base.code  # type: ignore[attr-defined]
    return {
        "envelope": 'a failed request\'s reply: {"v": 1, "error": {"code", "message", '
        '"retryable", "details"}}',
        "unknown_codes": "map to the known code equal to the code's first dot-separated segment, "
        "else to '<segment>.error', else to the root error; keep the code and the wire's "
        "retryable",
        "codes": [{**e, "parent": parent[e["code"]]} for e in errors.error_catalogue()],
    }


def _subjects_doc() -> dict[str, Any]:
    kinds = [{"kind": get_args(typing.get_type_hints(f)["kind"])[0], "type": f.TYPE} for f in FRAMES]
    return {
        "default_prefix": subjects.DEFAULT_PREFIX,
        "protocol_version": PROTOCOL_VERSION,
        "patterns": {
            "control": "<prefix>.api.<kind>.<verb>",
            "data": "<prefix>.sbx.<sandbox>.<family>.<verb>",
            "sandbox_all": "<prefix>.sbx.<sandbox>.>",
            "events": "<prefix>.events.<kind>.<name>.<type>",
        },
        "sandbox_id_pattern": subjects.SANDBOX_ID_RE.pattern,
        "token_pattern": subjects._TOKEN_RE.pattern,  # one source for the rule
        "operations": [
            {
                "subject": _subject(f"{op.family}.{op.verb}"),
                "family": op.family,
                "verb": op.verb,
                "request": op.request.TYPE,
                "reply": op.reply.TYPE if op.reply is not None else None,
                "doc": op.doc,
            }
            for op in DATA_PLANE
        ],
        "frames": {"subject": DELIVER, "discriminator": "kind", "types": kinds},
    }


# -- files -----------------------------------------------------------------------------------------


def _dump(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, indent=2) + "\n"


def render() -> dict[str, str]:
    """Every generated file: path relative to the repository root -> its content."""
    files = {
        f"schemas/messages/{cls.TYPE}.schema.json": _dump(message_schema(cls))
        for cls in message_types()
    }
    files["schemas/messages/error.schema.json"] = _dump(error_schema())
    for family, vectors in _vectors().items():
        files[f"schemas/vectors/{family}.json"] = _dump({"family": family, "vectors": vectors})
    files["schemas/errors.json"] = _dump(_errors_doc())
    files["schemas/subjects.json"] = _dump(_subjects_doc())
    return dict(sorted(files.items()))


def stale(root: Path) -> list[str]:
    """Generated files under ``root`` that are missing, differ, or are no longer generated."""
    files = render()
    changed = [
        rel
        for rel, text in files.items()
        if not (root / rel).is_file() or (root / rel).read_text(encoding="utf-8") != text
    ]
    owned = {
        path.relative_to(root).as_posix()
        for folder, pattern in (("messages", "*.schema.json"), ("vectors", "*.json"))
        for path in (root / "schemas" / folder).glob(pattern)
    }
    return sorted([*changed, *(owned - files.keys())])


def write(root: Path) -> list[str]:
    """Bring every generated file under ``root`` up to date; returns the paths touched."""
    files = render()
    todo = stale(root)
    for rel in todo:
        if rel in files:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(files[rel], encoding="utf-8")
        else:
            (root / rel).unlink()
    return todo


def find_root(start: Path | None = None) -> Path:
    """The repository root holding this binding (the directory with ``schemas/python``).

    Raises:
        FileNotFoundError: this module is not inside a checkout (pass ``--root``).
    """
    here = (start or Path(__file__)).resolve()
    for parent in here.parents:
        if (parent / "schemas" / "python" / "src" / "sandpod_contract").is_dir():
            return parent
    raise FileNotFoundError(f"no repository root above {here}; pass --root")


def main(argv: Sequence[str] | None = None, out: Callable[[str], object] = print) -> int:
    """Write the generated files, or with ``--check`` list stale ones; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m sandpod_contract.schemagen")
    parser.add_argument("--check", action="store_true", help="list stale files; exit 1 if any")
    parser.add_argument("--root", type=Path, help="repository root (default: this checkout)")
    args = parser.parse_args(argv)
    root: Path = args.root or find_root()
    if args.check:
        todo = stale(root)
        for rel in todo:
            out(f"stale: {rel}")
        if todo:
            out("regenerate with: python -m sandpod_contract.schemagen")
        return 1 if todo else 0
    for rel in write(root):
        out(f"wrote: {rel}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
