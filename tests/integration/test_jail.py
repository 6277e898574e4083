"""The local runtime's jail, attacked rather than assumed: driver API and execd inside it.

Each test creates real jails (namespaces, overlayfs, cgroups) with the local runtime driver,
runs commands inside them (through execd's :class:`Jail`, directly or via a private execd started
with ``SANDPOD_EXECD_JAIL``), tries to break out or starve the host, and checks the kernel's view
from outside. A fixture destroys every jail of the test even when it fails and then checks that
the cgroup parent is empty. Needs root (the local runtime refuses to run without it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Literal

import psutil
import pytest

from conftest import Execd, NatsServer, marker, pids_with, wait_until
from sandpod import AsyncSandbox, Sandbox
from sandpod.errors import CommandNotFound, InvalidCwd, SpawnFailed
from sandpod_contract.messages.system import SandboxMetrics
from sandpod_execd.jail import Jail
from sandpod_execd.oneshot import Outcome, run_to_completion
from sandpod_execd.process import spawn
from sandpod_execd.registry import ExecRegistry
from sandpod_execd.sandbox import SandboxContext
from sandpod_lifecycle.runtime.base import (
    CreateFailed,
    InstanceExists,
    InstanceNotFound,
    InstanceSpec,
    InstanceStatus,
    Resources,
)
from sandpod_lifecycle.runtime.local import LocalRuntime, LocalRuntimeConfig

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the local runtime needs root: run the jail tests as root"
)

MiB = 1024 * 1024
FIND_TOKEN = 'printf %s "$T" > /tmp/pattern; grep -rlF -f /tmp/pattern'  # files containing $T
Make = Callable[..., Awaitable[InstanceStatus]]


def _config(state: Path, core: Literal["auto", "v1", "v2"] = "auto") -> LocalRuntimeConfig:
    return LocalRuntimeConfig(
        state_dir=state, cgroup_parent=f"sandpod-test-{uuid.uuid4().hex[:8]}", core=core
    )


@pytest.fixture
def state() -> Iterator[Path]:
    # Under /var/tmp, not /tmp: the host root is every jail's base and /var/tmp is part of it
    # (the jail's private /tmp hides the host's), so "the state dir is masked" is really tested.
    path = Path("/var/tmp") / f"sandpod-jail-test-{uuid.uuid4().hex[:8]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


@contextlib.asynccontextmanager
async def _runtime(config: LocalRuntimeConfig) -> AsyncIterator[LocalRuntime]:
    rt = LocalRuntime(config)
    caps = await rt.capabilities()
    if caps.problems:
        pytest.skip(f"this host cannot jail: {'; '.join(caps.problems)}")
    try:
        yield rt
    finally:
        for sid in await rt.list():
            await rt.destroy(sid)
        parents = {p.parent for p in _cgroup_dirs(rt, "x")}
        leftovers = [str(c) for p in parents if p.exists() for c in p.iterdir() if c.is_dir()]
        for p in parents:
            with contextlib.suppress(OSError):
                p.rmdir()
        assert not leftovers, f"cgroups left behind: {leftovers}"


@pytest.fixture
async def runtime(state: Path) -> AsyncIterator[LocalRuntime]:
    async with _runtime(_config(state)) as rt:
        yield rt


@pytest.fixture
def make(runtime: LocalRuntime) -> Make:
    async def make(**spec: object) -> InstanceStatus:
        sid = str(spec.pop("sandbox_id", f"j-{uuid.uuid4().hex[:10]}"))
        return await runtime.create(InstanceSpec(sandbox_id=sid, **spec))  # type: ignore[arg-type]

    return make


def _cgroup_dirs(rt: LocalRuntime, sandbox_id: str) -> list[Path]:
    assert rt._caps is not None
    plan = rt._cgroup_plan(rt._caps)
    return [Path(d) for d in plan.for_sandbox(sandbox_id).dirs]


async def run(
    status: InstanceStatus,
    command: str | list[str],
    *,
    cwd: str | None = None,
    timeout: float | None = 30.0,
    env: dict[str, str] | None = None,
) -> Outcome:
    """Run ``command`` inside the jail the way execd does (SandboxContext + spawn)."""
    assert status.jail_file is not None
    jail = Jail.load(status.jail_file, status.sandbox_id)
    try:
        ctx = SandboxContext(
            status.sandbox_id,
            Path("/unused"),
            "/bin/bash",
            {},
            ExecRegistry(10, stored_budget=MiB),
            jail=jail,
        )
        argv, shell = (tuple(command), None) if isinstance(command, list) else (None, command)
        proc = spawn(ctx.command(argv, shell, cwd, env, stdin=False))
        return await run_to_completion(
            proc, stdin=None, timeout=timeout, max_output=4 * MiB, pipe_grace=0.5
        )
    finally:
        jail.close()


async def ok(status: InstanceStatus, command: str | list[str], **kw: object) -> str:
    """stdout of a command that must succeed."""
    out = await run(status, command, **kw)  # type: ignore[arg-type]
    assert out.returncode == 0, (out.returncode, out.stderr.value().decode())
    return out.stdout.value().decode()


def oom_kills(status: InstanceStatus) -> int:
    """How many processes the kernel's OOM killer killed in the sandbox's memory cgroup."""
    for d in status.cgroups:
        for name in ("memory.oom_control", "memory.events"):  # v1, v2
            with contextlib.suppress(OSError):
                text = Path(d, name).read_text()
                return int(re.search(r"^oom_kill (\d+)", text, re.M).group(1))  # type: ignore[union-attr]
    raise AssertionError("no memory cgroup")


async def background(status: InstanceStatus, script: str) -> None:
    """Start ``script`` detached inside the jail (it outlives the command that started it)."""
    await ok(status, f"setsid sh -c '{script}' >/dev/null 2>&1 < /dev/null &")


async def wait_for(predicate: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its reaper is dead)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def mounts_mentioning(text: str) -> list[str]:
    """Lines of every process's mountinfo (every mount namespace) that mention ``text``."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                found += [
                    line
                    for line in Path(entry.path, "mountinfo").read_text().splitlines()
                    if text in line
                ]
    return found


