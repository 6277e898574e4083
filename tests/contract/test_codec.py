"""Edge cases of the contract's codec, error model and subject builders."""

from __future__ import annotations

import dataclasses

import pytest

from sandpod_contract import codec
from sandpod_contract.errors import (
    BadRequest,
    ExecError,
    ExecNotFound,
    InternalError,
    SpawnFailed,
    UnsupportedVersion,
    error_from_wire,
)
from sandpod_contract.messages.exec import (
    ExecFetch,
    ExecRef,
    ExecRequest,
    ExecResult,
    StdinWrite,
    StreamAck,
)
from sandpod_contract.messages.system import Pong
from sandpod_contract.subjects import DataSubject, Subjects, validate_sandbox_id


@pytest.fixture(scope="session")
def _session_daemons() -> None:
    """No nats-server or execd: these tests are pure (overrides the root conftest's autouse one)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Inner(codec.Message):
    """A nested message (the contract has none yet; the codec supports them)."""

    TYPE = "test.inner"
    name: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Outer(codec.Message):
    """A message with a nested message, an array and a map."""

    TYPE = "test.outer"
    inner: Inner
    tags: tuple[str, ...] = ()
    labels: dict[str, str] | None = None


def decode_raw(cls: type[codec.T], raw: object) -> codec.T:
    return codec.decode(cls, codec.pack(raw))


# -- encoding --------------------------------------------------------------------------------------


def test_encode_puts_v_first_and_omits_none_fields() -> None:
    """Encoding writes 'v' first, then set fields in declaration order, and leaves out None."""
    wire = codec.unpack(codec.encode(ExecRequest(argv=("ls",), exec_id="e1", cwd=None)))
    assert list(wire.items()) == [("v", 1), ("exec_id", "e1"), ("argv", ["ls"])]


def test_encode_writes_bytes_as_msgpack_bin() -> None:
    """bytes fields become msgpack bin (0xc4 header), never str or base64."""
    data = codec.encode(StdinWrite(exec_id="e", data=b"\x00\xff"))
    assert b"\xc4\x02\x00\xff" in data
    assert codec.unpack(data)["data"] == b"\x00\xff"


def test_encode_keeps_non_none_defaults() -> None:
    """Fields at a non-None default are still encoded (canonical form is complete)."""
    wire = codec.unpack(codec.encode(ExecResult(exec_id="e")))
    assert wire["stdout"] == b""
    assert wire["timed_out"] is False


# -- decoding --------------------------------------------------------------------------------------


def test_unknown_fields_are_ignored() -> None:
    """Fields the binding does not know are dropped, not rejected."""
    msg = decode_raw(ExecRef, {"v": 1, "exec_id": "e", "future": {"x": [1, 2]}})
    assert msg == ExecRef(exec_id="e")


def test_missing_required_field_names_the_field() -> None:
    """A missing required field raises BadRequest whose details name that field."""
    with pytest.raises(BadRequest) as caught:
        decode_raw(ExecFetch, {"v": 1, "exec_id": "e", "offset": 0})
    assert caught.value.details["field"] == "stream"
    assert "'stream'" in caught.value.message


def test_nil_required_field_counts_as_missing() -> None:
    """nil for a required field is the same as leaving it out."""
    with pytest.raises(BadRequest) as caught:
        decode_raw(ExecRef, {"v": 1, "exec_id": None})
    assert caught.value.details["field"] == "exec_id"


def test_nil_optional_field_takes_the_default() -> None:
    """nil for a defaulted field decodes to the default."""
    assert decode_raw(StdinWrite, {"v": 1, "exec_id": "e", "data": None}).data == b""


def test_missing_or_non_int_version_is_rejected() -> None:
    """'v' is required and must be an int (a bool is not)."""
    for raw in ({"exec_id": "e"}, {"v": "1", "exec_id": "e"}, {"v": True, "exec_id": "e"}):
        with pytest.raises(BadRequest) as caught:
            decode_raw(ExecRef, raw)
        assert caught.value.details["field"] == "v"


def test_newer_version_is_unsupported_with_details() -> None:
    """A v above the binding's version raises UnsupportedVersion with type and versions."""
    with pytest.raises(UnsupportedVersion) as caught:
        decode_raw(ExecRef, {"v": 2, "exec_id": "e"})
    assert caught.value.code == "bad_request.unsupported_version"
    assert caught.value.details == {"type": "exec.ref", "version": 2, "supported": 1}


