"""Hibernation through a real lifecycle (local runtime, as root): idle sandboxes with
``idlePolicy: Hibernate`` give up their instance and keep their files; any call wakes them.

The idle timeout is a couple of seconds; each test waits on the sandbox's own phase, never a
sleep. What frees memory is checked on the host: the jail's holder process and its cgroups are
gone while Hibernated.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable

import psutil
import pytest
from test_default_rootfs import Platform, platform  # noqa: F401 - fixture used by name

from sandpod import AsyncSandbox
from sandpod.control import api_call
from sandpod.errors import ResourceNotFound
from sandpod_bus import Bus, BusSettings
from sandpod_contract.messages.sandboxes import ObjectReply, ObjectRequest, Ref
from sandpod_contract.subjects import Subjects

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="hibernation needs the local runtime as root: run as root"
)

DEADLINE = 60.0
IDLE = 2  # seconds


@pytest.fixture
async def plat(platform: Callable[..., Platform]) -> Platform:  # noqa: F811
    p = platform()
    await p.answering()
    return p


async def _phase(sbx: AsyncSandbox) -> str:
    return (await sbx.describe()).phase


async def _until_phase(sbx: AsyncSandbox, *phases: str, timeout: float = DEADLINE) -> str:
    end = time.monotonic() + timeout
    while (phase := await _phase(sbx)) not in phases:
        if time.monotonic() > end:
            pytest.fail(f"{sbx.id} stayed {phase}, not {phases}")
        await asyncio.sleep(0.02)
    return phase


def _holders(sandbox_id: str) -> list[int]:
    """Host pids of the sandbox's jail holder (its hostname is the sandbox id)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "sandpod-holder" in cmd and sandbox_id in cmd:
            out.append(p.pid)
    return out


async def _create(p: Platform, **kw: object) -> AsyncSandbox:
    return await AsyncSandbox.create(
        name=f"h-{uuid.uuid4().hex[:6]}",
        idle_timeout=IDLE,
        idle_policy="Hibernate",
        nats_url=p.url,
        prefix=p.prefix,
        wait=DEADLINE,
        **kw,  # type: ignore[arg-type]
    )


async def _sh(sbx: AsyncSandbox, script: str) -> str:
    r = await sbx.exec(["sh", "-c", script], timeout=60)
    assert r.exit_code == 0, (r.exit_code, r.stderr)
    return r.stdout


async def test_an_idle_sandbox_hibernates_frees_its_instance_and_wakes_on_exec(
    plat: Platform,
) -> None:
    """Idle past its timeout, the sandbox is Hibernated (files-only, said in its condition),
    its jail's processes are gone; the next exec wakes it transparently and sees every file;
    the process that ran before did not survive (files only)."""
    sbx = await _create(plat)
    await _sh(sbx, "echo kept > /workspace/f; mkdir -p /var/tmp/x && echo root > /var/tmp/x/r")
    await _sh(sbx, "printf 'while :; do sleep 1; done' > /workspace/loop.sh")
    await _sh(sbx, "setsid sh /workspace/loop.sh >/dev/null 2>&1 < /dev/null &")
    assert "loop.sh" in await _sh(sbx, "ps -eo args")
    assert _holders(sbx.id)
    await _until_phase(sbx, "Hibernated")
    info = await sbx.describe()
    cond = info.condition("Hibernated")
    assert cond is not None and cond["status"] == "True" and cond["reason"] == "FilesOnly"
    assert not _holders(sbx.id)
    assert await _sh(sbx, "cat /workspace/f /var/tmp/x/r") == "kept\nroot\n"
    assert await _phase(sbx) == "Running"
    assert "loop.sh" not in await _sh(sbx, "ps -eo args")
    await sbx.kill()
    await sbx.close()


async def test_concurrent_calls_on_a_hibernated_sandbox_are_all_answered(plat: Platform) -> None:
    """Ten execs and a file read sent at once to a hibernated sandbox all get their answer
    (one wake, every request sent again once it runs)."""
    sbx = await _create(plat)
    await _sh(sbx, "echo data > /workspace/d")
    await _until_phase(sbx, "Hibernated")
    execs = [sbx.exec(["sh", "-c", f"echo {i}; cat /workspace/d"]) for i in range(10)]
    read = asyncio.ensure_future(sbx.fs.read_text("/workspace/d"))
    outs = await asyncio.gather(*execs)
    assert [o.stdout for o in outs] == [f"{i}\ndata\n" for i in range(10)], [o.stderr for o in outs]
    assert await read == "data\n"
    await sbx.kill()
    await sbx.close()