# -- the driver ------------------------------------------------------------------------------


async def test_every_protection_is_active_on_this_host(runtime: LocalRuntime, make: Make) -> None:
    """This host allows full isolation, and a new sandbox reports every protection active."""
    caps = await runtime.capabilities()
    assert caps.usable and caps.freezer is not None
    st = await make()
    assert st.running and not st.paused and st.holder_pid
    assert st.degraded == {}, st.degraded
    expected = {
        "memory",
        "cpu",
        "pids",
        "freezer",
        "network",
        "rootfs",
        "pid_namespace",
        "mount_namespace",
        "no_new_privs",
        "unprivileged_user",
    }
    assert expected <= set(st.protections)
    assert await runtime.list() == [st.sandbox_id]


async def test_sandbox_sees_only_its_own_processes(make: Make) -> None:
    """/proc inside lists only the sandbox's own processes; host ones can't be seen or signalled."""
    st = await make()
    token = marker()
    hidden = [sys.executable, "-c", "import time; time.sleep(300)", token]
    host = subprocess.Popen(hidden)  # a host process to hide
    try:
        # The token reaches the probe through the environment: in argv grep would find itself.
        probe = f"{FIND_TOKEN} /proc/[0-9]*/cmdline; ls /proc | grep -c '^[0-9]'"
        lines = (await ok(st, probe, env={"T": token})).split()
        assert len(lines) == 1, f"host processes visible inside: {lines[:-1]}"
        assert int(lines[0]) <= 8  # holder, its sleep, this shell and its children
        out = await run(st, f"kill -0 {host.pid} || kill -0 {os.getpid()}")
        assert out.returncode != 0
        assert host.poll() is None and pids_with(token) == [host.pid]
        assert (await ok(st, "cat /proc/1/cmdline | tr '\\0' ' '")).startswith("sh -c")
    finally:
        host.kill()
        host.wait()


async def test_sandboxes_cannot_see_each_other(make: Make, state: Path) -> None:
    """Neither the files nor the processes of one sandbox are visible from another."""
    a, b = await make(), await make()
    token = marker()
    await ok(b, f"echo {token} > /workspace/secret; echo {token} > /tmp/secret")
    await background(b, f"sleep 300; : {token}")
    wait_until(lambda: len(pids_with(token)) == 1, 10, "b's process")  # it exists: can fail
    assert b.workspace is not None and (b.workspace / "secret").exists()
    probe = (
        f"{FIND_TOKEN} /proc/[0-9]*/cmdline /workspace /tmp --exclude pattern; "
        f"ls {b.workspace} {state / b.sandbox_id} /proc/{b.holder_pid}/root 2>&1"
    )
    out = await run(a, probe, env={"T": token})
    text = out.stdout.value().decode() + out.stderr.value().decode()
    assert token not in text
    assert text.count("No such file or directory") == 3, text