def test_bool_is_rejected_where_int_is_expected() -> None:
    """msgpack true is not accepted as an int field."""
    with pytest.raises(BadRequest) as caught:
        decode_raw(StreamAck, {"v": 1, "exec_id": "e", "seq": True})
    assert caught.value.details["field"] == "seq"


def test_float_is_rejected_where_int_is_expected() -> None:
    """An integral float is still not an int."""
    with pytest.raises(BadRequest):
        decode_raw(StreamAck, {"v": 1, "exec_id": "e", "seq": 3.0})


def test_int_is_accepted_for_float_and_converted() -> None:
    """An int for a float field decodes to a float, so re-encoding writes a float."""
    msg = decode_raw(Pong, {"v": 1, "sandbox_id": "s", "time": 5})
    assert msg.time == 5.0
    assert isinstance(msg.time, float)


def test_bool_is_rejected_where_float_is_expected() -> None:
    """msgpack true is not a number."""
    with pytest.raises(BadRequest):
        decode_raw(Pong, {"v": 1, "sandbox_id": "s", "time": True})


def test_str_and_bin_are_not_interchangeable() -> None:
    """A str field refuses bin and a bytes field refuses str."""
    with pytest.raises(BadRequest):
        decode_raw(ExecRef, {"v": 1, "exec_id": b"e"})
    with pytest.raises(BadRequest):
        decode_raw(StdinWrite, {"v": 1, "exec_id": "e", "data": "text"})


def test_literal_field_accepts_only_its_values() -> None:
    """A Literal field refuses other strings and bools."""
    for stream in ("stdin", True, 1):
        with pytest.raises(BadRequest):
            decode_raw(ExecFetch, {"v": 1, "exec_id": "e", "stream": stream, "offset": 0})


def test_nested_message_is_decoded_and_validated() -> None:
    """A nested map decodes into its message type; its errors carry the dotted path."""
    msg = decode_raw(Outer, {"v": 1, "inner": {"v": 1, "name": "n"}})
    assert msg.inner == Inner(name="n")
    with pytest.raises(BadRequest) as caught:
        decode_raw(Outer, {"v": 1, "inner": {"v": 1, "name": 7}})
    assert caught.value.details["field"] == "inner.name"
    with pytest.raises(BadRequest) as caught:
        decode_raw(Outer, {"v": 1, "inner": {"name": "n"}})
    assert caught.value.details["field"] == "inner.v"
    with pytest.raises(BadRequest):
        decode_raw(Outer, {"v": 1, "inner": ["n"]})


def test_nested_message_newer_version_is_unsupported() -> None:
    """The version check applies to nested messages too."""
    with pytest.raises(UnsupportedVersion):
        decode_raw(Outer, {"v": 1, "inner": {"v": 9, "name": "n"}})


def test_array_items_are_validated_with_their_index() -> None:
    """tuple[str, ...] fields need an array of strings; errors name the bad index."""
    assert decode_raw(Outer, {"v": 1, "inner": {"v": 1, "name": "n"}, "tags": ["a"]}).tags == ("a",)
    with pytest.raises(BadRequest) as caught:
        decode_raw(Outer, {"v": 1, "inner": {"v": 1, "name": "n"}, "tags": ["a", 2]})
    assert caught.value.details["field"] == "tags[1]"
    with pytest.raises(BadRequest):
        decode_raw(Outer, {"v": 1, "inner": {"v": 1, "name": "n"}, "tags": "a"})


def test_map_values_are_validated_with_their_key() -> None:
    """dict[str, str] fields need a map of strings; errors name the bad key."""
    base = {"v": 1, "inner": {"v": 1, "name": "n"}}
    assert decode_raw(Outer, {**base, "labels": {"k": "v"}}).labels == {"k": "v"}
    with pytest.raises(BadRequest) as caught:
        decode_raw(Outer, {**base, "labels": {"k": 1}})
    assert caught.value.details["field"] == "labels.k"
    with pytest.raises(BadRequest):
        decode_raw(Outer, {**base, "labels": {b"k": "v"}})
    with pytest.raises(BadRequest):
        decode_raw(Outer, {**base, "labels": ["k"]})


def test_post_init_errors_become_bad_request() -> None:
    """A value rule failing in __post_init__ (argv and shell both set) is a BadRequest."""
    with pytest.raises(BadRequest) as caught:
        decode_raw(ExecRequest, {"v": 1, "argv": ["ls"], "shell": "ls"})
    assert "exactly one of 'argv' or 'shell'" in caught.value.message
    assert isinstance(caught.value.__cause__, ValueError)


