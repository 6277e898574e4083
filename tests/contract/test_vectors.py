"""The language-neutral contract in ``schemas/`` agrees with the Python binding and is complete.

Reads the generated files from disk (what implementers in other languages use), checks every
vector against the codec and its JSON Schema (with the small validator below, which knows exactly
the keywords the generator emits and fails on any other), and that nothing is stale.
"""

from __future__ import annotations

import base64
import binascii
import importlib
import json
import pkgutil
import re
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

import sandpod_contract
from sandpod_contract import codec, errors, schemagen
from sandpod_contract.catalogue import (
    CONTROL_PLANES,
    DATA_PLANE,
    EVENTS,
    FRAMES,
    NODE,
    PLANES,
)
from sandpod_contract.messages.exec import ExecRef
from sandpod_contract.subjects import Subjects


@pytest.fixture(scope="session")
def _session_daemons() -> None:
    """No nats-server or execd: these tests are pure (overrides the root conftest's autouse one)."""


ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas"
TYPES = {cls.TYPE: cls for cls in schemagen.message_types()}
ERROR_CLASSES = {
    cls.code: cls
    for cls in (getattr(errors, name) for name in errors.__all__)
    if isinstance(cls, type)
    and issubclass(cls, errors.SandpodError)
    and cls is not errors.SandpodError
}


def _load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


VECTORS: list[dict[str, Any]] = [
    v for path in sorted((SCHEMAS / "vectors").glob("*.json")) for v in _load(path)["vectors"]
]
POSITIVE = [v for v in VECTORS if "json" in v and v["type"] != "error"]
NEGATIVE = [v for v in VECTORS if "error_code" in v]
SCHEMA_DETECTED = [v for v in NEGATIVE if v["detected_by_schema"]]
ENVELOPES = [v for v in VECTORS if v["type"] == "error"]


def _ids(vectors: list[dict[str, Any]]) -> list[str]:
    return [v["name"] for v in vectors]


def from_json(value: Any) -> Any:
    """The msgpack value of a vector's JSON view (``{"$bytes": b64}`` -> bytes)."""
    if isinstance(value, dict):
        if set(value) == {"$bytes"}:
            return base64.b64decode(value["$bytes"], validate=True)
        return {k: from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_json(v) for v in value]
    return value