async def test_writes_land_in_the_upper_layer_never_in_the_base(make: Make) -> None:
    """Writing a world-writable base file changes the sandbox's copy only; the host's is intact."""
    st = await make()
    assert st.upper_dir is not None
    base_file = Path("/var/tmp") / f"sandpod-base-{uuid.uuid4().hex[:8]}"
    base_file.write_text("base\n")
    base_file.chmod(0o666)
    try:
        assert await ok(st, f"echo jail >> {base_file}; cat {base_file}") == "base\njail\n"
        await ok(st, "echo new > /var/tmp/sandpod-created-inside")
        assert base_file.read_text() == "base\n"
        assert not Path("/var/tmp/sandpod-created-inside").exists()
        upper = st.upper_dir / str(base_file).lstrip("/")
        assert upper.read_text() == "base\njail\n"
        assert (st.upper_dir / "var/tmp/sandpod-created-inside").read_text() == "new\n"
        denied = await run(st, "echo x >> /etc/passwd || exit 3; rm -f /usr/bin/env")
        assert denied.returncode == 3 and Path("/usr/bin/env").exists()
    finally:
        base_file.unlink()


async def test_host_paths_are_masked_and_no_host_mount_is_writable(make: Make, state: Path) -> None:
    """The state dir, /root and /home are empty inside; the only mounts are the jail's own."""
    st = await make()
    listing = (await ok(st, f"ls -A {state} /root /home")).split()
    assert sorted(listing) == sorted([f"{state}:", "/home:", "/root:"])
    mountinfo = await ok(st, "cat /proc/self/mountinfo")
    points = {line.split()[4]: line.split(" - ")[1].split()[0] for line in mountinfo.splitlines()}
    # /tmp is no mount: with a disk quota it is the writable layer's own (opaque) directory.
    expected = {
        "/": "overlay",
        "/proc": "proc",
        "/run": "tmpfs",
        "/dev": "tmpfs",
        "/dev/pts": "devpts",
        "/dev/shm": "tmpfs",
        "/workspace": "ext4",
        str(state): "tmpfs",
        "/root": "tmpfs",
        "/home": "tmpfs",
    }
    devices = {p: t for p, t in points.items() if p.startswith("/dev/") and t == "devtmpfs"}
    assert set(devices) == {
        f"/dev/{d}" for d in ("null", "zero", "full", "random", "urandom", "tty")
    }
    others = {p: t for p, t in points.items() if p not in devices}
    assert others.keys() == expected.keys()
    assert all(t == expected[p] for p, t in others.items() if p != "/workspace"), others


async def test_commands_run_unprivileged_and_setuid_cannot_elevate(make: Make) -> None:
    """Commands run as the sandbox's uid, no capabilities; setuid-root binaries stay powerless."""
    st = await make()
    status = await ok(st, "id -u; id -g; grep -E '^(NoNewPrivs|CapEff|CapPrm):' /proc/self/status")
    assert status.split()[:2] == [str(st.uid), str(st.gid)]
    assert "NoNewPrivs:\t1" in status and "CapEff:\t0000000000000000" in status
    suid = Path("/var/tmp") / f"sandpod-suid-id-{uuid.uuid4().hex[:8]}"
    shutil.copy("/usr/bin/id", suid)
    suid.chmod(0o4755)  # setuid root, in the base
    try:
        assert (await ok(st, f"{suid} -u")).strip() == str(st.uid)
    finally:
        suid.unlink()


async def test_memory_hog_is_killed_alone(make: Make) -> None:
    """Exceeding the memory limit kills the hog only: its sandbox and the others keep running."""
    a = await make(resources=Resources(memory_bytes=64 * MiB))
    b = await make()
    await background(a, "sleep 300")
    hog = await run(a, ["python3", "-c", "x = b'a' * (256 << 20); print('survived')"])
    assert hog.returncode == -9 and b"survived" not in hog.stdout.value()
    assert oom_kills(a) >= 1 and oom_kills(b) == 0
    assert await ok(a, "echo alive; pgrep -c sleep") == "alive\n2\n"  # holder's + ours
    assert await ok(b, "echo alive") == "alive\n"