@pytest.mark.parametrize(
    "data",
    [b"", b"\xc1", b"\x82\xa1v", codec.pack({"v": 1}) + b"\x00", codec.pack({1: 2})],
    ids=["empty", "never-used-byte", "truncated", "trailing-data", "int-key"],
)
def test_malformed_msgpack_is_bad_request(data: bytes) -> None:
    """Bytes that are not exactly one msgpack value with string keys raise BadRequest."""
    with pytest.raises(BadRequest):
        codec.decode(ExecRef, data)


def test_non_map_payload_is_bad_request() -> None:
    """A valid msgpack value that is not a map is refused."""
    with pytest.raises(BadRequest, match="expected a map, got array"):
        codec.decode(ExecRef, codec.pack(["e"]))


# -- replies and errors ----------------------------------------------------------------------------


def test_decode_reply_returns_the_message_on_success() -> None:
    """A reply without an 'error' key decodes as the reply type."""
    data = codec.encode(ExecRef(exec_id="e"))
    assert codec.decode_reply(ExecRef, data) == ExecRef(exec_id="e")


def test_error_envelope_becomes_the_typed_exception() -> None:
    """An error envelope raises the class of its code with message, details and retryable."""
    data = codec.encode_error(ExecNotFound("gone", exec_id="e1"))
    assert codec.unpack(data) == {
        "v": 1,
        "error": {
            "code": "exec.not_found",
            "message": "gone",
            "retryable": False,
            "details": {"exec_id": "e1"},
        },
    }
    with pytest.raises(ExecNotFound) as caught:
        codec.decode_reply(ExecRef, data)
    assert (caught.value.message, caught.value.details) == ("gone", {"exec_id": "e1"})


def test_error_envelope_that_is_not_a_map_is_bad_request() -> None:
    """An 'error' value that is not a map is a malformed reply."""
    with pytest.raises(BadRequest):
        codec.decode_reply(ExecRef, codec.pack({"v": 1, "error": "boom"}))


def test_unknown_error_code_maps_to_its_family_keeping_the_code() -> None:
    """An unknown exec.* code becomes ExecError, keeping the code and the wire's retryable."""
    err = error_from_wire({"code": "exec.quota", "message": "m", "retryable": True})
    assert type(err) is ExecError
    assert (err.code, err.retryable) == ("exec.quota", True)
    assert codec.unpack(codec.encode_error(err))["error"]["code"] == "exec.quota"


def test_unknown_error_family_maps_to_internal() -> None:
    """A code of an unknown family becomes InternalError (code 'internal'), keeping the code and
    the wire's retryable: the generic error has a code a client can name."""
    err = error_from_wire({"code": "quota.exceeded", "message": "m", "retryable": False})
    assert type(err) is InternalError
    assert (err.code, err.retryable) == ("quota.exceeded", False)


def test_unknown_sub_code_maps_to_its_longest_known_prefix() -> None:
    """exec.spawn_failed.enoexec is a SpawnFailed; exec.x (no known longer prefix) an ExecError."""
    err = error_from_wire({"code": "exec.spawn_failed.enoexec", "message": "m"})
    assert type(err) is SpawnFailed
    assert err.code == "exec.spawn_failed.enoexec"
    assert type(error_from_wire({"code": "exec.enoexec", "message": "m"})) is ExecError
    assert type(error_from_wire({"code": "bad_request.x.y", "message": "m"})) is BadRequest


def test_error_without_message_uses_the_class_summary() -> None:
    """An empty wire message falls back to the class summary."""
    err = error_from_wire({"code": "exec.not_found", "message": ""})
    assert err.message == ExecNotFound.summary


def test_error_detail_named_message_is_kept() -> None:
    """A details key named 'message' does not break decoding of the error."""
    err = error_from_wire({"code": "exec.not_found", "message": "m", "details": {"message": "x"}})
    assert err.details == {"message": "x"}


# -- subjects --------------------------------------------------------------------------------------


def test_sandbox_subject_round_trips_through_parse() -> None:
    """parse_sandbox splits what sandbox() builds, for any valid prefix."""
    for prefix in ("sandpod", "acme.prod"):
        subjects = Subjects(prefix)
        subject = subjects.sandbox("demo-1", "exec", "run")
        assert subject == f"{prefix}.sbx.demo-1.exec.run"
        assert subjects.parse_sandbox(subject) == DataSubject("demo-1", "exec", "run")


