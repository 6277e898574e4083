"""The protocol client's liveness rules (sandpod_client.liveness.watch), on fake probes: what each
probe answer means for a request that never answers (the contract's "Liveness probing" table).

The work never completes, so the outcome depends only on the probe answers, not on timing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from sandpod_bus import NoResponders
from sandpod_client.channel import Channel, status_probe
from sandpod_client.liveness import Probe, watch
from sandpod_contract.codec import encode_error
from sandpod_contract.errors import (
    ExecLost,
    ExecNotFound,
    RequestTimeout,
    SandboxNotFound,
    SandboxUnavailable,
    SandpodError,
)
from sandpod_contract.messages.exec import ExecRef, ExecStatus
from sandpod_contract.subjects import Subjects


def _probe(answers: Iterator[ExecStatus | SandpodError]) -> Probe:
    async def probe() -> ExecStatus:
        answer = next(answers)
        if isinstance(answer, SandpodError):
            raise answer
        return answer

    return probe


def _running() -> ExecStatus:
    return ExecStatus(exec_id="e", state="running")


def _exited() -> ExecStatus:
    return ExecStatus(exec_id="e", state="exited", exit_code=0)


async def _watch_forever(answers: list[ExecStatus | SandpodError], **kw: bool) -> None:
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    await watch(never, _probe(iter(answers)), what="exec e", interval=0.001, **kw)


@pytest.mark.parametrize(
    ("answers", "error"),
    [
        pytest.param([_running(), SandboxNotFound()], SandboxUnavailable, id="no-responders"),
        pytest.param([ExecNotFound()], ExecLost, id="another-execd"),
        pytest.param([RequestTimeout()] * 3, SandboxUnavailable, id="three-timeouts"),
        pytest.param([_running(), _exited(), _running(), _exited()], ExecLost, id="reply-lost"),
    ],
)
async def test_probe_answers_map_to_typed_errors(
    answers: list[ExecStatus | SandpodError], error: type[SandpodError]
) -> None:
    """Each probe answer ends a request that never answers with the contract's error."""
    with pytest.raises(error):
        await _watch_forever(answers)


async def test_timeouts_that_are_not_consecutive_do_not_give_up() -> None:
    """A probe that answers resets the count of missed probes."""
    round_: list[ExecStatus | SandpodError] = [RequestTimeout(), RequestTimeout(), _running()]
    answers = [*round_ * 3, SandboxNotFound()]
    with pytest.raises(SandboxUnavailable) as info:
        await _watch_forever(answers)
    assert "stopped answering" in info.value.message


async def test_exit_does_not_mean_lost_for_work_that_may_outlast_the_process() -> None:
    """exit_means_lost=False (a stdin write): only execd's silence ends the wait."""
    answers: list[ExecStatus | SandpodError] = [_exited()] * 5 + [SandboxNotFound()]
    with pytest.raises(SandboxUnavailable):
        await _watch_forever(answers, exit_means_lost=False)


async def test_the_work_result_is_returned_and_a_failure_cancels_the_work() -> None:
    """Work that answers is returned as is; work left by a failed watch is cancelled."""
    assert await watch(asyncio.sleep(0, "ok"), _probe(iter([])), what="x") == "ok"
    task = asyncio.ensure_future(asyncio.Event().wait())
    with pytest.raises(SandboxUnavailable):
        await watch(task, _probe(iter([SandboxNotFound()])), what="x", interval=0.001)
    assert task.cancelled()


class _WokenBus:
    """A bus whose sandbox has hibernated: the first request finds no execd; from the moment
    the wake has begun, the woken execd answers, and knows no exec yet."""

    max_payload = 1 << 20

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def request(self, subject: str, data: bytes, timeout: float) -> bytes:
        self.asked.append(subject)
        if len(self.asked) == 1:
            raise NoResponders(subject)
        return encode_error(ExecNotFound("exec 'e' is unknown to this execd"))


async def test_an_exec_unknown_to_an_execd_woken_meanwhile_is_not_lost() -> None:
    """The exec's request found the sandbox hibernated and waits for its wake; the woken
    execd answers the liveness probe before the request is sent to it again. That "unknown
    exec" is the request still on its way, not a restarted execd: the probe says alive."""
    bus = _WokenBus()
    waking, probed = asyncio.Event(), asyncio.Event()

    async def wake(_sandbox: str) -> bool:
        waking.set()
        await probed.wait()  # the wake returns only after the probe has asked
        return True

    link = Channel(bus, Subjects("t"), "sbx", wake=wake)  # type: ignore[arg-type]
    probe = status_probe(link, "e")
    call = asyncio.ensure_future(link.call("exec", "run", ExecRef(exec_id="e"), ExecStatus, 1))
    await waking.wait()
    try:
        assert await probe() is None
    finally:
        probed.set()
    with pytest.raises(ExecNotFound):  # the re-sent request's own answer, in this fake
        await call
    assert await probe() is None  # and later probes too: the wake happened