def schema_view(value: Any) -> Any:
    """What a JSON Schema sees: bytes as their base64 text."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dict):
        return {str(k): schema_view(v) for k, v in value.items()}
    if isinstance(value, list):
        return [schema_view(v) for v in value]
    return value


# -- a tiny JSON Schema validator for the subset schemagen emits -----------------------------------

ANNOTATIONS = {"$schema", "$comment", "title", "description", "default"}
ASSERTIONS = {
    "$ref",
    "type",
    "const",
    "enum",
    "properties",
    "required",
    "additionalProperties",
    "propertyNames",
    "items",
    "prefixItems",
    "minItems",
    "minLength",
    "pattern",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "oneOf",
    "anyOf",
    "allOf",
    "not",
    "maxProperties",
    "contentEncoding",
}


@cache
def schema_of(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = _load(SCHEMAS / "messages" / name)
    return schema


def _is_type(value: Any, kind: str) -> bool:
    if kind == "integer":  # JSON Schema: any number with a zero fractional part
        return not isinstance(value, bool) and (
            isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        )
    checks: dict[str, Any] = {
        "string": str,
        "number": (int, float),
        "boolean": bool,
        "object": dict,
        "array": list,
    }
    return isinstance(value, checks[kind]) and not (kind == "number" and isinstance(value, bool))


def validate(value: Any, schema: dict[str, Any], at: str = "$") -> list[str]:
    """Every violation of ``schema`` by ``value`` (empty when valid)."""
    unknown = set(schema) - ANNOTATIONS - ASSERTIONS - {k for k in schema if k.startswith("x-")}
    assert not unknown, f"validator does not know keywords {unknown} (at {at})"
    out: list[str] = []
    if "$ref" in schema:
        out += validate(value, schema_of(schema["$ref"]), at)
    if "type" in schema and not _is_type(value, schema["type"]):
        return [*out, f"{at}: expected {schema['type']}, got {type(value).__name__}"]
    if "const" in schema and value != schema["const"]:
        out.append(f"{at}: expected {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{at}: {value!r} not in {schema['enum']}")
    if "oneOf" in schema:
        matched = sum(not validate(value, sub, at) for sub in schema["oneOf"])
        if matched != 1:
            out.append(f"{at}: matches {matched} of oneOf, not exactly 1")
    if "anyOf" in schema and all(validate(value, sub, at) for sub in schema["anyOf"]):
        out.append(f"{at}: matches none of anyOf")
    for sub in schema.get("allOf", []):
        out += validate(value, sub, at)
    if "not" in schema and not validate(value, schema["not"], at):
        out.append(f"{at}: matches what 'not' forbids")
    if isinstance(value, dict):
        out += _validate_object(value, schema, at)
    if isinstance(value, list):
        prefix = schema.get("prefixItems", [])
        if len(value) < schema.get("minItems", 0):
            out.append(f"{at}: fewer than {schema['minItems']} items")
        for i, item in enumerate(value):
            sub = prefix[i] if i < len(prefix) else schema.get("items")
            if sub is not None:
                out += validate(item, sub, f"{at}[{i}]")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            out.append(f"{at}: shorter than {schema['minLength']}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            out.append(f"{at}: does not match {schema['pattern']}")
        if schema.get("contentEncoding") == "base64":
            try:
                base64.b64decode(value, validate=True)
            except binascii.Error:
                out.append(f"{at}: not base64")
    if _is_type(value, "number"):
        if "minimum" in schema and value < schema["minimum"]:
            out.append(f"{at}: below {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            out.append(f"{at}: above {schema['maximum']}")
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            out.append(f"{at}: not above {schema['exclusiveMinimum']}")
    return out


def _validate_object(value: dict[str, Any], schema: dict[str, Any], at: str) -> list[str]:
    out = [f"{at}: missing {k!r}" for k in schema.get("required", []) if k not in value]
    if len(value) > schema.get("maxProperties", len(value)):
        out.append(f"{at}: more than {schema['maxProperties']} entries")
    props = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        if "propertyNames" in schema:
            out += validate(key, schema["propertyNames"], f"{at}<{key}>")
        if key in props:
            out += validate(item, props[key], f"{at}.{key}")
        elif extra is False:
            out.append(f"{at}: unexpected {key!r}")
        elif isinstance(extra, dict):
            out += validate(item, extra, f"{at}.{key}")
    return out


def test_validator_rejects_what_it_should() -> None:
    """The test validator itself catches type, required, rule and oneOf violations."""
    schema = schema_of("exec.request.schema.json")
    assert validate({"v": 1, "shell": "ls"}, schema) == []
    assert validate({"v": 1}, schema)  # neither argv nor shell
    assert validate({"v": 1, "argv": [""]}, schema)
    assert validate({"v": 1, "shell": "ls", "timeout": 0}, schema)
    assert validate({"v": 1, "shell": "ls", "env": {"A=B": "x"}}, schema)
    assert validate({"v": "1", "shell": "ls"}, schema)
    assert validate({"v": True, "shell": "ls"}, schema)
    owner = schema_of("fs.owner.schema.json")  # anyOf, allOf + not
    assert validate({"v": 1, "uid": 0, "group": "staff"}, owner) == []
    assert validate({"v": 1}, owner)
    assert validate({"v": 1, "gid": 0, "group": "staff"}, owner)
    tags = schema_of("proc.start.schema.json")  # maxProperties
    assert validate({"v": 1, "shell": "true", "tags": {f"t{i}": "" for i in range(17)}}, tags)


# -- vectors against the codec ---------------------------------------------------------------------


@pytest.mark.parametrize("vector", POSITIVE, ids=_ids(POSITIVE))
def test_positive_vector_decodes_to_its_json(vector: dict[str, Any]) -> None:
    """The bytes unpack to the json view and decode to a message mapping to the canonical json."""
    data = bytes.fromhex(vector["msgpack_hex"])
    assert codec.unpack(data) == from_json(vector["json"])
    msg = codec.decode(TYPES[vector["type"]], data)
    assert codec.to_map(msg) == from_json(vector.get("canonical_json", vector["json"]))


@pytest.mark.parametrize("vector", POSITIVE, ids=_ids(POSITIVE))
def test_positive_vector_reencodes_to_canonical_bytes(vector: dict[str, Any]) -> None:
    """Re-encoding the decoded message gives exactly the canonical bytes."""
    msg = codec.decode(TYPES[vector["type"]], bytes.fromhex(vector["msgpack_hex"]))
    expected = vector.get("canonical_msgpack_hex", vector["msgpack_hex"])
    assert codec.encode(msg).hex() == expected
    assert codec.unpack(bytes.fromhex(expected)) == from_json(
        vector.get("canonical_json", vector["json"])
    )


@pytest.mark.parametrize("vector", POSITIVE, ids=_ids(POSITIVE))
def test_canonical_keys_follow_the_schema_field_order(vector: dict[str, Any]) -> None:
    """Canonical bytes list 'v' first, then fields in the schema's x-sandpod-field-order."""
    data = bytes.fromhex(vector.get("canonical_msgpack_hex", vector["msgpack_hex"]))
    keys = list(codec.unpack(data))
    order = schema_of(f"{vector['type']}.schema.json")["x-sandpod-field-order"]
    assert keys[0] == "v"
    assert keys == [k for k in order if k in keys]