async def test_fork_bomb_is_stopped_by_the_pids_limit(make: Make) -> None:
    """A fork bomb hits pids.max, is killed whole on timeout, and the sandbox works afterwards."""
    a = await make(resources=Resources(pids=48))
    b = await make()
    pids_dir = next(Path(d) for d in a.cgroups if "/pids/" in d)
    bomb = await run(a, "bomb() { bomb | bomb & }; bomb; sleep 300", timeout=3)
    assert bomb.timed_out
    assert int((pids_dir / "pids.current").read_text()) <= 48
    assert int((pids_dir / "pids.events").read_text().split()[1]) > 0  # forks were refused
    wait_until(lambda: int((pids_dir / "pids.current").read_text()) <= 3, 10, "the bomb to die")
    assert await ok(a, "echo alive") == "alive\n"
    assert await ok(b, "echo alive") == "alive\n"


async def test_cpu_quota_caps_a_busy_loop(make: Make) -> None:
    """With 200 millicores a spinning process gets about a fifth of one CPU, not all of it."""
    st = await make(resources=Resources(cpu_millicores=200))
    spin = (
        "import time\n"
        "wall, cpu = time.monotonic(), time.process_time()\n"
        "while time.monotonic() - wall < 1.5: pass\n"
        "print((time.process_time() - cpu) / (time.monotonic() - wall))\n"
    )
    share = float(await ok(st, ["python3", "-c", spin]))
    assert share < 0.35, f"the loop got {share:.2f} of a CPU"