def test_parse_sandbox_rejects_other_subjects() -> None:
    """Subjects of another prefix, plane or shape parse to None."""
    subjects = Subjects()
    for subject in (
        "other.sbx.demo.exec.run",
        "sandpod.api.sandboxes.create",
        "sandpod.sbx.demo.exec",
        "sandpod.sbx.demo.exec.run.extra",
        "sandpod.sbx..exec.run",
    ):
        assert subjects.parse_sandbox(subject) is None, subject


def test_sandbox_all_is_a_wildcard_for_one_sandbox() -> None:
    """sandbox_all covers every data-plane subject of exactly one sandbox."""
    assert Subjects().sandbox_all("demo") == "sandpod.sbx.demo.>"
    with pytest.raises(ValueError, match="invalid sandbox id"):
        Subjects().sandbox_all("*")


@pytest.mark.parametrize(
    "sandbox_id", ["", "Demo", "demo_1", "-demo", "demo-", "a.b", "*", ">", "a" * 64]
)
def test_invalid_sandbox_ids_are_refused(sandbox_id: str) -> None:
    """Sandbox ids must be DNS labels: lowercase, digits, inner '-', at most 63 chars."""
    with pytest.raises(ValueError, match="invalid sandbox id"):
        Subjects().sandbox(sandbox_id, "exec", "run")


def test_valid_sandbox_ids_are_accepted() -> None:
    """Single characters, digits and 63-character labels are valid ids."""
    for sandbox_id in ("a", "0", "demo-1", "a" * 63):
        assert validate_sandbox_id(sandbox_id) == sandbox_id


def test_trailing_newline_in_sandbox_id_is_refused() -> None:
    """A sandbox id with a trailing newline is not a DNS label."""
    with pytest.raises(ValueError, match="invalid sandbox id"):
        validate_sandbox_id("demo\n")


@pytest.mark.parametrize("token", ["", "a.b", "a b", "*", ">", "é"])
def test_invalid_tokens_are_refused(token: str) -> None:
    """Family, verb, kind and event tokens are single [A-Za-z0-9_-] tokens."""
    subjects = Subjects()
    with pytest.raises(ValueError, match="invalid subject token"):
        subjects.sandbox("demo", token, "run")
    with pytest.raises(ValueError, match="invalid subject token"):
        subjects.api("sandboxes", token)
    with pytest.raises(ValueError, match="invalid subject token"):
        subjects.event("sandbox", token, "ready")


@pytest.mark.parametrize("prefix", ["", "a..b", ".a", "a b", "a.*", "a.>"])
def test_invalid_prefixes_are_refused(prefix: str) -> None:
    """A prefix is one or more dot-separated [A-Za-z0-9_-] tokens."""
    with pytest.raises(ValueError, match="invalid subject prefix"):
        Subjects(prefix)


def test_control_plane_and_event_subjects() -> None:
    """api() and event() build the control-plane and event subjects under the prefix."""
    subjects = Subjects("acme")
    assert subjects.api("sandboxes", "create") == "acme.api.sandboxes.create"
    assert subjects.event("sandbox", "demo", "ready") == "acme.events.sandbox.demo.ready"
    assert subjects.events_all() == "acme.events.>"
    assert subjects.api_kind("pools") == "acme.api.pools.*"
    assert Subjects("acme.eu").storage("resources") == "acme-eu-resources"


def test_no_message_has_a_field_named_error() -> None:
    """A reply field called ``error`` would be read as the error envelope: none may exist."""
    import dataclasses

    from sandpod_contract.schemagen import message_types

    types = message_types()  # every plane's requests and replies, frames, events, nested ones
    offenders = [t.TYPE for t in types if "error" in {f.name for f in dataclasses.fields(t)}]
    assert not offenders


def test_values_msgpack_cannot_carry_are_a_typed_bad_request() -> None:
    """An integer beyond 64 bits or a non-wire type inside a message is BadRequest, not a crash
    (the gateway fuzzing found a 500 here)."""
    from sandpod_contract.codec import encode
    from sandpod_contract.errors import BadRequest
    from sandpod_contract.messages.sandboxes import ObjectRequest

    with pytest.raises(BadRequest, match="cannot be encoded"):
        encode(ObjectRequest(object={"spec": {"x": -(2**63) - 1}}))
    with pytest.raises(BadRequest):
        encode(ObjectRequest(object={"spec": {"x": object()}}))
