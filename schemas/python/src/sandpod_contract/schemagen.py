"""Generate the language-neutral contract in ``schemas/`` from this binding.

A client in another language must be writable from ``schemas/`` alone, and this binding is the
source of truth, so those files are derived from it, never written by hand:

- ``messages/<TYPE>.schema.json``: JSON Schema (draft 2020-12) per message, from the dataclass type
  hints, defaults and trailing field comments, plus the value rules ``__post_init__`` enforces;
  ``messages/error.schema.json`` for the error reply envelope;
- ``vectors/<family>.json``: realistic examples encoded by the real codec, payloads a decoder
  must accept although they are not canonical, and payloads it must reject with the expected
  error code; ``vectors/error.json``: one error envelope per error code;
- ``errors.json`` (error catalogue) and ``subjects.json`` (every plane's operations, events,
  frames), rendered by ``_schemagen_catalogues``.

The hand-written inputs (value rules, examples, rejects) live in ``_schemagen_data``.

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
import re
import sys
import tokenize
import types
import typing
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from sandpod_contract import errors
from sandpod_contract._schemagen_catalogues import (
    DELIVER,
    error_classes,
    errors_doc,
    subjects_doc,
)
from sandpod_contract._schemagen_data import (
    ACCEPT,
    ERROR_ACCEPT,
    ERRORS,
    EXAMPLES,
    MESSAGE_RULES,
    REJECT,
    RULES,
)
from sandpod_contract.catalogue import (
    DATA,
    EVENTS,
    FRAMES,
    PLANES,
    EventStream,
    Operation,
    Plane,
)
from sandpod_contract.codec import Message, decode, encode, encode_error, pack, to_map, unpack

__all__ = [
    "error_schema",
    "find_root",
    "main",
    "message_schema",
    "message_types",
    "render",
    "stale",
    "to_json",
    "vectors",
    "write",
]

DIALECT = "https://json-schema.org/draft/2020-12/schema"
BIN_NOTE = "msgpack bin on the wire, never base64; base64 only in this JSON view"
LENIENCY = (
    "Wire form: a msgpack map with string keys, 'v' first, then the set fields in "
    "x-sandpod-field-order; nil fields are omitted. This schema describes what encoders send. "
    "Decoders also accept unknown fields (ignored), any key order, nil on a non-required field "
    "(= absent: the default applies) and an integer where a number is expected."
)

# -- schemas ---------------------------------------------------------------------------------------


def message_types() -> tuple[type[Message], ...]:
    """Every message type reachable from the catalogue: requests and replies of every plane,
    frames, events, and the messages nested in them."""
    seen: dict[str, type[Message]] = {}

    def visit(cls: type[Message]) -> None:
        if cls.TYPE not in seen:
            seen[cls.TYPE] = cls
            for tp in typing.get_type_hints(cls).values():
                for inner in _flatten(tp):
                    if isinstance(inner, type) and issubclass(inner, Message):
                        visit(inner)

    for _, op in _all_ops():
        visit(op.request)
        if op.reply is not None:
            visit(op.reply)
    for frame in FRAMES:
        visit(frame)
    for events in EVENTS:
        visit(events.message)
    return tuple(seen.values())


def _all_ops() -> Iterable[tuple[Plane, Operation]]:
    """Every operation with its plane, data plane first (the order of the generated files)."""
    return ((plane, op) for plane in PLANES for op in plane.operations)


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
        value = get_args(tp)[1]  # Any: an open map (Kubernetes-shaped objects)
        return {
            "type": "object",
            "additionalProperties": True if value is Any else _type_schema(value),
        }
    if isinstance(tp, type) and issubclass(tp, Message):
        return {"$ref": f"{tp.TYPE}.schema.json"}
    if tp is bytes:
        return {
            "type": "string",
            "contentEncoding": "base64",
            "x-msgpack": "bin",
            "$comment": BIN_NOTE,
        }
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
        KeyError: ``RULES`` names a field ``cls`` does not have.
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
            prop["description"] = _markdown(comments[f.name])
    for name, rule in RULES.get(cls.TYPE, {}).items():
        _merge_rule(props[name], rule)  # KeyError for a stale rule
    required = [f.name for f in fields if _is_required(f) or _is_discriminator(cls, f.name)]
    for name in required:
        props[name].pop("default", None)  # a required field has no default to fall back on
    return {
        "$schema": DIALECT,
        "$comment": LENIENCY,
        "title": cls.TYPE,
        "description": _markdown(inspect.cleandoc(cls.__doc__ or cls.TYPE)),
        "type": "object",
        "properties": props,
        "required": ["v", *required],
        "additionalProperties": True,
        "x-sandpod-type": cls.TYPE,
        "x-sandpod-version": cls.VERSION,
        "x-sandpod-field-order": ["v", *(f.name for f in fields)],
        **MESSAGE_RULES.get(cls.TYPE, {}),
    }


def _markdown(text: str) -> str:
    """reST literals and roles (``x``, :class:`X`) as Markdown code spans, for any reader."""
    return re.sub(r":[a-z]+:`", "`", text.replace("``", "`"))


def _merge_rule(schema: dict[str, Any], rule: dict[str, Any]) -> None:
    """Add a value rule's keywords to a field's type schema; nested schemas (``items``,
    ``additionalProperties``) are merged, so a rule on the items keeps the items' ``type``."""
    for key, value in rule.items():
        if isinstance(value, dict) and isinstance(schema.get(key), dict):
            schema[key] = {**schema[key], **value}
        else:
            schema[key] = value