async def test_there_is_no_network_but_loopback(make: Make, nats: NatsServer) -> None:
    """Only lo exists: host loopback services and the outside are unreachable; lo inside works."""
    st = await make()
    ifaces = await ok(st, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
    assert ifaces.split() == ["lo"]
    probe = (
        "import socket\n"
        "for addr in (('127.0.0.1', PORT), ('1.1.1.1', 53)):\n"
        "    try:\n"
        "        socket.create_connection(addr, timeout=2); print('connected', addr)\n"
        "    except OSError as e:\n"
        "        print(type(e).__name__)\n"
        "srv = socket.create_server(('127.0.0.1', 0)); port = srv.getsockname()[1]\n"
        "socket.create_connection(('127.0.0.1', port)).sendall(b'hi')\n"
        "print(srv.accept()[0].recv(2).decode())\n"
    ).replace("PORT", str(nats.port))
    out = await ok(st, ["python3", "-c", probe])
    assert out.split() == ["ConnectionRefusedError", "OSError", "hi"], out


@pytest.mark.parametrize("core", ["v1", "v2"])
async def test_pause_freezes_processes_and_resume_continues_them(
    state: Path, core: Literal["v1", "v2"]
) -> None:
    """Pause stops a busy counter dead (v1 freezer / v2 cgroup.freeze); resume lets it go on."""
    async with _runtime(_config(state, core)) as rt:
        caps = await rt.capabilities()
        if core == "v2" and caps.cgroup_v2 is None:
            pytest.skip("no cgroup v2 hierarchy on this host")
        st = await rt.create(InstanceSpec(sandbox_id=f"p-{uuid.uuid4().hex[:8]}"))
        assert st.workspace is not None
        counter = st.workspace / "counter"
        await background(
            st,
            "i=0; while :; do i=$((i+1)); echo $i > /workspace/c; "
            "mv /workspace/c /workspace/counter; done",
        )

        def value() -> int:
            with contextlib.suppress(OSError, ValueError):
                return int(counter.read_text())
            return -1

        wait_until(lambda: value() > 10, 10, "the counter to run")
        paused = await rt.pause(st.sandbox_id)
        assert paused.paused and paused.running
        frozen_at = value()
        deadline = time.monotonic() + 0.5  # an observation window, not a synchronisation
        while time.monotonic() < deadline:
            assert value() == frozen_at, "a paused process advanced"
            await asyncio.sleep(0.05)
        resumed = await rt.resume(st.sandbox_id)
        assert not resumed.paused
        wait_until(lambda: value() > frozen_at + 10, 10, "the counter to continue")


async def test_destroy_removes_every_trace(runtime: LocalRuntime, make: Make, state: Path) -> None:
    """After destroy: no process, mount, cgroup or directory of the sandbox is left anywhere."""
    st = await make()
    token = marker()
    await background(st, f"sleep 300; : {token}")
    await ok(st, "echo data > /workspace/f; echo data > /var/tmp/f")
    wait_until(lambda: len(pids_with(token)) == 1, 10, "the daemon")
    cgroups = [Path(d) for d in st.cgroups]
    pids = set()
    for d in cgroups:
        for procs in d.rglob("cgroup.procs"):
            pids |= {int(p) for p in procs.read_text().split()}
    assert st.holder_pid in pids and len(pids) >= 4  # unshare, holder, its sleep, the daemon
    assert mounts_mentioning(str(state / st.sandbox_id))  # the overlay exists somewhere
    await runtime.destroy(st.sandbox_id)
    assert [pid for pid in pids if running(pid)] == []
    assert not pids_with(token)
    assert [d for d in cgroups if d.exists()] == []
    assert not (state / st.sandbox_id).exists()
    assert mounts_mentioning(str(state / st.sandbox_id)) == []
    assert await runtime.list() == []
    assert not (await runtime.inspect(st.sandbox_id)).exists
    await runtime.destroy(st.sandbox_id)  # idempotent


async def test_destroying_a_paused_sandbox_leaves_nothing(
    runtime: LocalRuntime, make: Make
) -> None:
    """Frozen processes die too: destroy thaws what it killed and removes everything."""
    st = await make()
    await background(st, "sleep 300")
    assert (await runtime.pause(st.sandbox_id)).paused
    pids = {
        int(p)
        for d in st.cgroups
        for f in Path(d).rglob("cgroup.procs")
        for p in f.read_text().split()
    }
    assert len(pids) >= 4, pids  # unshare, holder, its sleep, ours
    await runtime.destroy(st.sandbox_id)
    alive = {p: psutil.Process(p).cmdline() for p in pids if running(p)}
    assert alive == {}, alive
    assert [d for d in st.cgroups if Path(d).exists()] == []


async def test_failed_create_leaves_nothing(runtime: LocalRuntime, tmp_path: Path) -> None:
    """A base without the tools the holder needs fails create with its reason and no traces."""
    empty = tmp_path / "empty-rootfs"
    empty.mkdir()
    sid = f"f-{uuid.uuid4().hex[:8]}"
    with pytest.raises(CreateFailed, match="no sh command"):
        await runtime.create(InstanceSpec(sandbox_id=sid, rootfs=empty))
    assert await runtime.list() == []
    assert [d for d in _cgroup_dirs(runtime, sid) if d.exists()] == []


def _minimal_rootfs(root: Path, marker_text: str) -> None:
    """A rootfs with just dash, sleep, umount, cat, ls and their libraries, from the host."""
    for program in ("/bin/sh", "/bin/sleep", "/bin/umount", "/bin/cat", "/bin/ls"):
        real = Path(program).resolve()
        libs = re.findall(
            r"(/\S+\.so[.\d]*)", subprocess.check_output(["ldd", str(real)], text=True)
        )
        for f in (str(real), *libs):
            dest = root / f.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest)
        (root / "bin").mkdir(exist_ok=True)
        if not (root / "bin" / Path(program).name).exists():
            (root / "bin" / Path(program).name).symlink_to(real)
    (root / "marker").write_text(marker_text)
    (root / "marker").chmod(0o666)  # writable by the sandbox user: the write must still not land


async def test_a_configured_rootfs_is_the_whole_world(make: Make, tmp_path: Path) -> None:
    """With a rootfs directory as base, the sandbox sees that tree and nothing of the host's."""
    rootfs = tmp_path / "rootfs"
    token = marker()
    _minimal_rootfs(rootfs, token)
    st = await make(rootfs=rootfs)
    assert (await ok(st, ["/bin/cat", "/marker"], env={"PATH": "/bin"})) == token
    out = await run(st, ["/bin/ls", "/usr/bin/python3", "/etc/passwd"], env={"PATH": "/bin"})
    assert out.returncode != 0 and out.stdout.value() == b""
    await ok(st, ["/bin/sh", "-c", "echo hi > /marker"], env={"PATH": "/bin"})
    assert await ok(st, ["/bin/cat", "/marker"], env={"PATH": "/bin"}) == "hi\n"
    assert (rootfs / "marker").read_text() == token  # the base is read-only through the overlay