@pytest.mark.parametrize("vector", POSITIVE, ids=_ids(POSITIVE))
def test_positive_vector_matches_its_schema(vector: dict[str, Any]) -> None:
    """The canonical JSON view of every positive vector is valid against its JSON Schema."""
    value = schema_view(from_json(vector.get("canonical_json", vector["json"])))
    assert validate(value, schema_of(f"{vector['type']}.schema.json")) == []


@pytest.mark.parametrize("vector", NEGATIVE, ids=_ids(NEGATIVE))
def test_negative_vector_is_rejected_with_its_code(vector: dict[str, Any]) -> None:
    """Decoding a negative vector raises the typed error carrying the vector's error code."""
    with pytest.raises(errors.BadRequest) as caught:
        codec.decode(TYPES[vector["type"]], bytes.fromhex(vector["msgpack_hex"]))
    assert caught.value.code == vector["error_code"]
    assert isinstance(caught.value, ERROR_CLASSES[vector["error_code"]])


@pytest.mark.parametrize("vector", SCHEMA_DETECTED, ids=_ids(SCHEMA_DETECTED))
def test_schema_detectable_negative_fails_its_schema(vector: dict[str, Any]) -> None:
    """A negative vector flagged detected_by_schema is also invalid against the JSON Schema."""
    value = schema_view(codec.unpack(bytes.fromhex(vector["msgpack_hex"])))
    assert validate(value, schema_of(f"{vector['type']}.schema.json")) != []


@pytest.mark.parametrize("vector", ENVELOPES, ids=_ids(ENVELOPES))
def test_error_envelope_decodes_to_its_typed_error(vector: dict[str, Any]) -> None:
    """decode_reply raises the error class of the code (or its family) and re-encodes exactly."""
    data = bytes.fromhex(vector["msgpack_hex"])
    wire = from_json(vector["json"])["error"]
    with pytest.raises(errors.SandpodError) as caught:
        codec.decode_reply(ExecRef, data)
    err = caught.value
    assert (err.code, err.message, err.retryable, err.details) == (
        wire["code"],
        wire["message"],
        wire["retryable"],
        wire["details"],
    )
    assert type(err).code == vector.get("family_fallback", wire["code"])
    canonical = bytes.fromhex(vector.get("canonical_msgpack_hex", vector["msgpack_hex"]))
    assert codec.encode_error(err) == canonical
    assert validate(schema_view(codec.unpack(data)), schema_of("error.schema.json")) == []