def _is_discriminator(cls: type[Message], name: str) -> bool:
    """``kind`` of a frame: what tells the frame types apart, so it is required on the wire (the
    decoder refuses a frame without it) although the binding fills it in when building one."""
    return name == cls.DISCRIMINATOR


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
        "properties": {
            "v": {
                "type": "integer",
                "minimum": 1,
                "maximum": 1,
                "description": "schema version of the envelope: encoders send 1; a newer one "
                "is refused with bad_request.unsupported_version",
            },
            "error": error,
        },
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
        discriminator = get_origin(hints[f.name]) is Literal
        if has_default and not discriminator and to_json(wire.get(f.name)) == default:
            del wire[f.name]
    return pack(wire)


def _examples(cls: type[Message], prefix: str, meta: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for label, msg in EXAMPLES[cls.TYPE]:
        out.append(_positive(f"{prefix}/{label}", cls, encode(msg), **meta))
        if label == "minimal" and (sparse := _sparse(msg)) != encode(msg):
            doc = "fields equal to their default left out: decoders fill the defaults in"
            out.append(_positive(f"{prefix}/{label}-sparse", cls, sparse, description=doc, **meta))
    return out


def _name(op: Operation) -> str:
    return f"{op.family}.{op.verb}"


def _stem(plane: Plane, op: Operation) -> str:
    """The vectors file of ``op``'s requests: its family on the data plane, else the plane's."""
    return op.family if plane is DATA else {"control": "api", "node": "node"}[plane.name]


def _uses(cls: type[Message], role: Literal["request", "reply"]) -> list[tuple[Plane, Operation]]:
    return [
        (p, op) for p, op in _all_ops() if (op.request if role == "request" else op.reply) is cls
    ]


def _ops(cls: type[Message], role: Literal["request", "reply"]) -> list[str]:
    return [_name(op) for _, op in _uses(cls, role)]


def _nested() -> dict[type[Message], list[str]]:
    """Messages only ever found inside others, with the types that carry them."""
    top = {c for _, op in _all_ops() for c in (op.request, op.reply) if c is not None}
    top |= {*FRAMES, *(e.message for e in EVENTS)}
    within: dict[type[Message], list[str]] = {}
    for cls in message_types():
        for tp in typing.get_type_hints(cls).values():
            for inner in _flatten(tp):
                if isinstance(inner, type) and issubclass(inner, Message) and inner not in top:
                    within.setdefault(inner, [])
                    if cls.TYPE not in within[inner]:
                        within[inner].append(cls.TYPE)
    return within


def _events(cls: type[Message]) -> EventStream | None:
    return next((e for e in EVENTS if e.message is cls), None)


def _family(cls: type[Message]) -> str:
    if uses := _uses(cls, "request") or _uses(cls, "reply"):
        return _stem(*uses[0])
    return "event" if _events(cls) else cls.TYPE.split(".", 1)[0]


def _meta(cls: type[Message]) -> dict[str, Any]:
    if cls in FRAMES:
        return {"role": "frame", "subject_pattern": DELIVER}
    if (events := _events(cls)) is not None:
        return {"role": "event", "subject_pattern": events.subject}
    if uses := _uses(cls, "request"):  # shown as sent on its first operation
        plane, op = uses[0]
        return {
            "role": "request",
            "operations": [_name(op)],
            "subject_pattern": plane.subject_of(op),
        }
    return {"role": "reply", "operations": _ops(cls, "reply")}


def vectors() -> dict[str, list[dict[str, Any]]]:
    """Test vectors by file stem: the family, or ``error`` for the error envelopes."""
    out: dict[str, list[dict[str, Any]]] = {}
    for plane, op in _all_ops():  # a request type shared by operations: vectors on each subject
        name = _name(op)
        meta = {"role": "request", "operations": [name], "subject_pattern": plane.subject_of(op)}
        out.setdefault(_stem(plane, op), []).extend(_examples(op.request, f"{name}/request", meta))
    replies = dict.fromkeys(op.reply for _, op in _all_ops() if op.reply is not None)
    events = [e.message for e in EVENTS]
    for cls in [*(r for r in replies if r is not None), *FRAMES, *events]:
        out.setdefault(_family(cls), []).extend(_examples(cls, cls.TYPE, _meta(cls)))
    nested = _nested()
    for label, cls, wire, doc in ACCEPT:
        name = f"{cls.TYPE}/{label}"
        raw = wire if isinstance(wire, bytes) else pack(wire)
        out[_family(cls)].append(_positive(name, cls, raw, description=doc, **_role(cls, nested)))
    for label, cls, payload, code, by_schema, why in REJECT:
        out[_family(cls)].append(
            {
                "name": f"{cls.TYPE}/reject/{label}",
                "type": cls.TYPE,
                **_role(cls, nested),
                "description": why,
                "msgpack_hex": payload.hex(),
                "error_code": code,
                **_reason(cls, payload),
                "detected_by_schema": by_schema,
            }
        )
    for cls, within in nested.items():  # after the rest: earlier vectors keep their place
        meta = {"role": "nested", "within": within}
        out.setdefault(_family(cls), []).extend(_examples(cls, cls.TYPE, meta))
    known = {cls.code for cls in error_classes()}
    out["error"] = []
    for err in ERRORS:
        vector = _positive_error(err)
        if err.code not in known:
            vector["description"] = "an unknown code: decoders map it to its family's base class"
            vector["family_fallback"] = type(err).code
        out["error"].append(vector)
    for label, wire, doc in ERROR_ACCEPT:
        vector = _positive_error_wire(f"error/{label}", pack(wire))
        out["error"].append({**vector, "description": doc})
    return out


def _role(cls: type[Message], nested: dict[type[Message], list[str]]) -> dict[str, Any]:
    """The role keys of a vector of ``cls``: as its positive vectors have them."""
    return {"role": "nested", "within": nested[cls]} if cls in nested else _meta(cls)


def _reason(cls: type[Message], payload: bytes) -> dict[str, Any]:
    """``error_reason`` of a negative vector: the ``details.reason`` its decoding gives (for
    ``bad_request``), so other implementations can check their reason codes too.

    Raises:
        ValueError: the binding accepts the payload (a stale reject vector).
    """
    try:
        decode(cls, payload)
    except errors.SandpodError as err:
        reason = err.details.get("reason")
        return {"error_reason": reason} if err.code == "bad_request" else {}
    raise ValueError(f"{cls.TYPE}: the binding accepts reject payload {payload.hex()}")


def _positive_error_wire(name: str, wire: bytes) -> dict[str, Any]:
    """An error envelope decoders must accept as it is; carries its canonical re-encoding."""
    vector = {"name": name, "type": "error", "role": "error"}
    vector["json"], vector["msgpack_hex"] = to_json(unpack(wire)), wire.hex()
    err = errors.error_from_wire(unpack(wire)["error"])
    if err.code not in {cls.code for cls in error_classes()}:
        vector["family_fallback"] = type(err).code
    canonical = encode_error(err)
    if canonical != wire:
        vector["canonical_json"] = to_json(unpack(canonical))
        vector["canonical_msgpack_hex"] = canonical.hex()
    return vector


def _positive_error(err: errors.SandpodError) -> dict[str, Any]:
    wire = encode_error(err)
    return {
        "name": f"error/{err.code}",
        "type": "error",
        "role": "error",
        "json": to_json(unpack(wire)),
        "msgpack_hex": wire.hex(),
    }


# -- files -----------------------------------------------------------------------------------------


_VIEWS = frozenset({"json", "canonical_json"})


def _sorted(obj: Any) -> Any:
    """``obj`` with every map's keys sorted, except inside a vector's JSON views: those keep the
    order of the msgpack map they show (key order is part of what a vector pins)."""
    if isinstance(obj, dict):
        return {k: obj[k] if k in _VIEWS else _sorted(obj[k]) for k in sorted(obj)}
    if isinstance(obj, list):
        return [_sorted(v) for v in obj]
    return obj


def _dump(obj: Any) -> str:
    return json.dumps(_sorted(obj), indent=2) + "\n"


def render() -> dict[str, str]:
    """Every generated file: path relative to the repository root -> its content."""
    files = {
        f"schemas/messages/{cls.TYPE}.schema.json": _dump(message_schema(cls))
        for cls in message_types()
    }
    files["schemas/messages/error.schema.json"] = _dump(error_schema())
    for family, vecs in vectors().items():
        files[f"schemas/vectors/{family}.json"] = _dump({"family": family, "vectors": vecs})
    files["schemas/errors.json"] = _dump(errors_doc())
    files["schemas/subjects.json"] = _dump(subjects_doc())
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