async def test_a_restarted_driver_finds_and_destroys_orphans(state: Path) -> None:
    """A jail whose driver died is listed and fully destroyed by the next driver."""
    config = _config(state)
    sid = f"o-{uuid.uuid4().hex[:8]}"
    crash = (
        "import asyncio, os, pathlib\n"
        "from sandpod_lifecycle.runtime.local import LocalRuntime, LocalRuntimeConfig\n"
        "from sandpod_lifecycle.runtime.base import InstanceSpec\n"
        f"rt = LocalRuntime(LocalRuntimeConfig(state_dir=pathlib.Path({str(state)!r}), "
        f"cgroup_parent={config.cgroup_parent!r}))\n"
        f"asyncio.run(rt.create(InstanceSpec(sandbox_id={sid!r})))\n"
        "os._exit(0)  # crash: no destroy\n"
    )
    subprocess.run([sys.executable, "-c", crash], check=True, timeout=60)
    async with _runtime(config) as rt:
        assert await rt.list() == [sid]
        found = await rt.inspect(sid)
        assert found.running and found.holder_pid is not None
        assert await ok(found, "echo still here") == "still here\n"
        await rt.destroy(sid)
        assert await rt.list() == []
        assert not running(found.holder_pid)


async def test_invalid_specs_and_unknown_ids_are_refused(runtime: LocalRuntime, make: Make) -> None:
    """Bad ids, limits and uids are rejected; a second create and pausing a stranger fail typed."""
    for bad in ({"sandbox_id": "Bad_Id"}, {"sandbox_id": "x", "uid": 0}):
        with pytest.raises(ValueError, match=r"sandbox id|uid"):
            InstanceSpec(**bad)
    for limits in ({"memory_bytes": -1}, {"pids": 0}, {"cpu_millicores": 1}):
        with pytest.raises(ValueError, match="at least"):
            Resources(**limits)
    st = await make()
    with pytest.raises(InstanceExists):
        await runtime.create(InstanceSpec(sandbox_id=st.sandbox_id))
    with pytest.raises(InstanceNotFound):
        await runtime.pause("no-such-sandbox")


async def test_each_sandbox_gets_its_own_uid(make: Make) -> None:
    """Two sandboxes run as two different unprivileged uids, each owning its workspace."""
    a, b = await make(), await make()
    assert a.uid != b.uid and a.uid and b.uid and min(a.uid, b.uid) >= 200_000
    for st in (a, b):
        assert st.workspace is not None and st.workspace.stat().st_uid == st.uid
        assert (
            await ok(st, "touch /workspace/mine && stat -c %u /workspace/mine")
        ) == f"{st.uid}\n"


# -- execd inside the jail ---------------------------------------------------------------------


@pytest.fixture
async def jailed(
    make: Make, start_execd: Callable[..., Execd], nats: NatsServer
) -> AsyncIterator[tuple[InstanceStatus, AsyncSandbox]]:
    st = await make(env={"TEMPLATE_VAR": "from-template"})
    start_execd(st.sandbox_id, SANDPOD_EXECD_JAIL=str(st.jail_file))
    sbx = await AsyncSandbox.connect(st.sandbox_id, nats_url=nats.url)
    try:
        yield st, sbx
    finally:
        await sbx.close()


async def test_execd_runs_every_command_inside_the_jail(
    jailed: tuple[InstanceStatus, AsyncSandbox], nats: NatsServer
) -> None:
    """Through NATS, commands run jailed: own uid, hostname, /workspace, env; errors stay typed."""
    st, sbx = jailed
    r = await sbx.exec(
        "id -u; hostname; pwd; echo $HOME $TEMPLATE_VAR; ls /proc | grep -c '^[0-9]'"
    )
    lines = r.stdout.split()
    assert lines[:5] == [str(st.uid), st.sandbox_id, "/workspace", "/workspace", "from-template"]
    assert int(lines[5]) <= 8
    await sbx.exec("mkdir -p sub && echo hi > sub/f", check=True)
    assert st.workspace is not None and (st.workspace / "sub/f").read_text() == "hi\n"
    assert (await sbx.exec("sub", "pwd; cat f")).stdout == "/workspace/sub\nhi\n"
    assert (await sbx.exec("/tmp", ["pwd"])).stdout == "/tmp\n"
    with pytest.raises(CommandNotFound):
        await sbx.exec(["no-such-program-anywhere"])
    with pytest.raises(InvalidCwd):
        await sbx.exec("/no/such/dir", "true")
    assert (await sbx.exec("exit 7")).exit_code == 7
    with Sandbox.connect(st.sandbox_id, nats_url=nats.url) as sync_sbx:
        assert sync_sbx.exec(["hostname"]).stdout == f"{st.sandbox_id}\n"
    info = await sbx.runtime_info()
    assert (info.runtime, info.isolation) == ("local", "jail")