# -- completeness ----------------------------------------------------------------------------------


def contract_messages() -> list[type[codec.Message]]:
    """Every Message subclass defined in ``sandpod_contract``, after importing all its modules:
    what may cross NATS, whether or not the catalogue mentions it."""
    for module in pkgutil.walk_packages(sandpod_contract.__path__, "sandpod_contract."):
        importlib.import_module(module.name)
    found: list[type[codec.Message]] = []
    todo = [codec.Message]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found:
                found.append(sub)
                todo.append(sub)
    # ``slots=True`` makes a dataclass a new class: the one its module binds is the message
    return [
        c
        for c in found
        if c.__module__.startswith("sandpod_contract.")
        and getattr(sys.modules[c.__module__], c.__qualname__, None) is c
    ]


def contract_gaps(cls: type[codec.Message]) -> list[str]:
    """What ``schemas/`` lacks for message ``cls`` (empty when a client can be written for it)."""
    gaps = []
    if cls not in schemagen.message_types():
        gaps.append("not reachable from the catalogue (no plane, frame or event uses it)")
    if not (SCHEMAS / "messages" / f"{cls.TYPE}.schema.json").is_file():
        return [*gaps, "no schema file"]
    names = [v["name"] for v in POSITIVE if v["type"] == cls.TYPE]
    if not names:
        gaps.append("no positive vector")
    schema = schema_of(f"{cls.TYPE}.schema.json")
    optional = set(schema["properties"]) - set(schema["required"]) - {"kind"}
    if optional and not any(n.endswith("/minimal") for n in names):
        gaps.append(f"optional fields {sorted(optional)} but no minimal vector")
    return gaps


def test_every_operation_has_request_and_reply_vectors() -> None:
    """Each operation of every plane has a request vector on its subject and a reply vector."""
    for plane in PLANES:
        for op in plane.operations:
            name = f"{op.family}.{op.verb}"
            requests = [
                v for v in POSITIVE if v.get("role") == "request" and name in v["operations"]
            ]
            assert requests, name
            assert all(v["subject_pattern"] == plane.subject_of(op) for v in requests), name
            if op.reply is not None:
                assert any(
                    v["type"] == op.reply.TYPE and name in v.get("operations", []) for v in POSITIVE
                ), name


def test_every_message_type_has_vectors_and_a_schema_file() -> None:
    """Every Message subclass in sandpod_contract (any plane, frame, event or nested message)
    has a schema, vectors, and a minimal vector if it has optional fields."""
    classes = contract_messages()
    assert len({c.TYPE for c in classes}) == len(classes), "two messages share a TYPE"
    gaps = {cls.TYPE: contract_gaps(cls) for cls in classes}
    assert {t: g for t, g in gaps.items() if g} == {}
    for frame in FRAMES:
        assert any(v["role"] == "frame" for v in POSITIVE if v["type"] == frame.TYPE)
    for events in EVENTS:
        assert any(v["role"] == "event" for v in POSITIVE if v["type"] == events.message.TYPE)
    assert (SCHEMAS / "messages" / "error.schema.json").is_file()


def test_the_message_walk_covers_every_plane() -> None:
    """The walk finds the control-plane, node-plane and event messages, not only the data plane."""
    types = {c.TYPE for c in contract_messages()}
    assert {"api.scale", "api.renew", "node.serve", "node.sandboxes", "event.sandbox"} <= types
    assert {"exec.request", "exec.chunk", "fs.entry", "empty"} <= types


