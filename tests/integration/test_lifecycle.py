"""Lifecycle: Sandbox resources driven to their spec by real lifecycle processes over NATS."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import nats
import psutil
import pytest
from nats.aio.msg import Msg

from conftest import NatsServer
from sandpod import AsyncSandbox
from sandpod.control import api_call
from sandpod.errors import ResourceInvalid, SandboxNotFound, SandpodError
from sandpod.supervisor import PlatformConfig
from sandpod_contract.codec import decode
from sandpod_contract.messages.sandboxes import ObjectReply, ObjectRequest, SandboxEvent
from sandpod_contract.subjects import Subjects
from sandpod_lifecycle.runtime.installation import Installation

# Bounds of the waits on a reconciler (resync 0.5 s): far above what a loaded machine takes, so
# the tests wait on the event and fail only when it never comes.
EVENT_DEADLINE = 60.0
BUSY_IDLE = 6  # the busy sandbox's idle timeout, seconds

DESTROY_JAIL = """
import asyncio, sys
from pathlib import Path
from sandpod_lifecycle.runtime.local import LocalRuntime, LocalRuntimeConfig
rt = LocalRuntime(LocalRuntimeConfig(state_dir=Path(sys.argv[1]), cgroup_parent=sys.argv[3]))
asyncio.run(rt.destroy(sys.argv[2]))
"""


class Lifecycle:
    def __init__(
        self, nats: NatsServer, state: Path, prefix: str, replica: str, **extra: str
    ) -> None:
        self.state, self.prefix, self.url = state, prefix, nats.url
        env = {
            **os.environ,
            "SANDPOD_NATS_URL": nats.url,
            "SANDPOD_PREFIX": prefix,
            "SANDPOD_STATE_DIR": str(state),
            "SANDPOD_RESYNC": "0.5",
            "SANDPOD_LEASE_TTL": "2",
            "SANDPOD_REPLICA_ID": replica,
            "SANDPOD_LOG_LEVEL": "debug",
            **extra,
        }
        self.log = state / f"lifecycle-{replica}.log"
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sandpod_lifecycle"], env=env, stdout=out, stderr=out
            )

    def execd_pids(self) -> dict[str, int]:
        out = {}
        for record in (self.state / "instances").glob("*.json"):
            data = json.loads(record.read_text())
            if psutil.pid_exists(data["pid"]):
                out[data["id"]] = data["pid"]
        return out


@pytest.fixture
def lifecycles(nats: NatsServer, tmp_path: Path) -> Iterator[Callable[..., Lifecycle]]:
    """Start lifecycle replicas sharing one state dir and a private subject prefix."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    started: list[Lifecycle] = []

    def start(**extra: str) -> Lifecycle:
        lc = Lifecycle(nats, tmp_path, prefix, f"r{len(started)}", **extra)
        started.append(lc)
        return lc

    yield start
    for lc in started:
        if lc.proc.poll() is None:
            lc.proc.terminate()
            lc.proc.wait(20)
    for jail in (tmp_path / "jails").glob("*/jail.json"):  # local runtime: destroy what is left
        subprocess.run(
            [
                sys.executable,
                "-c",
                DESTROY_JAIL,
                str(tmp_path / "jails"),
                jail.parent.name,
                Installation.claim(prefix, tmp_path, None).cgroup_parent,
            ],
            check=False,
            timeout=60,
        )
    pids = started[0].execd_pids() if started else {}
    for pid in pids.values():  # instances outlive lifecycle on purpose; tests clean them up
        os.kill(pid, signal.SIGKILL)
    psutil.wait_procs([psutil.Process(p) for p in pids.values() if psutil.pid_exists(p)], 10)


async def _until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not await _maybe_await(predicate()):
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


async def _maybe_await(value: object) -> object:
    return await value if asyncio.iscoroutine(value) else value


async def _gone(lc: Lifecycle, name: str) -> bool:
    try:
        async with await AsyncSandbox.connect(name, nats_url=lc.url, prefix=lc.prefix) as s:
            await s.describe()
    except SandpodError as exc:
        return exc.code == "store.not_found"
    return False