async def test_request_env_never_reaches_the_root_launcher(
    jailed: tuple[InstanceStatus, AsyncSandbox],
) -> None:
    """LD_* from a request affect only the command, never the root steps that enter the jail;
    values never appear on a command line; odd names are refused, not dropped."""
    st, sbx = jailed
    r = await sbx.exec(["true"], env={"LD_DEBUG": "files", "LD_PRELOAD": "/workspace/no.so"})
    assert set(re.findall(r"needed by (\S+)", r.stderr)) == {"true"}  # the command, only it
    token = marker()
    tricky = f"$(touch /workspace/pwned) `id` \"'\n{token}"
    r = await sbx.exec(["sh", "-c", 'printf %s "$V"'], env={"V": tricky}, check=True)
    assert r.stdout == tricky
    assert st.jail_file is not None and st.workspace is not None
    assert not (st.workspace / "pwned").exists()
    jail = Jail.load(st.jail_file, st.sandbox_id)
    try:
        cmd = jail.command(("true",), "/workspace", {"SECRET": token}, stdin=False)
        assert token not in " ".join(cmd.argv) and token in " ".join(cmd.env.values())
    finally:
        jail.close()
    with pytest.raises(SpawnFailed, match="letters, digits"):
        await sbx.exec(["true"], env={"a-b": "1"})


async def test_execd_timeout_kills_strays_that_left_the_tree(
    jailed: tuple[InstanceStatus, AsyncSandbox],
) -> None:
    """A daemon started by a timed-out command dies with it, though it was re-parented inside."""
    _, sbx = jailed
    token = marker()
    # The subshell exits at once: the daemon is re-parented to the holder, out of our tree.
    r = await sbx.exec(
        f"(setsid sh -c 'sleep 300; : {token}' >/dev/null 2>&1 &); sleep 300", timeout=1
    )
    assert r.timed_out
    wait_until(lambda: not pids_with(token), 10, "the stray to die")


async def test_paused_jail_holds_execs_until_resumed(
    runtime: LocalRuntime, jailed: tuple[InstanceStatus, AsyncSandbox]
) -> None:
    """An exec sent while the sandbox is paused starts frozen and completes after resume."""
    st, sbx = jailed
    await runtime.pause(st.sandbox_id)
    pending = asyncio.ensure_future(sbx.exec("echo thawed", timeout=30))
    try:
        done, _ = await asyncio.wait({pending}, timeout=0.5)  # observation window
        assert not done, "a command ran in a paused sandbox"
    finally:
        await runtime.resume(st.sandbox_id)
    assert (await pending).stdout == "thawed\n"


async def test_terminals_run_inside_the_jail_too(
    jailed: tuple[InstanceStatus, AsyncSandbox],
) -> None:
    """A PTY opened in a jailed sandbox runs jailed: its uid, hostname and pid namespace."""
    st, sbx = jailed
    # $$ is the shell's pid as its own pid namespace numbers it: small only inside the jail's
    term = await sbx.pty.open(["sh", "-c", "id -u; hostname; echo $$"])
    async with term:
        status = await term.wait()
        out = (await term.read(cursor=0, wait=0)).data.decode()
    uid, host, pid = out.split()
    assert (int(uid), host) == (st.uid, st.sandbox_id), out
    assert int(pid) < 100, out
    assert status is not None


