"""The catalogue files of ``schemas/``: ``errors.json`` and ``subjects.json`` (part of
``schemagen``, kept apart so each module stays readable).

``subjects.json`` is what a client in another language reads to learn every subject: the
planes (who answers, queue group, errors any request may get), each operation of the data,
control and node planes, the events and the stream frames; all of it comes from
:mod:`sandpod_contract.catalogue`.
"""

from __future__ import annotations

import typing
from typing import Any, get_args

from sandpod_contract import error_spec, errors, subjects
from sandpod_contract.catalogue import (
    CONTROL_PLANES,
    DATA,
    DATA_PLANE,
    EVENTS,
    FRAMES,
    NODE,
    PLANES,
    PROTOCOL_VERSION,
    Operation,
    Plane,
)

__all__ = ["DELIVER", "error_classes", "errors_doc", "subjects_doc"]

DELIVER = "<deliver>"


def error_classes() -> list[type[errors.SandpodError]]:
    found = [getattr(errors, name) for name in errors.__all__]
    root = errors.SandpodError
    return [c for c in found if isinstance(c, type) and issubclass(c, root) and c is not root]


def _details_doc(code: str) -> dict[str, Any]:
    spec = error_spec.DETAILS.get(code, error_spec.Details())
    return {
        "required": {k: {"type": d.type, "doc": d.doc} for k, d in spec.required.items()},
        "optional": {k: {"type": d.type, "doc": d.doc} for k, d in spec.optional.items()},
    }


def errors_doc() -> dict[str, Any]:
    parent: dict[str, str | None] = {}
    for cls in error_classes():
        base = cls.__bases__[0]
        if issubclass(base, errors.SandpodError) and base is not errors.SandpodError:
            parent[cls.code] = base.code
        else:
            parent[cls.code] = None
    return {
        "envelope": 'a failed request\'s reply: {"v": 1, "error": {"code", "message", '
        '"retryable", "details"}}; unknown keys inside "error" are ignored',
        "unknown_codes": "map to the longest known code that is a dot-prefix of it "
        "('exec.spawn_failed.x' -> 'exec.spawn_failed', 'bad_request.x' -> 'bad_request'), "
        "else to '<first segment>.error' ('exec.x' -> 'exec.error'), else to 'internal'; keep "
        "the code and the wire's retryable and details",
        "details": "per code: keys every sender includes (required) and may include "
        "(optional), with their wire types; other keys may appear: ignore them. Nil values in "
        "details are values (details is a free map)",
        "bad_request_reasons": dict(error_spec.BAD_REQUEST_REASONS),
        "bad_request_field_reasons": sorted(error_spec.FIELD_REASONS),
        "transport": [
            {"condition": t.condition, "seen": t.seen, "code": t.code, "doc": t.doc}
            for t in error_spec.TRANSPORT
        ],
        "codes": [
            {**e, "parent": parent[e["code"]], "details": _details_doc(e["code"])}
            for e in errors.error_catalogue()
        ],
    }


def _codes(plane: Plane, op: Operation) -> list[str]:
    """Every code ``op`` may reply with: the plane's, then its own."""
    return list(dict.fromkeys(e.code for e in (*plane.errors, *op.errors)))


_TOKEN = {"data": "<family>", "control": "<kind>", "node": "<service>"}  # as in "patterns"


def _plane_doc(plane: Plane) -> dict[str, Any]:
    return {
        "plane": plane.name,
        "subject": plane.subject.format(family=_TOKEN[plane.name], verb="<verb>"),
        "served_by": plane.served_by,
        "queue_group": plane.queue,
        "families": list(dict.fromkeys(op.family for op in plane.operations)),
        "errors": [e.code for e in plane.errors],
        "doc": plane.doc,
    }


def _op_doc(plane: Plane, op: Operation, family_key: str) -> dict[str, Any]:
    return {
        "subject": plane.subject_of(op),
        family_key: op.family,
        "verb": op.verb,
        "request": op.request.TYPE,
        "reply": op.reply.TYPE if op.reply is not None else None,
        "doc": op.doc,
        "served_by": plane.served_by,
        "queue_group": plane.queue,
        "errors": _codes(plane, op) if op.reply is not None else [],  # publish only: no reply
    }


def subjects_doc() -> dict[str, Any]:
    kinds = [
        {"kind": get_args(typing.get_type_hints(f)["kind"])[0], "type": f.TYPE} for f in FRAMES
    ]
    return {
        "default_prefix": subjects.DEFAULT_PREFIX,
        "protocol_version": PROTOCOL_VERSION,
        "patterns": {
            "control": "<prefix>.api.<kind>.<verb>",
            "data": "<prefix>.sbx.<sandbox>.<family>.<verb>",
            "sandbox_all": "<prefix>.sbx.<sandbox>.>",
            "node": "<prefix>.node.<node>.<service>.<verb>",
            "events": "<prefix>.events.<kind>.<name>.<type>",
        },
        "sandbox_id_pattern": subjects.SANDBOX_ID_RE.pattern,
        "token_pattern": subjects.TOKEN_RE.pattern,  # one source for the rule
        "planes": [_plane_doc(plane) for plane in PLANES],
        "operations": [_op_doc(DATA, op, "family") for op in DATA_PLANE],
        "control_operations": [
            _op_doc(plane, op, "kind") for plane in CONTROL_PLANES for op in plane.operations
        ],
        "node_operations": [_op_doc(NODE, op, "service") for op in NODE.operations],
        "events": [
            {
                "kind": e.kind,
                "subject": e.subject,
                "message": e.message.TYPE,
                "types": list(e.types),
                "published_by": e.published_by,
                "stream": e.stream,
                "doc": e.doc,
            }
            for e in EVENTS
        ],
        "frames": {"subject": DELIVER, "discriminator": "kind", "types": kinds},
    }