def _env(proc: psutil.Process) -> dict[str, str]:
    try:
        return proc.environ()
    except psutil.Error:
        return {}


@contextlib.asynccontextmanager
async def _events(lc: Lifecycle, name: str) -> AsyncIterator[asyncio.Queue[SandboxEvent]]:
    """Every event of sandbox ``name`` from now on: the subscription is in place (the server
    confirmed it) before this returns, so an event of a sandbox created afterwards cannot be
    published before anyone listens."""
    queue: asyncio.Queue[SandboxEvent] = asyncio.Queue(maxsize=256)

    async def on_event(msg: Msg) -> None:
        queue.put_nowait(decode(SandboxEvent, msg.data))

    nc = await nats.connect(lc.url)
    try:
        await nc.subscribe(Subjects(lc.prefix).events_of("sandbox", name), cb=on_event)
        await nc.flush()
        yield queue
    finally:
        await nc.close()


async def _event(events: asyncio.Queue[SandboxEvent], type_: str) -> SandboxEvent:
    """The next event of type ``type_`` (earlier ones of other types are passed over)."""

    async def find() -> SandboxEvent:
        while (event := await events.get()).type != type_:
            pass
        return event

    try:
        return await asyncio.wait_for(find(), EVENT_DEADLINE)
    except TimeoutError:
        pytest.fail(f"no {type_!r} event within {EVENT_DEADLINE}s")


def _drained(events: asyncio.Queue[SandboxEvent]) -> list[SandboxEvent]:
    out = []
    while not events.empty():
        out.append(events.get_nowait())
    return out


async def _ready_api(lc: Lifecycle) -> None:
    async def answers() -> bool:
        try:
            await AsyncSandbox.list(nats_url=lc.url, prefix=lc.prefix)
        except SandpodError:
            return False
        return True

    await _until(answers, 20, "the lifecycle API")


async def test_create_exec_and_honest_isolation_condition(
    lifecycles: Callable[[], Lifecycle],
) -> None:
    """create returns a Ready sandbox whose execd answers; the process runtime says NoIsolation."""
    lc = lifecycles()
    await _ready_api(lc)
    sbx = await AsyncSandbox.create(
        name="demo", labels={"team": "a"}, nats_url=lc.url, prefix=lc.prefix
    )
    async with sbx:
        assert (await sbx.exec("/workspace", "echo hi")).stdout == "hi\n"
        info = await sbx.describe()
        assert info.phase == "Running" and info.ready and info.shutdown_time
        isolated = info.condition("Isolated")
        assert isolated is not None and isolated["status"] == "False"
        assert isolated["reason"] == "NoIsolation"
    listed = await AsyncSandbox.list("team=a", nats_url=lc.url, prefix=lc.prefix)
    assert [i.name for i in listed] == ["demo"]
    assert await AsyncSandbox.list("team=b", nats_url=lc.url, prefix=lc.prefix) == []


async def test_ttl_expiry_destroys_instance_and_publishes_event(
    lifecycles: Callable[[], Lifecycle],
) -> None:
    """A sandbox past its shutdownTime is destroyed, deleted and an `expired` event says why."""
    lc = lifecycles()
    await _ready_api(lc)
    name = f"ttl-{uuid.uuid4().hex[:8]}"
    async with _events(lc, name) as events:  # subscribed before the sandbox exists
        # A lifetime no loaded machine uses up before its execd's pid is read; then it ends.
        sbx = await AsyncSandbox.create(name=name, timeout=120, nats_url=lc.url, prefix=lc.prefix)
        async with sbx:
            pid = lc.execd_pids()[sbx.id]
            await sbx.renew(1)
            expired = await _event(events, "expired")
            assert expired.reason == "LifetimeExceeded", expired
            # published after the instance was destroyed and the object deleted
            await _until(lambda: not psutil.pid_exists(pid), 60, "execd to stop")
            assert await _gone(lc, sbx.id)
            with pytest.raises(SandboxNotFound):
                await sbx.exec("true")