def test_a_message_without_schema_or_vectors_is_reported() -> None:
    """A new message nobody generated a schema or vectors for is a gap (so CI fails on it)."""
    import dataclasses

    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class Frobnicate(codec.Message):
        TYPE = "api.frobnicate"
        name: str
        force: bool = False

    gaps = contract_gaps(Frobnicate)
    assert any("not reachable" in g for g in gaps)
    assert "no schema file" in gaps


def test_every_error_code_has_an_envelope_vector() -> None:
    """Each code of the error catalogue appears in an error envelope vector."""
    codes = {from_json(v["json"])["error"]["code"] for v in ENVELOPES}
    assert {e["code"] for e in errors.error_catalogue()} <= codes
    assert any("family_fallback" in v for v in ENVELOPES)


def test_errors_json_is_the_error_catalogue() -> None:
    """errors.json lists exactly the binding's codes with retryability and parent code."""
    doc = _load(SCHEMAS / "errors.json")
    assert [{k: e[k] for k in ("code", "retryable", "summary")} for e in doc["codes"]] == (
        errors.error_catalogue()
    )
    parents = {e["code"]: e["parent"] for e in doc["codes"]}
    assert parents["exec.command_not_found"] == "exec.spawn_failed"
    assert parents["bad_request.too_large"] == "bad_request"


def test_subjects_json_matches_catalogue_and_builders() -> None:
    """subjects.json lists every operation with a pattern the subject builder agrees with."""
    doc = _load(SCHEMAS / "subjects.json")
    ops = [(o["family"], o["verb"]) for o in doc["operations"]]
    assert ops == [(op.family, op.verb) for op in DATA_PLANE]
    built = Subjects("acme").sandbox("demo-1", "exec", "run")
    pattern = next(o["subject"] for o in doc["operations"] if o["verb"] == "run")
    assert pattern.replace("<prefix>", "acme").replace("<sandbox>", "demo-1") == built
    assert {f["type"] for f in doc["frames"]["types"]} == {f.TYPE for f in FRAMES}
    assert re.match(doc["sandbox_id_pattern"], "demo-1")
    assert not re.match(doc["sandbox_id_pattern"], "Demo_1")


def test_subjects_json_lists_the_control_and_node_planes() -> None:
    """Control and node operations are listed with request, reply, server, queue group and
    error codes, on subjects the builders produce."""
    doc = _load(SCHEMAS / "subjects.json")
    control = [(o["kind"], o["verb"]) for o in doc["control_operations"]]
    assert control == [(op.family, op.verb) for p in CONTROL_PLANES for op in p.operations]
    assert [(o["service"], o["verb"]) for o in doc["node_operations"]] == [
        (op.family, op.verb) for op in NODE.operations
    ]
    acme = Subjects("acme")
    scale = next(o for o in doc["control_operations"] if o["subject"].endswith("pools.scale"))
    assert scale["subject"].replace("<prefix>", "acme") == acme.api("pools", "scale")
    assert (scale["request"], scale["reply"], scale["queue_group"]) == (
        "api.scale",
        "api.object_reply",
        "sandpod-pool",
    )
    claim = next(o for o in doc["control_operations"] if o["subject"].endswith("claims.create"))
    assert {"claim.pool_not_found", "claim.failed", "claim.timeout"} <= set(claim["errors"])
    serve = next(o for o in doc["node_operations"] if o["verb"] == "serve")
    assert serve["subject"].replace("<prefix>", "acme").replace("<node>", "n1") == acme.node(
        "n1", "execd", "serve"
    )
    assert serve["queue_group"] is None
    codes = {e["code"] for e in errors.error_catalogue()}
    for entry in (*doc["control_operations"], *doc["node_operations"], *doc["planes"]):
        assert set(entry["errors"]) <= codes, entry
    groups = {(p["plane"], p["served_by"]): p["queue_group"] for p in doc["planes"]}
    assert groups[("control", "lifecycle")] == "sandpod-lifecycle"
    assert groups[("data", "execd serving the sandbox")] == "sandpod-execd"


