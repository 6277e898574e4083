"""Malformed and hostile requests get typed errors while execd keeps serving everyone else."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from conftest import Execd, NatsServer
from sandpod import AsyncSandbox
from sandpod_bus import Bus, BusSettings
from sandpod_contract import error_spec
from sandpod_contract.codec import decode_reply, encode, pack
from sandpod_contract.errors import (
    BadRequest,
    PayloadTooLarge,
    SandpodError,
    UnknownSubject,
    UnsupportedVersion,
)
from sandpod_contract.messages.exec import ExecRequest, ExecResult
from sandpod_contract.subjects import Subjects

SUBJECTS = Subjects()


@pytest.fixture
async def bus(nats: NatsServer) -> AsyncIterator[Bus]:
    b = await Bus.connect(BusSettings(url=nats.url))
    yield b
    await b.close()


async def _error(bus: Bus, subject: str, payload: bytes) -> SandpodError:
    reply = await bus.request(subject, payload, 5)
    with pytest.raises(SandpodError) as info:
        decode_reply(ExecResult, reply)
    return info.value


RUN = SUBJECTS.sandbox("shared", "exec", "run")


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        (b"\xc1\xc1garbage", "msgpack"),
        (b"", "msgpack"),
        (pack([1, 2, 3]), "expected a map"),
        (pack({"v": 1}), "exactly one of 'argv' or 'shell'"),
        (pack({"shell": "true"}), "missing required field 'v'"),
        (pack({"v": "1", "shell": "true"}), "expected an int"),
        (pack({"v": 0, "shell": "true"}), "expected an int >= 1"),
        (pack({"v": 1, "argv": "ls -l"}), "expected array"),
        (pack({"v": 1, "argv": [1, 2]}), "expected str"),
        (pack({"v": 1, "argv": []}), "non-empty"),
        (pack({"v": 1, "shell": "true", "timeout": True}), "expected float"),
        (pack({"v": 1, "shell": "true", "timeout": -1}), "timeout must be > 0"),
        (pack({"v": 1, "shell": "true", "env": {"A=B": "x"}}), "env name"),
        (pack({"v": 1, "shell": "true", "env": ["x"]}), "expected map"),
        (pack({"v": 1, "argv": ["a\x00b"]}), "NUL"),
        (pack({"v": 1, "shell": "true", "stdin": "text, not bytes"}), "expected bytes"),
    ],
)
async def test_malformed_requests_get_bad_request(bus: Bus, payload: bytes, fragment: str) -> None:
    """Garbage, wrong types, missing and invalid fields each get a typed bad_request, whose
    details carry a stable reason (never a Python class name) and the field where the reason is
    about one (errors.json, issue 13.5 item 6)."""
    err = await _error(bus, RUN, payload)
    assert isinstance(err, BadRequest) and not err.retryable
    assert fragment in err.message
    assert err.details["reason"] in error_spec.BAD_REQUEST_REASONS
    assert error_spec.missing_details(err.code, err.details) == []


async def test_unknown_fields_are_ignored(bus: Bus) -> None:
    """A newer client's extra fields do not break an older execd."""
    reply = await bus.request(RUN, pack({"v": 1, "shell": "echo ok", "future": {"x": 1}}), 5)
    assert decode_reply(ExecResult, reply).stdout == b"ok\n"


async def test_newer_version_is_refused_with_its_own_code(bus: Bus) -> None:
    """A message version newer than execd knows is refused as unsupported_version."""
    err = await _error(bus, RUN, pack({"v": 99, "shell": "true"}))
    assert isinstance(err, UnsupportedVersion)


@pytest.mark.parametrize(
    "subject",
    [
        SUBJECTS.sandbox("shared", "exec", "nope"),
        SUBJECTS.sandbox("shared", "nope", "run"),
        "sandpod.sbx.shared.exec.run.extra",
        "sandpod.sbx.shared.exec",
    ],
)
async def test_unknown_subjects_get_a_typed_error(bus: Bus, subject: str) -> None:
    """A subject under a served sandbox with no operation is bad_request.unknown_subject (the
    sandbox exists; the operation does not), not sandbox.not_found."""
    err = await _error(bus, subject, encode(ExecRequest(shell="true")))
    assert type(err) is UnknownSubject and err.code == "bad_request.unknown_subject"
    assert not err.retryable