async def test_idle_expiry_and_think_time_within_the_limit(
    lifecycles: Callable[[], Lifecycle],
) -> None:
    """Idle past idleTimeoutSeconds expires; activity within the limit keeps a sandbox alive."""
    lc = lifecycles()
    await _ready_api(lc)
    names = {role: f"{role}-{uuid.uuid4().hex[:8]}" for role in ("idle", "busy")}
    async with _events(lc, names["idle"]) as idle_events, _events(lc, names["busy"]) as busy_events:
        idle = await AsyncSandbox.create(
            name=names["idle"], idle_timeout=2, nats_url=lc.url, prefix=lc.prefix
        )
        busy = await AsyncSandbox.create(
            name=names["busy"], idle_timeout=BUSY_IDLE, nats_url=lc.url, prefix=lc.prefix
        )
        async with idle, busy:
            # An agent thinking 1 s between tool calls (BUSY_IDLE - 1 s of slack per pause),
            # until the idle one expired and the busy one lived twice its idle timeout.
            expired = asyncio.ensure_future(_event(idle_events, "idle_expired"))
            outlived = time.monotonic() + 2 * BUSY_IDLE
            try:
                while not expired.done() or time.monotonic() < outlived:
                    assert (await busy.exec("true")).exit_code == 0
                    await asyncio.sleep(1.0)  # the agent's think time (what is under test)
                assert expired.result().reason == "IdleTimeout"
            finally:
                expired.cancel()
            assert (await busy.describe()).phase == "Running"
            assert not [e for e in _drained(busy_events) if e.type.endswith("expired")]
            assert await _gone(lc, idle.id)  # the event comes after the delete


async def test_renew_pushes_expiry(lifecycles: Callable[[], Lifecycle]) -> None:
    """renew moves shutdownTime later and the sandbox outlives its original lifetime."""
    lc = lifecycles()
    await _ready_api(lc)
    # 6 s: a lifetime a loaded machine cannot use up between the create and the renew.
    async with await AsyncSandbox.create(timeout=6, nats_url=lc.url, prefix=lc.prefix) as sbx:
        before = (await sbx.describe()).shutdown_time
        after = (await sbx.renew(60)).shutdown_time
        assert after and before and after > before
        original = datetime.datetime.fromisoformat(before.replace("Z", "+00:00")).timestamp()
        while time.time() < original + 0.5:  # past the original lifetime (a deadline)
            await asyncio.sleep(0.1)
        assert (await sbx.exec("echo alive")).stdout == "alive\n"


async def test_pause_freezes_and_resume_continues(
    lifecycles: Callable[[], Lifecycle], tmp_path: Path
) -> None:
    """While paused a background counter stops advancing; after resume it advances again."""
    lc = lifecycles()
    await _ready_api(lc)
    counter = tmp_path / "counter"
    async with await AsyncSandbox.create(nats_url=lc.url, prefix=lc.prefix) as sbx:
        # A running command (the process runtime freezes execd's process tree; the local
        # runtime's freezer cgroup also catches daemons that left it).
        stream = sbx.exec_stream(f"while :; do echo x >> {counter}; sleep 0.02; done")
        async with stream:
            await _until(lambda: counter.exists() and counter.stat().st_size > 10, 10, "counter")
            assert (await sbx.pause()).phase == "Paused"
            frozen = counter.stat().st_size
            await asyncio.sleep(0.5)  # long enough for ~25 increments if it were running
            assert counter.stat().st_size == frozen
            assert (await sbx.resume()).phase == "Running"
            await _until(lambda: counter.stat().st_size > frozen, 10, "the counter to continue")
            await stream.cancel()


