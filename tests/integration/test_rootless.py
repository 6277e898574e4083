"""Rootless jails: the lifecycle service and its execd run as an unprivileged user, and the local
runtime builds each sandbox in a user namespace. Attacked rather than assumed, like the root
jail in test_jail.py.

The suite runs as root only to prepare: it creates the unprivileged user (tests/rootless.py),
a state directory that user owns and, for the delegated-cgroup tests, cgroups chowned to it (what
an administrator does to delegate them). Everything under test then runs as that user: it has no
capability on the host, so whatever the sandbox reaches, an unprivileged user's sandbox reaches.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sysconfig
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import psutil
import pytest

from conftest import NatsServer, free_port
from rootless import as_user, ensure_user
from sandpod import AsyncSandbox
from sandpod.control import api_call
from sandpod.errors import SandpodError
from sandpod_contract.messages.sandboxes import ObjectReply, ObjectRequest
from sandpod_lifecycle.runtime.installation import Installation
from sandpod_lifecycle.runtime.local import LocalRuntime, LocalRuntimeConfig
from svcprocs import ServiceProc

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="preparing the unprivileged test user and its cgroups needs root: run the suite as root",
)

CONTROLLERS = ("freezer", "memory", "pids", "cpu")
V1 = Path("/sys/fs/cgroup")


class Rootless:
    """A lifecycle service (local runtime) running as the unprivileged test user."""

    def __init__(
        self, nats: NatsServer, state: Path, uid: int, gid: int, /, prefix: str, **extra: str
    ) -> None:
        self.nats, self.state, self.uid, self.prefix = nats, state, uid, prefix
        self.cgroup_parent = Installation.claim(prefix, state, None).cgroup_parent
        self.spare = Path("/run") / f"sandpod-expose-{self.prefix}"
        wrap = as_user(uid, gid, self.spare)
        self.proc = ServiceProc(
            "sandpod_lifecycle",
            nats,
            state,
            self.prefix,
            "rootless",
            wrap=wrap,
            SANDPOD_RUNTIME="local",
            SANDPOD_RESYNC="0.5",
            HOME=str(state),
            **extra,
        )

    async def sandbox(self, name: str, template: str | None = None) -> AsyncSandbox:
        return await AsyncSandbox.create(
            name=name, template=template, nats_url=self.nats.url, prefix=self.prefix, wait=60
        )

    async def template(self, name: str, resources: dict[str, object]) -> None:
        await self.apply_template(name, {"resources": resources})

    async def apply_template(self, name: str, spec: dict[str, object]) -> None:
        obj = {"kind": "SandboxTemplate", "metadata": {"name": name}, "spec": spec}
        sbx = await AsyncSandbox.connect("x", nats_url=self.nats.url, prefix=self.prefix)
        async with sbx:
            await api_call(
                sbx.bus, sbx.subjects, "templates", "apply", ObjectRequest(object=obj), ObjectReply
            )

    async def answering(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                await AsyncSandbox.list(nats_url=self.nats.url, prefix=self.prefix)
                return
            except SandpodError:
                if self.proc.proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the rootless lifecycle did not come up:\n{self.proc.tail()}")
                await asyncio.sleep(0.1)

    def user_processes(self) -> list[psutil.Process]:
        """Every process of the test user (the service, its execd, the sandboxes)."""
        return [p for p in psutil.process_iter(["uids"]) if p.info["uids"].real == self.uid]

    async def close(self) -> None:
        self.proc.stop()
        # Whatever the service left (it was stopped, not asked to destroy): root cleans up.
        jails = self.state / "jails"
        runtime = LocalRuntime(
            LocalRuntimeConfig(state_dir=jails, cgroup_parent=self.cgroup_parent)
        )
        for sid in await runtime.list():
            await runtime.destroy(sid)
        for p in self.user_processes():
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGKILL)
        psutil.wait_procs(self.user_processes(), 10)
        with contextlib.suppress(OSError):
            self.spare.rmdir()


@pytest.fixture(scope="module")
def user() -> tuple[int, int]:
    return ensure_user()


@pytest.fixture
def state(user: tuple[int, int]) -> Iterator[Path]:
    # Not under pytest's tmp_path: its parents are root's (mode 0700), closed to the user.
    path = Path("/var/tmp") / f"sandpod-rootless-{uuid.uuid4().hex[:8]}"
    path.mkdir(mode=0o700)
    os.chown(path, *user)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@contextlib.asynccontextmanager
async def rootless_lifecycle(
    nats: NatsServer, state: Path, user: tuple[int, int], delegate: bool = False, **extra: str
) -> AsyncIterator[Rootless]:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    delegated: list[Path] = []
    for controller in CONTROLLERS if delegate else ():
        # What an administrator does to delegate (the name is the installation's own).
        d = V1 / controller / Installation.claim(prefix, state, None).cgroup_parent
        d.mkdir()
        delegated.append(d)
        for path in (d, *d.iterdir()):
            os.chown(path, *user)
    rl = Rootless(nats, state, *user, prefix=prefix, **extra)
    try:
        await rl.answering()
        yield rl
    finally:
        await rl.close()
        for d in delegated:
            for sub in sorted(d.glob("**/"), key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    sub.rmdir()


@pytest.fixture
async def rootless(nats: NatsServer, state: Path, user: tuple[int, int]) -> AsyncIterator[Rootless]:
    async with rootless_lifecycle(nats, state, user) as rl:
        yield rl


def _isolated(info: object) -> dict[str, str]:
    cond = info.condition("Isolated")  # type: ignore[attr-defined]
    assert cond is not None
    return dict(cond)


async def test_a_rootless_sandbox_is_a_jail_in_a_user_namespace(rootless: Rootless) -> None:
    """Everything runs as the unprivileged user; inside, the sandbox has its own uid (mapped to
    that user), hostname and pid namespace, no capabilities, and its conditions say which
    protections a rootless host lacks."""
    sbx = await rootless.sandbox("rl-one")
    async with sbx:
        r = await sbx.exec(
            "/workspace",
            "id -u; hostname; ps -e --no-headers | wc -l; "
            "cat /proc/self/uid_map; grep CapEff /proc/self/status",
        )
        assert r.exit_code == 0, r.stderr
        uid, host, nprocs, inside, outside, count, _, caps = r.stdout.split()
        assert int(uid) >= 200_000 and host == "rl-one" and int(nprocs) < 10
        assert (inside, outside, count) == (uid, str(rootless.uid), "1")  # mapped to the user
        assert int(caps, 16) == 0
        assert all(p.info["uids"].effective == rootless.uid for p in rootless.user_processes())
        assert rootless.proc.proc.pid in {p.pid for p in psutil.Process().children(True)}
        isolated = _isolated(await sbx.info())
        assert isolated["status"] == "False" and isolated["reason"] == "Degraded"
        for protection in ("memory", "pids", "freezer", "disk_quota", "egress"):
            assert f"{protection}: unavailable: rootless" in isolated["message"]
        await sbx.kill()


async def test_a_rootless_sandbox_cannot_touch_the_host(
    rootless: Rootless, nats: NatsServer
) -> None:
    """The default base is the root, as one overlay (it has no mounts below it: never the
    per-directory fallback), readable by the unprivileged user; writes to it land in the
    sandbox's upper layer; the state dir, /home and /root are masked and stay masked (a nested
    user namespace cannot unmount them); no network but loopback, so NATS on the host's
    loopback is unreachable."""
    secret = rootless.state / "secret"
    secret.write_text("host secret")
    os.chown(secret, rootless.uid, -1)  # the user's own file: only the mask hides it
    base = Path(os.environ["SANDPOD_DEFAULT_ROOTFS"])
    probe = Path("/var/tmp") / f"sandpod-probe-{uuid.uuid4().hex[:8]}"  # the base's, mode 1777
    sbx = await rootless.sandbox("rl-host")
    async with sbx:
        r = await sbx.exec(f"echo layered > {probe} && cat {probe} /etc/os-release")
        assert r.stdout == "layered\n" + (base / "etc/os-release").read_text(), r.stderr
        assert not probe.exists() and not (base / probe.relative_to("/")).exists()
        jail = json.loads((rootless.state / "jails" / "rl-host" / "jail.json").read_text())
        mounts = Path(f"/proc/{jail['holder_pid']}/mountinfo").read_text().splitlines()
        root = [m for m in mounts if m.split()[4] == "/"]
        assert len(root) == 1 and f"lowerdir={base}," in root[0], root
        uppers = list((rootless.state / "jails" / "rl-host" / "upper").glob(f"**/{probe.name}"))
        assert len(uppers) == 1 and uppers[0].read_text() == "layered\n"
        r = await sbx.exec(f"cat {secret}; ls -A /home /root | grep -v :")
        assert "host secret" not in r.stdout and r.stdout.strip() == ""
        r = await sbx.exec(f"unshare -Urm sh -c 'umount /home || umount -l /home; cat {secret}'")
        assert "host secret" not in r.stdout
        r = await sbx.exec("tail -n +3 /proc/net/dev | cut -d: -f1")  # the interfaces
        assert r.stdout.split() == ["lo"]
        port = int(nats.url.rsplit(":", 1)[1])
        r = await sbx.exec(["bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected"])
        assert "connected" not in r.stdout and r.exit_code != 0
        await sbx.kill()


async def test_rootless_sandboxes_cannot_see_each_other(rootless: Rootless) -> None:
    """Two sandboxes of one user share its host uid, yet neither sees the other's processes
    or files."""
    token = uuid.uuid4().hex
    a, b = await rootless.sandbox("rl-a"), await rootless.sandbox("rl-b")
    async with a, b:
        await a.exec(f"echo {token} > /workspace/mine; echo {token} > /tmp/mine")
        proc = await a.proc.start(f"sleep 300; : {token}")
        pattern = f"[{token[0]}]{token[1:]}"  # matches the token, not this command line
        search = f"grep -rls {pattern} /workspace /tmp /var/tmp /run | head -3"
        r = await b.exec(f"ps -eo args | grep -c {pattern}; {search}")
        assert r.stdout.split() == ["0"], r.stdout
        r = await a.exec(f"ps -eo args | grep -c {pattern}; grep -rls {pattern} /workspace /tmp")
        assert r.stdout.split() == ["1", "/workspace/mine", "/tmp/mine"], r.stdout  # can fail
        await proc.kill()
        await a.kill()
        await b.kill()


async def test_files_sessions_and_ports_work_rootless(rootless: Rootless) -> None:
    """execd's file API, sessions and wait_for_port work when execd itself is unprivileged:
    files it writes belong to the sandbox's uid inside; a port probe reaches the sandbox's
    loopback through a user namespace."""
    sbx = await rootless.sandbox("rl-files")
    async with sbx:
        await sbx.fs.write("/workspace/dir/data.bin", bytes(range(256)) * 64)
        assert await sbx.fs.read("/workspace/dir/data.bin") == bytes(range(256)) * 64
        r = await sbx.exec("stat -c %u /workspace/dir/data.bin; id -u")
        owner, uid = r.stdout.split()
        assert owner == uid
        session = await sbx.sessions.create()
        await session.run("cd /workspace/dir && export SEEN=yes")
        ran = await session.run("pwd; echo $SEEN")
        assert ran.stdout == "/workspace/dir\nyes\n"
        server = await sbx.proc.start(
            "/workspace/dir", "python3 -m http.server 8765 --bind 127.0.0.1"
        )
        await server.wait_for_port(8765, kind="http", timeout=30)
        r = await sbx.exec(
            'python3 -c "import urllib.request as u; '
            "print(len(u.urlopen('http://127.0.0.1:8765/data.bin').read()))\""
        )
        assert r.stdout.strip() == str(256 * 64)
        await server.kill()
        await sbx.kill()


async def test_pause_without_a_delegated_freezer_is_refused_with_the_reason(
    rootless: Rootless,
) -> None:
    """Rootless with no delegated cgroup, pausing cannot freeze anything: the sandbox keeps
    running and its conditions say why instead of claiming it is paused."""
    sbx = await rootless.sandbox("rl-pause")
    async with sbx:
        # A refused pause never becomes Paused: the call returns after its wait with the phase
        # it has (30 s by default, 10 s short of the request's own timeout on a loaded host).
        await sbx.pause(wait=2)
        deadline = time.monotonic() + 20
        while True:
            info = await sbx.info()
            text = " ".join(str(c.get("message", "")) for c in info.conditions)
            if "freezer" in text:
                break
            assert time.monotonic() < deadline, info.conditions
            await asyncio.sleep(0.1)
        assert info.phase != "Paused"
        assert (await sbx.exec("echo still running")).stdout == "still running\n"
        await sbx.kill()


async def test_destroying_rootless_sandboxes_leaves_nothing(rootless: Rootless) -> None:
    """kill removes the jail's directory and every process of it (no cgroup tracks them: the
    pid namespace's init is killed), leaving only the service and its execd."""
    sbx = await rootless.sandbox("rl-gone")
    async with sbx:
        await sbx.proc.start("sleep 600 & sleep 600; wait")
        await sbx.exec("setsid sleep 700 &")
        await sbx.kill()
    assert not (rootless.state / "jails" / "rl-gone").exists()
    left = {p.pid: " ".join(p.cmdline()) for p in rootless.user_processes()}
    services = [c for c in left.values() if "sandpod_lifecycle" in c or "sandpod_execd" in c]
    assert len(services) == len(left) == 2, left


