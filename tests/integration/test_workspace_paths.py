"""No reply of execd's process runtime carries a host path (issue 13.5 item 14).

In the process runtime ``/workspace`` is an alias of a host directory; clients name paths
through it and must get them back the same way: ``sys.info.workspace``, an invalid cwd's error,
the cwd of background processes, ptys and sessions. The host path is learnt here the only way a
client can: from a command (``pwd -P``: a process on the host sees where it really is).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from conftest import NatsServer
from sandpod_bus import Bus, BusSettings
from sandpod_contract.codec import Message, decode_reply, encode
from sandpod_contract.errors import InvalidCwd
from sandpod_contract.messages.common import Empty
from sandpod_contract.messages.exec import ExecRequest, ExecResult
from sandpod_contract.messages.proc import ProcInfo, ProcKill, ProcRef, ProcStart
from sandpod_contract.messages.pty import PtyInfo, PtyOpen, PtyRef
from sandpod_contract.messages.session import SessionCreate, SessionInfo, SessionRef
from sandpod_contract.messages.system import Info
from sandpod_contract.subjects import Subjects

SUBJECTS = Subjects()


class Raw:
    """Requests to the shared execd's ``shared`` sandbox, keeping every reply's bytes."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.replies: list[bytes] = []

    async def call(self, family: str, verb: str, msg: Message, reply: type[Message]) -> bytes:
        data = await self.bus.request(SUBJECTS.sandbox("shared", family, verb), encode(msg), 10)
        self.replies.append(data)
        return data


@pytest.fixture
async def raw(nats: NatsServer, shared_execd) -> AsyncIterator[Raw]:  # type: ignore[no-untyped-def]
    bus = await Bus.connect(BusSettings(url=nats.url))
    yield Raw(bus)
    await bus.close()


async def _host_workspace(raw: Raw) -> bytes:
    data = await raw.bus.request(
        SUBJECTS.sandbox("shared", "exec", "run"), encode(ExecRequest(shell="pwd -P")), 10
    )
    host = decode_reply(ExecResult, data).stdout.strip()
    assert host.startswith(b"/") and host != b"/workspace"  # the process runtime: a host dir
    return host


async def test_no_reply_carries_the_host_workspace_path(raw: Raw) -> None:
    """sys.info, an invalid cwd, proc/pty/session infos: /workspace, never the host path."""
    host = await _host_workspace(raw)
    info = decode_reply(Info, await raw.call("sys", "info", Empty(), Info))
    assert info.workspace == "/workspace"
    for cwd, shown in (
        ("/workspace/nope", "/workspace/nope"),
        ("nope/deeper", "/workspace/nope/deeper"),
    ):
        with pytest.raises(InvalidCwd) as caught:
            decode_reply(
                ExecResult,
                await raw.call("exec", "run", ExecRequest(argv=("true",), cwd=cwd), ExecResult),
            )
        assert caught.value.details["cwd"] == shown
    start = ProcStart(proc_id="paths", shell="sleep 30", cwd="/workspace")
    proc = decode_reply(ProcInfo, await raw.call("proc", "start", start, ProcInfo))
    assert proc.cwd == "/workspace"
    await raw.call("proc", "kill", ProcKill(proc_id="paths", signal=9, grace=0), ProcInfo)
    await raw.call("proc", "remove", ProcRef(proc_id="paths"), ProcInfo)
    pty = decode_reply(
        PtyInfo, await raw.call("pty", "open", PtyOpen(pty_id="paths", shell="sleep 30"), PtyInfo)
    )
    assert pty.cwd == "/workspace"
    await raw.call("pty", "close", PtyRef(pty_id="paths"), PtyInfo)
    created = SessionCreate(session_id="paths", cwd="/workspace")
    session = decode_reply(SessionInfo, await raw.call("session", "create", created, SessionInfo))
    assert session.cwd in (None, "/workspace")
    await raw.call("session", "delete", SessionRef(session_id="paths"), SessionInfo)
    leaks = [data for data in raw.replies if host in data]
    assert leaks == []