def test_subjects_json_lists_the_events() -> None:
    """Each event kind names its subject (built by Subjects.event), message, types and stream."""
    doc = _load(SCHEMAS / "subjects.json")
    sandbox, network, volume = doc["events"]
    assert volume["message"] == "event.sandbox" and "claimed" in volume["types"]
    assert sandbox["message"] == "event.sandbox"
    assert network["message"] == "event.network"
    assert set(network["types"]) == {"updated", "denied"}
    assert network["subject"].replace("<prefix>", "acme").replace("<name>", "demo").replace(
        "<type>", "denied"
    ) == Subjects("acme").event("network", "demo", "denied")
    assert network["stream"] == sandbox["stream"]  # one stream holds every event
    assert {"created", "ready", "failed", "deleted", "idle_expired"} <= set(sandbox["types"])
    subject = sandbox["subject"].replace("<prefix>", "acme").replace("<name>", "demo")
    assert subject.replace("<type>", "ready") == Subjects("acme").event("sandbox", "demo", "ready")
    assert sandbox["stream"].replace("<storage>", "acme-eu") == Subjects("acme.eu").storage(
        "events"
    )


# -- the generator ---------------------------------------------------------------------------------


def test_generated_files_are_up_to_date() -> None:
    """`schemagen --check` finds nothing stale in this checkout."""
    assert schemagen.stale(ROOT) == []


def test_check_mode_lists_stale_files_and_write_fixes_them(tmp_path: Path) -> None:
    """--check exits 1 naming missing or extra files; a plain run fixes them; then it is clean."""
    lines: list[str] = []
    assert schemagen.main(["--check", "--root", str(tmp_path)], out=lines.append) == 1
    assert "stale: schemas/subjects.json" in lines
    assert schemagen.main(["--root", str(tmp_path)], out=lines.append) == 0
    assert schemagen.main(["--check", "--root", str(tmp_path)], out=lines.append) == 0
    (tmp_path / "schemas" / "vectors" / "gone.json").write_text("{}\n")
    lines.clear()
    assert schemagen.main(["--check", "--root", str(tmp_path)], out=lines.append) == 1
    assert lines[0] == "stale: schemas/vectors/gone.json"
    schemagen.main(["--root", str(tmp_path)], out=lines.append)
    assert not (tmp_path / "schemas" / "vectors" / "gone.json").exists()


def test_generation_is_deterministic() -> None:
    """Two renders produce identical files with sorted keys (but the JSON views in the msgpack
    map's order) and a trailing newline."""
    first, second = schemagen.render(), schemagen.render()
    assert first == second
    for text in first.values():
        assert text.endswith("}\n")
        assert json.dumps(json.loads(text), indent=2) + "\n" == text
        assert _sorted_outside_views(json.loads(text))


def _sorted_outside_views(obj: Any) -> bool:
    if isinstance(obj, dict):
        return list(obj) == sorted(obj) and all(
            k in ("json", "canonical_json") or _sorted_outside_views(v) for k, v in obj.items()
        )
    if isinstance(obj, list):
        return all(_sorted_outside_views(v) for v in obj)
    return True


def test_json_views_keep_the_msgpack_key_order() -> None:
    """A vector's json view lists keys in the order of its msgpack map ('v' first), so a reader
    sees the map order the bytes pin (issue 13.5 item 11)."""
    for vector in POSITIVE + ENVELOPES:
        raw = codec.unpack(bytes.fromhex(vector["msgpack_hex"]))
        assert list(vector["json"]) == list(raw), vector["name"]


@pytest.mark.parametrize("vector", NEGATIVE, ids=_ids(NEGATIVE))
def test_negative_vector_has_a_role(vector: dict[str, Any]) -> None:
    """Negative vectors carry role (and where sent) like positive ones (item 11)."""
    positive = next(v for v in POSITIVE if v["type"] == vector["type"])
    assert vector["role"] == positive["role"]
    for key in ("operations", "subject_pattern", "within"):
        assert (key in vector) == (key in positive), key