async def test_git_works_inside_the_jail(
    jailed: tuple[InstanceStatus, AsyncSandbox],
) -> None:
    """git in a jailed sandbox sees jail paths: init, commit, clone a local repo, status."""
    st, sbx = jailed
    setup = (
        "git init -q -b main src && cd src && echo a > f && git add f && "
        "git -c user.name=t -c user.email=t@e commit -qm one"
    )
    assert (await sbx.exec(setup)).exit_code == 0
    head = await sbx.git.clone("/workspace/src", "/workspace/copy")
    assert head.path == "/workspace/copy" and head.branch == "main"
    assert st.workspace is not None and (st.workspace / "copy" / "f").read_text() == "a\n"
    await sbx.exec("echo b >> copy/f", check=True)
    status = await sbx.git.status("/workspace/copy")
    assert [e.path for e in status.entries] == ["f"]


HOLD_64_MIB = (
    "import time; block = b'x' * (64 << 20); sum(range(2_000_000)); print('ready', flush=True); "
    "time.sleep(300)"
)


async def _metrics_while_holding_64_mib(sbx: AsyncSandbox) -> SandboxMetrics:
    """sys.metrics taken while a command of the sandbox holds 64 MiB (it is ended afterwards)."""
    async with sbx.exec_stream(["python3", "-c", HOLD_64_MIB]) as stream:
        chunk = await stream.__anext__()
        assert chunk.data == b"ready\n"
        during = await sbx.metrics()
        await stream.cancel()
        await stream.wait()
    return during


@pytest.mark.parametrize("core", ["v1", "v2"])
async def test_metrics_of_a_jail_come_from_its_cgroups(
    state: Path, core: Literal["v1", "v2"], start_execd: Callable[..., Execd], nats: NatsServer
) -> None:
    """sys.metrics of a jail reads its cgroups (tracked on v1 or v2): a process holding 64 MiB
    counts, and memory_total is the sandbox's memory limit, not the host's."""
    async with _runtime(_config(state, core)) as rt:
        if core == "v2" and (await rt.capabilities()).cgroup_v2 is None:
            pytest.skip("no cgroup v2 hierarchy on this host")
        spec = InstanceSpec(
            sandbox_id=f"m-{uuid.uuid4().hex[:8]}", resources=Resources(memory_bytes=384 * MiB)
        )
        st = await rt.create(spec)
        execd = start_execd(st.sandbox_id, SANDPOD_EXECD_JAIL=str(st.jail_file))
        try:
            async with await AsyncSandbox.connect(st.sandbox_id, nats_url=nats.url) as sbx:
                idle = await sbx.metrics()
                m = await _metrics_while_holding_64_mib(sbx)
        finally:
            execd.stop()  # before the jail goes
    assert idle.source == "cgroup" and idle.processes == 0, idle  # the holder is not counted
    assert m.source == "cgroup" and m.processes >= 1 and m.execs == 1, m
    assert m.memory_rss >= 64 * MiB and m.cpu_seconds > 0, m
    assert m.memory_total == 384 * MiB, m
    assert m.memory_available <= (384 - 64) * MiB, m


async def test_metrics_of_a_jail_without_cgroups_find_its_processes(
    make: Make, start_execd: Callable[..., Execd], nats: NatsServer, state: Path
) -> None:
    """A jail whose file names no cgroups (rootless, nothing delegated) is measured from /proc by
    the environment its commands really carry (SANDPOD_WORKSPACE=/workspace)."""
    st = await make()
    assert st.jail_file is not None
    data = json.loads(st.jail_file.read_text())
    data["cgroups"] = {"core": None, "core_version": 0, "limits": {}}
    bare = state / f"{st.sandbox_id}-no-cgroups.json"
    bare.write_text(json.dumps(data))
    start_execd(st.sandbox_id, SANDPOD_EXECD_JAIL=str(bare))
    async with await AsyncSandbox.connect(st.sandbox_id, nats_url=nats.url) as sbx:
        m = await _metrics_while_holding_64_mib(sbx)
    assert m.source == "procfs" and m.processes >= 1, m
    assert m.memory_rss >= 64 * MiB, m


async def test_concurrent_commands_never_lose_their_cgroup_to_each_others_sweep(
    make: Make,
) -> None:
    """Twenty commands started at once all run: one command's sweep of empty command cgroups
    never removes the fresh one another command is about to join (it did: "join cgroup ...:
    No such file or directory", exit 125)."""
    st = await make()
    outs = await asyncio.gather(*(run(st, f"echo {i}") for i in range(20)))
    assert [(o.returncode, o.stdout.value()) for o in outs] == [
        (0, f"{i}\n".encode()) for i in range(20)
    ], [o.stderr.value() for o in outs]