async def test_delegated_cgroups_limit_and_freeze_rootless_sandboxes(
    nats: NatsServer, state: Path, user: tuple[int, int]
) -> None:
    """With cgroups delegated to the user, a rootless sandbox is limited and pausable like a
    root one: a fork bomb stops at the pids limit, a memory hog is killed alone, pause freezes
    a running counter and resume continues it."""
    missing = [c for c in CONTROLLERS if not (V1 / c / "cgroup.procs").exists()]
    if missing:
        pytest.skip(
            f"this test delegates cgroup v1 hierarchies and this host lacks {missing}; on a "
            "cgroup v2 host run the services in a delegated subtree (systemd Delegate=yes)"
        )
    async with rootless_lifecycle(nats, state, user, delegate=True) as rl:
        await rl.template("small", {"memory": "64Mi", "pids": 64})
        sbx = await rl.sandbox("rl-limits", template="small")
        async with sbx:
            isolated = _isolated(await sbx.info())
            for protection in ("memory", "pids", "freezer"):
                assert f"{protection}: unavailable" not in isolated["message"], isolated
            pids = V1 / "pids" / rl.cgroup_parent / "rl-limits"
            r = await sbx.exec("bomb() { bomb | bomb & }; bomb; sleep 300", timeout=3)
            assert r.timed_out
            assert int((pids / "pids.current").read_text()) <= 64
            assert int((pids / "pids.events").read_text().split()[1]) > 0  # forks were refused
            await _until(lambda: int((pids / "pids.current").read_text()) <= 3, "the bomb to die")
            r = await sbx.exec("python3 -c 'b = bytearray(512 << 20); print(len(b))'")
            assert r.exit_code != 0 and r.stdout == ""
            assert (await sbx.exec("echo alive")).stdout == "alive\n"
            counter = await sbx.proc.start(
                "i=0; while :; do i=$((i+1)); echo $i > /workspace/c; mv /workspace/c /workspace/n;"
                " done"
            )
            n = rl.state / "jails" / "rl-limits" / "workspace" / "n"

            def value() -> int:
                with contextlib.suppress(OSError, ValueError):
                    return int(n.read_text())
                return -1

            await _until(lambda: value() > 10, "the counter to run")
            await sbx.pause()
            await _until_phase(sbx, "Paused")
            frozen_at = value()
            deadline = time.monotonic() + 0.5  # an observation window, not a synchronisation
            while time.monotonic() < deadline:
                assert value() == frozen_at, "a paused process advanced"
                await asyncio.sleep(0.05)
            await sbx.resume()
            await _until(lambda: value() > frozen_at + 10, "the counter to continue")
            await counter.kill()
            await sbx.kill()


