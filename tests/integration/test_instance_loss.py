# ruff: noqa: F811 - the lifecycle fixtures come from test_lifecycle by name
"""A local sandbox whose jail dies, seen through a real lifecycle: it must say so, once.

Today a jail whose holder died (killed from the host, or by its own sandbox's OOM killer) stayed
``Running/Ready=True`` while every exec failed, and the lifecycle re-"readied" it in a loop,
publishing hundreds of ``ready`` events a second into an unbounded stream. What must hold: the
Sandbox goes ``Ready=False`` + ``Failed`` with a stable reason (``InstanceLost`` here) within
seconds -- noticed by the driver's watch on the holder, not the periodic resync, which these
tests push out to a minute -- with a handful of events, on a stream bounded in size and age; a
sandbox filling ``/dev/shm`` does not lose its jail at all.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable

import nats
import psutil
import pytest
from test_lifecycle import Lifecycle, _ready_api, _until, lifecycles  # noqa: F401

from sandpod import AsyncSandbox
from sandpod.control import api_call
from sandpod.errors import SandpodError
from sandpod_contract.messages.sandboxes import ObjectReply, ObjectRequest

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the local runtime needs root (run the suite as root, as CI does)"
)

LOCAL = {"SANDPOD_RUNTIME": "local", "SANDPOD_RESYNC": "60"}  # only the holder watch is quick
DEADLINE = 10.0  # seconds from the kill to Failed


async def _stream(lc: Lifecycle) -> tuple[int, object]:
    """(messages in the installation's event stream, its config)."""
    nc = await nats.connect(lc.url)
    try:
        info = await nc.jetstream().stream_info(f"{lc.prefix}-events")
    finally:
        await nc.close()
    return info.state.messages, info.config


def _passes(lc: Lifecycle, name: str) -> int:
    """Reconcile passes of ``default/<name>`` so far (the lifecycle's debug log)."""
    lines = lc.log.read_text(errors="replace").splitlines()
    return sum('"reconcile_done"' in line and f'"default/{name}"' in line for line in lines)


async def test_a_holder_killed_from_the_host_fails_its_sandbox_with_few_events(
    lifecycles: Callable[..., Lifecycle],
) -> None:
    """Host root SIGKILLs a running sandbox's holder: within seconds the Sandbox is Failed with
    Ready=False, both InstanceLost; exec refuses; later passes publish nothing more; the event
    stream is bounded (bytes, age, per subject)."""
    lc = lifecycles(**LOCAL)
    await _ready_api(lc)
    sbx = await AsyncSandbox.create(name="victim", nats_url=lc.url, prefix=lc.prefix)
    async with sbx:
        assert (await sbx.exec("true")).exit_code == 0
        jail = json.loads((lc.state / "jails" / "victim" / "jail.json").read_text())
        holder = psutil.Process(jail["holder_pid"])
        os.kill(holder.pid, signal.SIGKILL)

        async def failed() -> bool:
            return (await sbx.describe()).phase == "Failed"

        await _until(failed, DEADLINE, "the Sandbox to fail after its holder was killed")
        info = await sbx.describe()
        failed_cond, ready = info.condition("Failed"), info.condition("Ready")
        assert failed_cond is not None and ready is not None
        assert (failed_cond["status"], failed_cond["reason"]) == ("True", "InstanceLost")
        assert (ready["status"], ready["reason"]) == ("False", "InstanceLost")
        assert "create a new one" in str(failed_cond["message"])
        with pytest.raises(SandpodError):
            await sbx.exec("true")
        dead = lc.state / "jails" / "victim"
        await _until(lambda: not dead.exists(), 10, "the dead jail to be destroyed")
        settled, config = await _stream(lc)
        assert settled <= 4, f"{settled} events for create, ready and failed"
        # More passes over the Failed sandbox (a renew each) add their renewed events only.
        for _ in range(3):
            before = _passes(lc, "victim")
            await sbx.renew(600)

            def passed(n: int = before) -> bool:
                return _passes(lc, "victim") > n

            await _until(passed, 10, "a pass after renew")
        assert (await _stream(lc))[0] == settled + 3
    bounds = (config.max_bytes, config.max_age, config.max_msgs_per_subject)  # type: ignore[attr-defined]
    assert all(b is not None and b > 0 for b in bounds), f"unbounded event stream: {bounds}"


async def test_filling_dev_shm_through_exec_keeps_the_sandbox_serving(
    lifecycles: Callable[..., Lifecycle],
) -> None:
    """Code in a 64 MiB sandbox fills /dev/shm forty times over: the jail survives, exec still
    answers, the Sandbox stays Running/Ready, and the episode costs no events."""
    lc = lifecycles(**LOCAL)
    await _ready_api(lc)
    sbx = await AsyncSandbox.connect("small-probe", nats_url=lc.url, prefix=lc.prefix)
    template = {
        "kind": "SandboxTemplate",
        "metadata": {"name": "small"},
        "spec": {"resources": {"memory": "64Mi"}},
    }
    await api_call(
        sbx.bus, sbx.subjects, "templates", "apply", ObjectRequest(object=template), ObjectReply
    )
    await sbx.close()
    sbx = await AsyncSandbox.create(
        name="shm-filler", template="small", nats_url=lc.url, prefix=lc.prefix
    )
    async with sbx:
        jail = json.loads((lc.state / "jails" / "shm-filler" / "jail.json").read_text())
        holder = psutil.Process(jail["holder_pid"])
        before, _ = await _stream(lc)
        for _ in range(40):  # today's holder died within ~10-20 of these
            await sbx.exec("cat /dev/zero > /dev/shm/fill$$", timeout=60)
        assert holder.is_running() and holder.status() != psutil.STATUS_ZOMBIE
        assert (await sbx.exec("echo alive")).stdout == "alive\n"
        info = await sbx.describe()
        assert info.phase == "Running" and info.ready
        assert (await _stream(lc))[0] == before
        await sbx.kill()
