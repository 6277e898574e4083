"""A node's execd stops serving a sandbox with a drain (hibernation's ``release`` with
``drain``): every request it had already received gets its answer, and later ones find no
responder (the caller's cue to wake the sandbox).

A CI run lost one: ``test_a_call_arriving_while_it_hibernates_gets_its_answer`` waited the exec's
whole 70 s timeout, because the unsubscribe dropped the requests still queued in the
subscription or on their way to it, delivered but not yet handled. Here execs keep coming from
one connection while the release comes from another (as from the lifecycle), so some are on
their way when execd unsubscribes.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import NatsServer
from sandpod_bus import Bus, BusSettings, NoResponders
from sandpod_contract.codec import decode_reply, encode
from sandpod_contract.errors import RequestTimeout
from sandpod_contract.messages.exec import ExecRequest, ExecResult
from sandpod_contract.messages.node import NodeSandboxes, Release, Serve
from sandpod_contract.subjects import Subjects

BURST = 300


@pytest.fixture
def node_execd(nats: NatsServer, tmp_path: Path) -> Iterator[Subjects]:
    """An execd serving sandboxes on demand for node ``n1`` (process runtime)."""
    subjects = Subjects(f"t{uuid.uuid4().hex[:8]}")
    env = {
        **os.environ,
        "SANDPOD_NATS_URL": nats.url,
        "SANDPOD_PREFIX": subjects.prefix,
        "SANDPOD_EXECD_NODE": "n1",
        "SANDPOD_SANDBOX_ID": "",
        "SANDPOD_STATE_DIR": str(tmp_path),
    }
    with (tmp_path / "execd.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sandpod_execd"], env=env, stdout=log, stderr=log
        )
    try:
        yield subjects
    finally:
        proc.terminate()
        proc.wait(15)


async def _node(bus: Bus, subjects: Subjects, verb: str, payload: bytes) -> NodeSandboxes:
    return decode_reply(
        NodeSandboxes, await bus.request(subjects.node("n1", "execd", verb), payload, 30)
    )


async def test_a_draining_release_answers_every_request_execd_received(
    nats: NatsServer, node_execd: Subjects
) -> None:
    subjects = node_execd
    bus = await Bus.connect(BusSettings(url=nats.url, name="release-test"))
    lifecycle = await Bus.connect(BusSettings(url=nats.url, name="release-test-lifecycle"))
    try:
        for _ in range(200):  # execd listens on the node subject once started
            try:
                await _node(bus, subjects, "list", b"")
                break
            except (NoResponders, RequestTimeout):
                await asyncio.sleep(0.1)
        else:
            pytest.fail("the node execd did not answer")
        served = await _node(bus, subjects, "serve", encode(Serve(sandbox_id="sb1")))
        assert served.sandbox_ids == ("sb1",)
        run = subjects.sandbox("sb1", "exec", "run")

        async def one(i: int) -> str:
            req = ExecRequest(exec_id=f"e{i}", argv=("true",), timeout=30)
            try:
                reply = await bus.request(run, encode(req), 20)
            except NoResponders:
                return "no responder"
            except RequestTimeout:
                return "lost"
            return f"exit {decode_reply(ExecResult, reply).exit_code}"

        async def release() -> NodeSandboxes:
            msg = encode(Release(sandbox_id="sb1", drain=10.0))
            return await _node(lifecycle, subjects, "release", msg)

        calls, releasing = [], None
        for i in range(BURST):  # requests keep coming while the release is handled
            calls.append(asyncio.ensure_future(one(i)))
            if i == BURST // 3:
                releasing = asyncio.ensure_future(release())
            await asyncio.sleep(0.0005)
        assert releasing is not None
        assert (await releasing).sandbox_ids == ()
        outcomes = await asyncio.gather(*calls)
        assert outcomes.count("lost") == 0, sorted(set(outcomes))
        assert "exit 0" in outcomes  # the burst did reach execd before the release
        # after the release: nobody answers, at once
        with pytest.raises(NoResponders):
            await bus.request(run, encode(ExecRequest(argv=("true",))), 20)
    finally:
        await bus.close()
        await lifecycle.close()