async def _until(ok: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 20
    while not ok():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def _until_phase(sbx: AsyncSandbox, phase: str) -> None:
    deadline = time.monotonic() + 20
    while (info := await sbx.info()).phase != phase:
        assert time.monotonic() < deadline, (info.phase, info.conditions)
        await asyncio.sleep(0.05)


def test_sandpod_up_as_an_unprivileged_user_runs_rootless_jails(
    state: Path, user: tuple[int, int]
) -> None:
    """`sandpod up` by a user without privileges picks the local runtime, says it is rootless
    and which protections are degraded, serves exec from a jail, and stops cleanly."""
    sandpod = str(Path(sysconfig.get_path("scripts")) / "sandpod")
    port, http_port = free_port(), free_port()
    spare = Path("/run") / f"sandpod-expose-{uuid.uuid4().hex[:8]}"
    wrap = as_user(*user, spare)
    up = subprocess.Popen(
        [
            *wrap,
            sandpod,
            "up",
            "--state-dir",
            str(state / "up"),
            "--port",
            str(port),
            "--gateway-port",
            str(http_port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "HOME": str(state)},
    )
    try:
        assert up.stdout is not None
        lines: list[str] = []
        while not lines or "Ctrl-C stops everything" not in lines[-1]:
            line = up.stdout.readline()
            assert line, f"`sandpod up` exited early:\n{''.join(lines)}"
            lines.append(line)
        banner = "".join(lines)
        assert "rootless" in banner and "isolation  DEGRADED" in banner, banner
        assert "pids: unavailable: rootless" in banner, banner
        run = subprocess.run(
            [sandpod, "exec", "default", "--", "sh", "-c", "id -u; cat /proc/self/uid_map"],
            # Its NATS refuses anonymous clients: the credential is in its state dir.
            env={
                **os.environ,
                "SANDPOD_NATS_URL": f"nats://127.0.0.1:{port}",
                "SANDPOD_STATE_DIR": str(state / "up"),
            },
            capture_output=True,
            text=True,
            timeout=30,
        )
        inside, _, outside, _ = run.stdout.split()
        assert int(inside) >= 200_000 and outside == str(user[0]), run
        up.send_signal(signal.SIGTERM)
        assert up.wait(30) == 0
        left = [p for p in psutil.process_iter(["uids"]) if p.info["uids"].real == user[0]]
        _, alive = psutil.wait_procs(left, timeout=15)
        assert not alive, f"left behind: {alive}"
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        with contextlib.suppress(OSError):
            spare.rmdir()
