"""The generated contract holds up under tools other than our own (issue 13.5).

``test_vectors`` checks the files with a small validator that knows exactly the keywords the
generator emits; here an independent one (python-jsonschema) checks every schema against its
metaschema and every vector against its schema, and every ``pattern`` is compiled by a real RE2
engine (google-re2: the syntax of Go's ``regexp`` and Rust's ``regex``) and must agree with
Python ``re`` on probe strings, so a client in any of those languages can use them as they are.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import re2  # type: ignore[import-untyped]
import referencing

from sandpod_contract import codec

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas"
SCHEMA_FILES = sorted((SCHEMAS / "messages").glob("*.schema.json"))
VECTORS: list[dict[str, Any]] = [
    v
    for path in sorted((SCHEMAS / "vectors").glob("*.json"))
    for v in json.loads(path.read_text(encoding="utf-8"))["vectors"]
]
POSITIVE = [v for v in VECTORS if "json" in v]
SCHEMA_DETECTED = [v for v in VECTORS if v.get("detected_by_schema")]


@pytest.fixture(scope="session")
def _session_daemons() -> None:
    """No nats-server or execd: these tests are pure (overrides the root conftest's autouse one)."""


def _load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


@cache
def _registry() -> referencing.Registry[Any]:
    """Every message schema under its file name, which is what a ``$ref`` names."""
    resources = [
        (path.name, referencing.Resource.from_contents(_load(path))) for path in SCHEMA_FILES
    ]
    return referencing.Registry().with_resources(resources)


def _validator(type_: str) -> jsonschema.protocols.Validator:
    schema = _load(SCHEMAS / "messages" / f"{type_}.schema.json")
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, registry=_registry())


def _schema_view(value: Any) -> Any:
    """A vector's JSON view as a JSON Schema sees it: ``{"$bytes": b64}`` as the base64 text."""
    if isinstance(value, dict):
        if set(value) == {"$bytes"}:
            return value["$bytes"]
        return {k: _schema_view(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_schema_view(v) for v in value]
    return value


def _wire_view(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dict):
        return {str(k): _wire_view(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_wire_view(v) for v in value]
    return value


@pytest.mark.parametrize("path", SCHEMA_FILES, ids=[p.name for p in SCHEMA_FILES])
def test_schema_is_valid_under_its_declared_metaschema(path: Path) -> None:
    """Each schema declares draft 2020-12 and is a valid schema of that dialect."""
    schema = _load(path)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.validators.validator_for(schema).check_schema(schema)


@pytest.mark.parametrize("vector", POSITIVE, ids=[v["name"] for v in POSITIVE])
def test_positive_vector_is_valid_for_python_jsonschema(vector: dict[str, Any]) -> None:
    """What encoders send (the canonical view) satisfies the schema of its type."""
    view = _schema_view(vector.get("canonical_json", vector["json"]))
    errors = [e.message for e in _validator(vector["type"]).iter_errors(view)]
    assert errors == []


@pytest.mark.parametrize("vector", SCHEMA_DETECTED, ids=[v["name"] for v in SCHEMA_DETECTED])
def test_schema_detectable_negative_fails_python_jsonschema(vector: dict[str, Any]) -> None:
    """A negative vector flagged detected_by_schema is invalid for python-jsonschema too."""
    view = _wire_view(codec.unpack(bytes.fromhex(vector["msgpack_hex"])))
    assert not _validator(vector["type"]).is_valid(view)


# -- patterns --------------------------------------------------------------------------------------


def _patterns(obj: Any, where: str) -> Iterator[tuple[str, str]]:
    """Every ``pattern`` keyword (a str value; a property named "pattern" is a dict) and the
    subject rules of subjects.json."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key in ("pattern", "sandbox_id_pattern", "token_pattern") and isinstance(value, str):
                yield f"{where}/{key}", value
            else:
                yield from _patterns(value, f"{where}/{key}")
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            yield from _patterns(value, f"{where}[{i}]")


PATTERNS = sorted(
    {
        (where, pattern)
        for path in [*SCHEMA_FILES, SCHEMAS / "subjects.json"]
        for where, pattern in _patterns(_load(path), path.name)
    }
)
# What RE2-style engines lack or read differently: lookaround, backreferences, \u escapes
# (RE2: \x{...}), \s, \d, \w, \b (their classes differ between engines), possessive forms.
NOT_PORTABLE = re.compile(r"\(\?[=!<]|\\[1-9]|\\k<|\\u|\\[sSdDwWbB]|[+*?}]\+")
PROBES = [
    "",
    "a",
    "a.b",
    "_INBOX.x",
    "*",
    ">",
    "a.*",
    "*x.>y",
    "a..b",
    "-x",
    "/workspace/a b",
    *(f"a{chr(c)}b" for c in (0, 9, 10, 13, 0x1C, 0x20, 0x85, 0xA0, 0x1680, 0x2003, 0x3000)),
    "main",
    "v1.2",
    "demo-1",
    "0" * 64,
]


def test_the_portability_checker_catches_what_re2_lacks() -> None:
    """The checker flags each construct the issue names (so the test below can fail)."""
    for bad in ("^(?![*>])x$", "^[^\\u0000]*$", "^[^-\\s]$", "(a)\\1"):
        assert NOT_PORTABLE.search(bad), bad
    assert not NOT_PORTABLE.search("^[^\\x00]*$")


@pytest.mark.parametrize("pattern", [p for _, p in PATTERNS], ids=[w for w, _ in PATTERNS])
def test_pattern_compiles_under_re2_and_agrees_with_python(pattern: str) -> None:
    """Every pattern is in the syntax RE2, ECMA-262 and Python share, and means the same (but for
    a final newline, which Python's ``$`` lets through: the README says to match with ``\\Z``)."""
    assert not NOT_PORTABLE.search(pattern)
    compiled = re2.compile(pattern)
    for probe in PROBES:
        assert bool(compiled.search(probe)) == bool(re.search(pattern, probe)), repr(probe)