async def test_oversized_request_is_refused(
    bus: Bus,
    start_execd: Callable[..., Execd],
) -> None:
    """A request above execd's limit gets bad_request.too_large (and the hint to stream)."""
    execd: Execd = start_execd(SANDPOD_EXECD_MAX_REQUEST="4096")
    subject = SUBJECTS.sandbox(execd.ids[0], "exec", "run")
    err = await _error(bus, subject, encode(ExecRequest(shell="cat", stdin=b"x" * 10_000)))
    assert isinstance(err, PayloadTooLarge)
    reply = await bus.request(subject, encode(ExecRequest(shell="echo fine")), 5)
    assert decode_reply(ExecResult, reply).stdout == b"fine\n"


async def test_payload_over_the_nats_limit_is_refused_client_side(bus: Bus) -> None:
    """A message bigger than the server's max payload is a typed error before sending."""
    with pytest.raises(PayloadTooLarge):
        await bus.request(RUN, b"x" * (bus.max_payload + 1), 5)


async def test_bad_input_flood_does_not_disturb_other_clients(bus: Bus, sbx: AsyncSandbox) -> None:
    """While one client sends garbage as fast as it can, another's execs all succeed."""

    async def flood() -> int:
        errors = 0
        for i in range(300):
            payload = [b"\x00", pack({"v": 1}), pack({"v": 1, "argv": [i]}), b"\xff" * 1000][i % 4]
            try:
                decode_reply(ExecResult, await bus.request(RUN, payload, 5))
            except BadRequest:
                errors += 1
        return errors

    async def work() -> list[str]:
        return [(await sbx.exec(["echo", str(i)])).stdout for i in range(50)]

    errors, outputs = await asyncio.gather(flood(), work())
    assert errors == 300
    assert outputs == [f"{i}\n" for i in range(50)]


async def test_requests_without_reply_subject_are_harmless(bus: Bus, sbx: AsyncSandbox) -> None:
    """Publishing a request with nowhere to reply runs nothing harmful and breaks nothing."""
    for payload in (b"junk", encode(ExecRequest(shell="true"))):
        await bus.publish(RUN, payload)
    await bus.flush()
    assert (await sbx.exec("echo alive")).stdout == "alive\n"


START = SUBJECTS.sandbox("shared", "exec", "start")


@pytest.mark.parametrize(
    "deliver", ["_INBOX.*", "_INBOX.>", "a..b", "has space", "sandpod.sbx.other.exec.run"]
)
async def test_deliver_must_be_a_concrete_subject_outside_sandpod(bus: Bus, deliver: str) -> None:
    """execd never publishes frames to wildcards or into Sandpod's own subjects."""
    err = await _error(bus, START, pack({"v": 1, "shell": "true", "deliver": deliver}))
    assert isinstance(err, BadRequest)


RESUME = SUBJECTS.sandbox("shared", "exec", "resume")


@pytest.mark.parametrize(
    "deliver", ["_INBOX.*", "_INBOX.>", "a..b", "has space", "sandpod.sbx.other.exec.run"]
)
async def test_resume_cannot_redirect_frames_into_sandpod(
    bus: Bus, sbx: AsyncSandbox, deliver: str
) -> None:
    """exec.resume of a running stream refuses the deliver subjects exec.start refuses."""
    async with sbx.exec_stream("sleep 60") as stream:
        resume = {"v": 1, "exec_id": stream.exec_id, "from_seq": 1, "deliver": deliver}
        err = await _error(bus, RESUME, pack(resume))
        assert isinstance(err, BadRequest), err


async def test_a_reused_exec_id_is_refused(bus: Bus, sbx: AsyncSandbox) -> None:
    """An exec id that is running or finished recently cannot be reused (no mixed-up probes)."""
    from sandpod_contract.errors import ExecIdInUse

    first = await bus.request(RUN, encode(ExecRequest(exec_id="reused-id-1", shell="true")), 5)
    assert decode_reply(ExecResult, first).exit_code == 0
    err = await _error(bus, RUN, encode(ExecRequest(exec_id="reused-id-1", shell="true")))
    assert isinstance(err, ExecIdInUse) and not err.retryable