async def test_delete_removes_instance(lifecycles: Callable[[], Lifecycle]) -> None:
    """kill() deletes the object and stops its execd."""
    lc = lifecycles()
    await _ready_api(lc)
    sbx = await AsyncSandbox.create(nats_url=lc.url, prefix=lc.prefix)
    pid = lc.execd_pids()[sbx.id]
    await sbx.kill()
    await _until(lambda: not psutil.pid_exists(pid), 10, "execd to stop")
    assert await _gone(lc, sbx.id)
    await sbx.close()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"template": "no-such-template"}, "spec.templateRef.name"),
        ({"idle_timeout": -5}, "spec.idleTimeoutSeconds"),
        ({"name": "Bad_Name"}, "metadata.name"),
        ({"labels": {"bad key": "x"}}, "metadata.labels"),
    ],
)
async def test_invalid_requests_are_typed_errors(
    lifecycles: Callable[[], Lifecycle], kwargs: dict[str, object], field: str
) -> None:
    """Unknown templates, negative limits, bad names and labels are refused with the field."""
    lc = lifecycles()
    await _ready_api(lc)
    with pytest.raises(ResourceInvalid) as info:
        await AsyncSandbox.create(nats_url=lc.url, prefix=lc.prefix, **kwargs)  # type: ignore[arg-type]
    assert info.value.details.get("field") == field


async def test_restart_converges_and_orphans_are_destroyed(
    lifecycles: Callable[[], Lifecycle],
) -> None:
    """Killed mid-work, a restarted lifecycle adopts instances (no duplicates) and destroys
    instances whose objects are gone."""
    lc = lifecycles()
    await _ready_api(lc)
    kept = await AsyncSandbox.create(nats_url=lc.url, prefix=lc.prefix)
    doomed = await AsyncSandbox.create(nats_url=lc.url, prefix=lc.prefix)
    pids = lc.execd_pids()
    lc.proc.send_signal(signal.SIGKILL)
    lc.proc.wait(10)
    # While no lifecycle runs, the object of `doomed` disappears behind its back.
    from sandpod_bus import Bus, BusSettings
    from sandpod_store import KvStore

    bus = await Bus.connect(BusSettings(url=lc.url))
    store = await KvStore.open(bus, bucket=f"{lc.prefix}-resources")
    await store.delete("Sandbox", "default", doomed.id)
    await bus.close()
    lc2 = lifecycles()
    await _until(lambda: not psutil.pid_exists(pids[doomed.id]), 20, "the orphan to be destroyed")
    async with kept:
        assert (await kept.exec("echo adopted")).stdout == "adopted\n"
        assert lc2.execd_pids()[kept.id] == pids[kept.id]  # adopted, not re-created
    await doomed.close()


async def test_two_replicas_never_double_create(lifecycles: Callable[[], Lifecycle]) -> None:
    """Two replicas reconcile ten sandboxes: exactly one execd each; killing one loses nothing."""
    first, second = lifecycles(), lifecycles()
    await _ready_api(first)
    created = await asyncio.gather(
        *(AsyncSandbox.create(nats_url=first.url, prefix=first.prefix) for _ in range(10))
    )
    second.proc.send_signal(signal.SIGKILL)
    second.proc.wait(10)
    more = await AsyncSandbox.create(nats_url=first.url, prefix=first.prefix)
    counts: dict[str, int] = {}
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            env = proc.environ()
        except psutil.Error:
            continue
        if env.get("SANDPOD_PREFIX") == first.prefix and "sandpod_execd" in " ".join(
            proc.cmdline()
        ):
            counts[env["SANDPOD_SANDBOX_ID"]] = counts.get(env["SANDPOD_SANDBOX_ID"], 0) + 1
    assert counts == {s.id: 1 for s in [*created, more]}
    for s in [*created, more]:
        assert (await s.exec("true")).exit_code == 0
        await s.close()