async def test_a_call_arriving_while_it_hibernates_gets_its_answer(plat: Platform) -> None:
    """An exec sent while the sandbox is Hibernating (a 60 MB workspace keeps it there a
    while) is answered: by its execd while that drains, or -- once it stopped serving -- after
    the hibernation ended and the wake (never ExecLost, never a lost request)."""
    sbx = await _create(plat)
    await _sh(sbx, "head -c 60000000 /dev/urandom > /workspace/big && echo y > /workspace/s")
    await _until_phase(sbx, "Hibernating", "Hibernated")
    out = await sbx.exec(["cat", "/workspace/s"])
    assert out.stdout == "y\n"  # answered by the draining execd, or after the wake
    await sbx.kill()
    await sbx.close()


async def test_a_woken_sandbox_hibernates_again_keeping_later_changes(plat: Platform) -> None:
    """Hibernate, wake, change files, hibernate again: the second wake has both the first
    files and the later change, and deleted files stay deleted."""
    sbx = await _create(plat)
    await _sh(sbx, "echo one > /workspace/a; echo gone > /workspace/g")
    await _until_phase(sbx, "Hibernated")
    await _sh(sbx, "echo two > /workspace/b; rm /workspace/g")
    await _until_phase(sbx, "Hibernated")
    assert await _sh(sbx, "cat /workspace/a /workspace/b; ls /workspace") == "one\ntwo\na\nb\n"
    await sbx.kill()
    await sbx.close()


async def test_deleting_a_hibernated_sandbox_deletes_its_snapshot(plat: Platform) -> None:
    """The hibernation snapshot is the sandbox's: deleting the sandbox removes it (and the
    listing never offers it to delete while the sandbox exists)."""
    sbx = await _create(plat)
    await _sh(sbx, "echo x > /workspace/x")
    await _until_phase(sbx, "Hibernated")
    snaps = [s for s in await sbx.snapshots.list() if s.source == sbx.id]
    assert len(snaps) == 1 and snaps[0].name.startswith("hib-")
    with pytest.raises(Exception, match=r"in_use|restored by"):
        await sbx.snapshots.delete(snaps[0].name)
    await sbx.kill()
    end = time.monotonic() + DEADLINE
    while [s for s in await sbx.snapshots.list() if s.source == sbx.id]:
        assert time.monotonic() < end, "the hibernation snapshot outlived its sandbox"
        await asyncio.sleep(0.05)
    await sbx.close()


async def test_another_tenant_cannot_wake_or_see_a_hibernated_sandbox(plat: Platform) -> None:
    """Tenant beta's wake of acme's sandbox (by name or id) is not-found and changes nothing."""
    bus = await Bus.connect(BusSettings(url=plat.url, name="tenants"))
    try:
        acme, beta = Subjects(plat.prefix, tenant="acme"), Subjects(plat.prefix, tenant="beta")
        obj = {
            "kind": "Sandbox",
            "metadata": {"name": "sleepy"},
            "spec": {"idleTimeoutSeconds": IDLE, "idlePolicy": "Hibernate"},
        }
        made = await api_call(
            bus,
            acme,
            "sandboxes",
            "create",
            ObjectRequest(object=obj, wait_ready=DEADLINE),
            ObjectReply,
            timeout=DEADLINE + 10,
        )
        sid = made.object["metadata"]["name"]
        async with await AsyncSandbox.connect(sid, nats_url=plat.url, prefix=plat.prefix) as s:
            await _until_phase(s, "Hibernated")
            for target in ("sleepy", sid):
                with pytest.raises(ResourceNotFound):
                    await api_call(bus, beta, "sandboxes", "wake", Ref(name=target), ObjectReply)
            assert await _phase(s) == "Hibernated"
            await s.kill()
    finally:
        await bus.close()
