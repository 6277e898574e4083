"""What a client written from ``schemas/`` alone had to guess (issue 13.5), each now stated.

One test per item of that list (the patterns are in ``test_schema_portable``, the JSON views'
order and the negative vectors' roles in ``test_vectors``); each reads the generated files, as
a client in another language would, and where the item is about behaviour also the binding or
the server's constant that must agree with them.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest

from sandpod_contract import codec, error_spec, errors
from sandpod_contract._data_errors import DATA_ERRORS
from sandpod_contract.catalogue import DATA, DATA_PLANE
from sandpod_contract.messages.exec import ExecStart, OutputChunk
from sandpod_execd.handlers.fs import READ_OVERHEAD
from sandpod_execd.settings import ExecdSettings

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas"


@pytest.fixture(scope="session")
def _session_daemons() -> None:
    """No nats-server or execd: these tests are pure (overrides the root conftest's autouse one)."""


def _load(rel: str) -> Any:
    return json.loads((SCHEMAS / rel).read_text(encoding="utf-8"))


def _vectors() -> list[dict[str, Any]]:
    return [
        v
        for p in sorted((SCHEMAS / "vectors").glob("*.json"))
        for v in _load(p.relative_to(SCHEMAS).as_posix())["vectors"]
    ]


def _vector(name: str) -> dict[str, Any]:
    return next(v for v in _vectors() if v["name"] == name)


def test_watch_globs_are_typed_strings() -> None:
    """Item 2: a value rule on array items keeps the items' type."""
    props = _load("messages/watch.start.schema.json")["properties"]
    for key in ("include", "exclude"):
        assert props[key]["items"]["type"] == "string"
        assert props[key]["items"]["minLength"] == 1


def test_fs_read_cap_is_the_one_execd_applies() -> None:
    """Item 3: the schema states the reply room execd keeps (1 KiB), as docs/fs.md does."""
    length = _load("messages/fs.read.schema.json")["properties"]["length"]["description"]
    assert f"max_payload - {READ_OVERHEAD // 1024} KiB" in length
    assert f"`max_payload` - {READ_OVERHEAD // 1024} KiB" in (SCHEMAS / "docs/fs.md").read_text()


def test_every_data_operation_lists_its_errors() -> None:
    """Item 5: subjects.json gives each data-plane operation its codes, the plane's first."""
    assert set(DATA_ERRORS) == {f"{op.family}.{op.verb}" for op in DATA_PLANE}
    plane = [e.code for e in DATA.errors]
    known = {e["code"] for e in _load("errors.json")["codes"]}
    for op in _load("subjects.json")["operations"]:
        if op["reply"] is None:  # publish only: nothing is ever answered
            assert op["errors"] == []
            continue
        assert op["errors"][: len(plane)] == plane, op["verb"]
        assert set(op["errors"]) <= known
    run = next(o for o in _load("subjects.json")["operations"] if o["subject"].endswith("exec.run"))
    assert {"exec.command_not_found", "exec.invalid_cwd", "sandbox.paused"} <= set(run["errors"])


def test_every_error_vector_carries_the_details_its_code_requires() -> None:
    """Item 6: errors.json lists each code's details keys; every envelope vector has them."""
    codes = {c["code"]: c for c in _load("errors.json")["codes"]}
    assert codes["exec.not_found"]["details"]["required"]["exec_id"]["type"] == "string"
    assert "reason" in codes["bad_request"]["details"]["required"]
    for vector in _vectors():
        if vector["type"] == "error":
            wire = vector["json"]["error"]
            assert error_spec.missing_details(wire["code"], wire["details"]) == [], vector["name"]


def test_decoding_errors_carry_a_stable_reason_and_their_field() -> None:
    """Item 6: a bad_request from decoding says why with a listed reason (never a Python class
    name) and names the field whenever the reason is about one."""
    reasons = _load("errors.json")["bad_request_reasons"]
    seen = set()
    for vector in _vectors():
        if vector.get("error_code") != "bad_request":
            continue
        assert vector["error_reason"] in reasons, vector["name"]
        seen.add(vector["error_reason"])
        with pytest.raises(errors.BadRequest) as caught:
            codec.decode(_type(vector["type"]), bytes.fromhex(vector["msgpack_hex"]))
        assert caught.value.details["reason"] == vector["error_reason"]
        assert error_spec.missing_details("bad_request", caught.value.details) == []
    assert {"invalid_msgpack", "invalid_utf8", "ext_type", "missing_field", "wrong_type"} <= seen


def _type(name: str) -> type[codec.Message]:
    from sandpod_contract import schemagen

    return next(c for c in schemagen.message_types() if name == c.TYPE)


def test_a_bad_request_raised_without_a_reason_gets_invalid_value() -> None:
    """Item 6: a handler's BadRequest (unknown signal, reserved key...) still has a reason."""
    assert errors.BadRequest("unknown signal 99", signal=99).details["reason"] == "invalid_value"
    assert "reason" not in errors.PayloadTooLarge("big", limit=1).details


def test_unknown_codes_fall_back_by_longest_prefix_then_internal() -> None:
    """Item 7: the fallback rule is stated, and the generic error is 'internal'."""
    doc = _load("errors.json")["unknown_codes"]
    assert "longest known code" in doc
    assert "'internal'" in doc
    assert _vector("error/unknown-code-deep")["family_fallback"] == "exec.spawn_failed"
    assert type(errors.error_from_wire({"code": "frob.x"})).code == "internal"


def test_the_envelope_version_is_a_version_like_every_message() -> None:
    """Item 8: 'v' of the envelope is bounded like a message's, not a const; the README says
    nested messages carry their own 'v'."""
    v = _load("messages/error.schema.json")["properties"]["v"]
    assert "const" not in v
    assert (v["minimum"], v["maximum"]) == (1, 1)
    assert "nested message" in (SCHEMAS / "README.md").read_text()


def test_decoder_rules_have_vectors() -> None:
    """Item 9: duplicate keys, ext types, float 32, invalid UTF-8, unknown keys inside 'error'
    and nil in maps each have a vector (checked like all others by test_vectors)."""
    names = {v["name"] for v in _vectors()}
    assert {
        "exec.ref/duplicate-key",
        "exec.request/float32",
        "exec.ref/reject/ext-type",
        "exec.ref/reject/timestamp-ext",
        "exec.ref/reject/invalid-utf8",
        "exec.request/reject/nil-in-env",
        "error/unknown-keys-and-nil-detail",
    } <= names
    dup = _vector("exec.ref/duplicate-key")
    assert dup["canonical_json"]["exec_id"] != "old"


def test_frame_kind_is_required_without_a_default() -> None:
    """Item 10: kind types a frame, so it is required on the wire and has no schema default."""
    for name in ("exec.chunk", "exec.exit"):
        schema = _load(f"messages/{name}.schema.json")
        assert "kind" in schema["required"]
        assert "default" not in schema["properties"]["kind"]
    with pytest.raises(errors.BadRequest):
        codec.decode_map(
            OutputChunk, {"v": 1, "exec_id": "x", "seq": 1, "stream": "stdout", "data": b""}
        )


def test_abandon_after_absent_means_execds_default() -> None:
    """Item 12: exec.started.abandon_after states its fallback, which is execd's default."""
    doc = _load("messages/exec.started.schema.json")["properties"]["abandon_after"]["description"]
    assert f"{ExecdSettings.abandon_after:g} s" in doc
    assert ExecStart.__dataclass_fields__["abandon_after"].default is None


def test_transport_errors_are_one_table() -> None:
    """Item 13: errors.json maps every NATS-level condition to a code; the README says when
    execd's own too_large can happen."""
    table = {t["code"]: t for t in _load("errors.json")["transport"]}
    assert "maximum payload" in table["bad_request.too_large"]["condition"]
    assert {"sandbox.not_found", "timeout", "connection.lost"} <= set(table)
    readme = (SCHEMAS / "README.md").read_text()
    assert re.search(r"only when\s+`max_request_bytes` < `max_payload`", readme)


def _raise_sites() -> list[tuple[str, str, set[str]]]:
    """(code, where, keyword names) of every construction of a contract error in the source."""
    classes = {
        name: cls
        for name in errors.__all__
        if isinstance(cls := getattr(errors, name), type) and issubclass(cls, errors.SandpodError)
    }
    sites = []
    for top in ("services", "libs", "sdk/src", "schemas/python/src"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
                if name in classes:
                    keys = {k.arg or "**" for k in node.keywords}
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    sites.append((classes[name].code, where, keys))
    return sites


def test_every_raise_site_sends_the_details_its_code_requires() -> None:
    """Item 6, the servers' side: each place that builds an error passes the details keys
    errors.json marks required for its code (bad_request's reason is filled in by the class)."""
    missing = [
        (where, code, sorted(set(spec.required) - keys))
        for code, where, keys in _raise_sites()
        if (spec := error_spec.DETAILS.get(code)) is not None
        and code != "bad_request"
        and "**" not in keys
        and not set(spec.required) <= keys
    ]
    assert missing == []