def _execd_counts(prefix: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for proc in psutil.process_iter(["cmdline"]):
        env = _env(proc)
        if env.get("SANDPOD_PREFIX") == prefix and "sandpod_execd" in " ".join(
            proc.info["cmdline"] or []
        ):
            counts[env["SANDPOD_SANDBOX_ID"]] = counts.get(env["SANDPOD_SANDBOX_ID"], 0) + 1
    return counts


async def test_a_stalled_replica_never_duplicates_instances(
    lifecycles: Callable[[], Lifecycle],
) -> None:
    """A replica stopped (SIGSTOP: CPU starvation at its worst) past its leases while its
    sandboxes' execds die: the other replica takes them over and starts them again, the stalled
    one resumes believing it still holds them, and still every sandbox has exactly one execd --
    also after the stalled one is SIGKILLed."""
    first, second = lifecycles(), lifecycles()
    await _ready_api(first)
    await _ready_api(second)
    created = await asyncio.gather(
        *(AsyncSandbox.create(nats_url=first.url, prefix=first.prefix) for _ in range(8))
    )
    second.proc.send_signal(signal.SIGSTOP)
    try:
        for pid in first.execd_pids().values():  # every instance lost at once
            os.kill(pid, signal.SIGKILL)

        async def all_serve() -> bool:
            try:
                return all([(await s.exec("true", timeout=2)).exit_code == 0 for s in created])
            except SandpodError:
                return False

        # The first replica restarts its own at once, the stalled one's once their leases expire.
        await _until(all_serve, 90, "every sandbox to serve again while one replica stalls")
    finally:
        second.proc.send_signal(signal.SIGCONT)
    log = second.log.read_text
    seen = log().count("reconcile_start")
    await _until(lambda: log().count("reconcile_start") > seen + 20, 60, "the resumed replica")
    assert _execd_counts(first.prefix) == {s.id: 1 for s in created}
    second.proc.send_signal(signal.SIGKILL)
    second.proc.wait(10)
    assert await all_serve()
    assert _execd_counts(first.prefix) == {s.id: 1 for s in created}
    for s in created:
        await s.close()


async def test_local_runtime_jail_through_lifecycle(
    lifecycles: Callable[..., Lifecycle], tmp_path: Path
) -> None:
    """With SANDPOD_RUNTIME=local a Sandbox is a jail: own uid, hostname and pid namespace,
    Isolated=True, frozen by pause, and deletion leaves no jail directory or holder behind."""
    if os.geteuid() != 0:
        pytest.skip("the local runtime needs root (run the suite as root, as CI does)")
    lc = lifecycles(SANDPOD_RUNTIME="local")
    await _ready_api(lc)
    sbx = await AsyncSandbox.create(name="jailed", nats_url=lc.url, prefix=lc.prefix)
    async with sbx:
        r = await sbx.exec("/workspace", "id -u; hostname; ps -e --no-headers | wc -l; pwd")
        uid, host, nprocs, cwd = r.stdout.split()
        assert int(uid) >= 200_000 and host == "jailed" and int(nprocs) < 10
        assert cwd == "/workspace"
        info = await sbx.describe()
        isolated = info.condition("Isolated")
        assert isolated is not None and isolated["status"] == "True", isolated
        host_file = tmp_path / "host-secret"
        host_file.write_text("secret")
        r = await sbx.exec(f"cat {host_file}")  # the lifecycle state dir is masked
        assert r.exit_code != 0 and "secret" not in r.stdout
        assert (await sbx.pause()).phase == "Paused"
        assert (await sbx.resume()).phase == "Running"
        assert (await sbx.exec("echo back")).stdout == "back\n"
        other = await AsyncSandbox.create(name="second", nats_url=lc.url, prefix=lc.prefix)
        async with other:
            assert (await other.exec("hostname")).stdout == "second\n"
            execds = [
                p
                for p in psutil.process_iter(["cmdline"])
                if "sandpod_execd" in " ".join(p.info["cmdline"] or [])
                and _env(p).get("SANDPOD_PREFIX") == lc.prefix
            ]
            assert len(execds) == 1, "one node execd serves every local sandbox"
            await other.kill()
        await sbx.kill()
    await _until(lambda: not (tmp_path / "jails" / "jailed").exists(), 20, "the jail to go")


async def test_a_templates_disk_is_the_jails_quota(
    lifecycles: Callable[..., Lifecycle], tmp_path: Path
) -> None:
    """A template with ``resources.disk: 64Mi``: code in its sandbox that writes 100 MiB gets
    ENOSPC, ``df`` shows 64Mi, and the Isolated condition lists the disk quota as active."""
    if os.geteuid() != 0:
        pytest.skip("the local runtime needs root (run the suite as root, as CI does)")
    lc = lifecycles(SANDPOD_RUNTIME="local")
    await _ready_api(lc)
    admin = await AsyncSandbox.connect("default", nats_url=lc.url, prefix=lc.prefix)
    try:
        obj = {
            "kind": "SandboxTemplate",
            "metadata": {"name": "small-disk"},
            "spec": {"resources": {"disk": "64Mi"}},
        }
        await api_call(
            admin.bus, admin.subjects, "templates", "apply", ObjectRequest(object=obj), ObjectReply
        )
    finally:
        await admin.close()
    sbx = await AsyncSandbox.create("small-disk", nats_url=lc.url, prefix=lc.prefix)
    async with sbx:
        r = await sbx.exec(
            "/",
            "df -B1 --output=size /workspace | tail -1; "
            "dd if=/dev/zero of=/workspace/hog bs=1M count=100",
        )
        assert r.exit_code != 0 and "No space left on device" in r.stderr, r
        assert 56 << 20 <= int(r.stdout.split()[0]) <= 64 << 20, r.stdout
        isolated = (await sbx.describe()).condition("Isolated")
        assert isolated is not None and isolated["status"] == "True", isolated
        await sbx.kill()


async def test_a_long_command_or_quiet_stream_is_not_idleness(
    lifecycles: Callable[..., Lifecycle],
) -> None:
    """A command running longer than idleTimeoutSeconds (one-shot or a quiet stream) keeps the
    sandbox alive: a client waiting on it is active; idleness counts from when it ended."""
    lc = lifecycles()
    await _ready_api(lc)
    async with await AsyncSandbox.create(idle_timeout=2, nats_url=lc.url, prefix=lc.prefix) as sbx:
        r = await sbx.exec("sleep 4; echo done", timeout=30)
        assert r.stdout == "done\n"
        async with sbx.exec_stream("sleep 4; echo streamed") as st:
            out = b"".join([c.data async for c in st])
        assert out == b"streamed\n"
        assert (await sbx.describe()).phase == "Running"
        await _until(lambda: _gone(lc, sbx.id), 15, "idle expiry once nothing runs")


async def test_destroy_on_exit_needs_no_nats(tmp_path: Path) -> None:
    """With SANDPOD_DESTROY_ON_EXIT (what `sandpod up` sets), a lifecycle told to stop after
    nats-server died (Ctrl-C reaches both at once) still takes every jail down within the grace
    `sandpod up` gives it before SIGKILL: tearing a jail down asks nothing over NATS."""
    if os.geteuid() != 0:
        pytest.skip("the local runtime needs root (run the suite as root, as CI does)")
    nats = NatsServer(tmp_path / "nats")
    nats.start()
    lc = Lifecycle(
        nats,
        tmp_path,
        f"t{uuid.uuid4().hex[:8]}",
        "r0",
        SANDPOD_RUNTIME="local",
        SANDPOD_DESTROY_ON_EXIT="true",
    )
    try:
        await _ready_api(lc)
        sbx = await AsyncSandbox.create(name="leftover", nats_url=lc.url, prefix=lc.prefix)
        assert (await sbx.exec("true")).exit_code == 0
        await sbx.close()
        jail = json.loads((tmp_path / "jails" / "leftover" / "jail.json").read_text())
        holder = psutil.Process(jail["holder_pid"])
        nats.stop()
        lc.proc.send_signal(signal.SIGTERM)
        gone, _ = psutil.wait_procs([holder], timeout=PlatformConfig.grace)
        assert gone, f"the jail's holder outlived lifecycle's grace ({PlatformConfig.grace}s)"
    finally:
        lc.proc.kill()
        lc.proc.wait(10)
        nats.stop()
        for pid in lc.execd_pids().values():
            os.kill(pid, signal.SIGKILL)
        for jail_file in (tmp_path / "jails").glob("*/jail.json"):
            subprocess.run(
                [
                    sys.executable,
                    "-c",
                    DESTROY_JAIL,
                    str(tmp_path / "jails"),
                    jail_file.parent.name,
                    Installation.claim(lc.prefix, tmp_path, None).cgroup_parent,
                ],
                check=False,
                timeout=60,
            )
