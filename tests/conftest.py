"""Shared fixtures: a real nats-server per session, execd processes, and leak detection.

Tests isolate by unique sandbox ids. Every wait is on an event (a port accepting, a ping answering,
a process exiting) with a deadline, never a bare sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import pytest

from rootfs import prepare_for_session
from sandpod import AsyncSandbox, Sandbox
from sandpod.errors import SandpodError

if TYPE_CHECKING:
    from k8s.envtest import ControlPlane
    from operator_nats import OperatorNats

SCRIPTS = Path(sysconfig.get_path("scripts"))
# Tests that share something of the whole host run in one pytest-xdist worker (``make test``
# runs several): the real node's (one per worker that runs them), and every user of the
# rootless tests' one unprivileged user (their cleanup kills its processes). By path, in the
# scheduler: xdist's own ``xdist_group`` marks are lost on pytest >= 9.2 (its node ids are no
# longer rewritable), so ``--dist loadgroup`` groups by these prefixes here instead.
REAL_NODE_A = (
    "test_real_pods",
    "test_real_creds",
    "test_helm_real",
    "test_real_control",
    "test_real_gvisor",
)
XDIST_GROUPS = {
    # two real nodes at once, each serving half of tests/node (about 10 minutes each)
    **{f"tests/node/{f}.py::": "realnode-a" for f in REAL_NODE_A},
    "tests/node/": "realnode-b",
    # the one bench smoke run that starts a real node of its own: in a node group's series
    # (balancing the two: ~2 min), so no third real node starts beside the groups' two
    "tests/integration/test_bench_smoke.py::test_bench_smoke_run[creds_rotation.py]": (
        "realnode-a"
    ),
    "tests/integration/test_rootless.py::": "rootless",
    "tests/integration/test_rootless_image.py::": "rootless",
    "tests/integration/test_image_overlay.py::": "rootless",
    "tests/e2e/test_bus_attacks.py::": "rootless",
}


def xdist_group(nodeid: str) -> str:
    """The scope a test is scheduled in: its group, else itself (any worker, test by test)."""
    return next((g for p, g in XDIST_GROUPS.items() if nodeid.startswith(p)), nodeid)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Grouped tests first (stable otherwise): the scheduler hands out scopes in this order, and
    the real node's groups are the longest serial chains of the suite."""
    items.sort(key=lambda item: xdist_group(item.nodeid) == item.nodeid)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class PathGroups(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid)

    return PathGroups(config, log)


# Where the suite's time goes, summed over setup, call and teardown: per xdist group (a group
# runs on one worker, in series: the longest one is the suite's floor) and per file. Printed at
# the end of every run, so each CI log says what to rebalance or speed up.
_TIME_BY_GROUP: dict[str, float] = {}
_TIME_BY_FILE: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    _TIME_BY_FILE[path] = _TIME_BY_FILE.get(path, 0.0) + report.duration
    group = xdist_group(report.nodeid)
    if group != report.nodeid:
        _TIME_BY_GROUP[group] = _TIME_BY_GROUP.get(group, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: object) -> None:
    if not _TIME_BY_FILE or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    write = getattr(terminalreporter, "write_line", print)
    total = sum(_TIME_BY_FILE.values())
    write(f"test time: {total:.0f} s in all (summed over workers)")
    for group, seconds in sorted(_TIME_BY_GROUP.items(), key=lambda kv: -kv[1]):
        write(f"  group {group}: {seconds:.0f} s in series")
    for path, seconds in sorted(_TIME_BY_FILE.items(), key=lambda kv: -kv[1])[:20]:
        write(f"  {seconds:7.1f} s  {path}")


# Daemons a session fixture started lazily, inside some test's setup: not that test's leak.
SESSION_DAEMON_PIDS: set[int] = set()
NATS_BIN = SCRIPTS / "nats-server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` until true; fail the test with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


class NatsServer:
    """A real nats-server with JetStream on a free loopback port (``config``: a config file,
    e.g. operator mode; the address, port and JetStream flags still come from here)."""

    def __init__(self, store: Path, config: Path | None = None, host: str = "127.0.0.1") -> None:
        if not NATS_BIN.exists():
            pytest.fail(f"{NATS_BIN} missing: install dev deps with `make install`")
        self.host = host
        self.port = free_port()
        self.store = store
        self.config = config
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def start(self) -> None:
        if self.config is None:  # JetStream's default limit is 75% of the free disk: a worker's
            # streams (each lifecycle's events stream reserves 256 MiB) exhausted it on a full
            # disk and lifecycles exited at start ("insufficient storage resources available")
            self.config = self.store.parent / f"{self.store.name}-js.conf"
            self.config.write_text("jetstream { max_file_store: 1TB }\n")
        config = ["-c", str(self.config)]
        address = ["-a", self.host, "-p", str(self.port), "-js", "-sd", str(self.store)]
        self.proc = subprocess.Popen(
            [str(NATS_BIN), *config, *address],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(self._accepting, 10, f"nats-server on port {self.port}")

    def _accepting(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            pytest.fail(f"nats-server exited with {self.proc.returncode}")
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5) as s:
                return s.recv(4).startswith(b"INFO")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None


class Execd:
    """An execd process serving some sandbox ids, with a handle to kill or stop it."""

    def __init__(
        self,
        nats_url: str,
        state: Path,
        ids: list[str],
        env: dict[str, str],
        client_creds: str | None = None,
    ) -> None:
        """``client_creds``: the creds the readiness ping connects with (operator mode)."""
        self.ids = ids
        self.nats_url = nats_url
        self.client_creds = client_creds
        self.prefix = env.get("SANDPOD_PREFIX")
        self.log = state / f"execd-{ids[0]}-{uuid.uuid4().hex[:6]}.log"
        full_env = {
            **os.environ,
            "SANDPOD_NATS_URL": nats_url,
            "SANDPOD_SANDBOX_ID": ",".join(ids),
            "SANDPOD_STATE_DIR": str(state),
            **env,
        }
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sandpod_execd"], env=full_env, stdout=log, stderr=log
            )
        wait_until(self._answers, 20, f"execd for {ids} to answer ping")

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            pytest.fail(f"execd exited with {self.proc.returncode}:\n{self.log.read_text()}")

        # The sync SDK runs on its own loop thread, so this works from async tests too.
        try:
            with Sandbox.connect(
                self.ids[0],
                nats_url=self.nats_url,
                connect_timeout=1,
                nats_creds=self.client_creds,
                prefix=self.prefix,
            ) as sbx:
                sbx.ping(timeout=1)
        except SandpodError:
            return False
        return True

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
                pytest.fail("execd did not stop within 15s of SIGTERM")
        return self.proc.returncode


@pytest.fixture(scope="session")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sandpod-state")


@pytest.fixture(scope="session")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path_factory.mktemp("nats"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def operator_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorNats]:
    """A second nats-server, in operator mode (JWT auth), started on first use."""
    from operator_nats import OperatorNats

    server = OperatorNats(tmp_path_factory.mktemp("nats-operator"))
    server.server.start()
    assert server.server.proc is not None
    SESSION_DAEMON_PIDS.add(server.server.proc.pid)
    yield server
    server.server.stop()


@pytest.fixture(scope="session")
def shared_execd(nats: NatsServer, state_dir: Path) -> Iterator[Execd]:
    """One execd for most tests, serving ``default`` and ``shared``."""
    execd = Execd(nats.url, state_dir, ["default", "shared"], {"SANDPOD_EXECD_RESULT_TTL": "30"})
    yield execd
    execd.stop()


@pytest.fixture(scope="session")
def kube_apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A real etcd + kube-apiserver (tests/k8s/envtest.py) with schemas/crds/ applied.

    Started on first use only. Fails (never skips) when deploy/envtest/build.sh has not been run.
    """

    from k8s.envtest import ControlPlane, crd_manifests, missing_binaries
    from sandpod_kube import apply_crds

    if problem := missing_binaries():
        pytest.fail(problem)
    plane = ControlPlane(tmp_path_factory.mktemp("kube"), (free_port(), free_port(), free_port()))
    manifests = crd_manifests()
    try:
        plane.start()
        apply_crds(plane.settings, manifests)
    except Exception as exc:
        plane.stop()
        pytest.fail(f"the test control plane did not come up: {exc}")
    SESSION_DAEMON_PIDS.update(p.pid for p in plane.procs)
    yield plane
    plane.stop()


@pytest.fixture
def start_execd(nats: NatsServer, state_dir: Path) -> Iterator[Callable[..., Execd]]:
    """Factory for a private execd (for tests that kill or reconfigure it)."""
    started: list[Execd] = []

    def start(sandbox_id: str | None = None, **env: str) -> Execd:
        sid = sandbox_id or f"t-{uuid.uuid4().hex[:10]}"
        execd = Execd(nats.url, state_dir, [sid], env)
        started.append(execd)
        return execd

    yield start
    for execd in started:
        if execd.proc.poll() is None:
            execd.stop()


@pytest.fixture
async def sbx(nats: NatsServer, shared_execd: Execd) -> AsyncIterator[AsyncSandbox]:
    """An async SDK handle on the shared sandbox."""
    sandbox = await AsyncSandbox.connect("shared", nats_url=nats.url)
    yield sandbox
    await sandbox.close()


@pytest.fixture(autouse=True)
async def no_leaked_tasks() -> AsyncIterator[None]:
    """Fail a test that leaves asyncio tasks running (set up first, so checked last)."""
    before = asyncio.all_tasks()
    yield
    current = asyncio.current_task()
    pending = [t for t in asyncio.all_tasks() - before if t is not current and not t.done()]
    if pending:  # tasks being cancelled right now get one chance to finish
        await asyncio.wait(pending, timeout=2)
    leaked = [t for t in pending if not t.done()]
    for task in leaked:
        task.cancel()
    assert not leaked, f"test leaked asyncio tasks: {[t.get_coro() for t in leaked]}"


@pytest.fixture(scope="session", autouse=True)
def default_rootfs() -> Path | None:
    """The default sandbox root filesystem (see ``rootfs.py``), exported to every child as
    ``SANDPOD_DEFAULT_ROOTFS`` before any test starts a lifecycle; None: cannot be built here."""
    return prepare_for_session()


@pytest.fixture(scope="session", autouse=True)
def _session_daemons(nats: NatsServer, shared_execd: Execd, default_rootfs: Path | None) -> None:
    """Start the session daemons before any test, so the leak check never counts them."""


@pytest.fixture(autouse=True)
def no_leaked_processes(_session_daemons: None) -> Iterator[None]:
    """Fail a test that leaves child processes behind (its own, or commands run by execds)."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    after = [
        p
        for p in me.children(recursive=True)
        if p.pid not in before and p.pid not in SESSION_DAEMON_PIDS
    ]
    _, alive = psutil.wait_procs(after, timeout=10)
    alive = [p for p in alive if _really_alive(p)]
    leaked = [(p.pid, _cmdline(p)) for p in alive]  # before the kill: a zombie has none
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    assert not alive, f"test leaked processes: {leaked}"


# Every process this session starts inherits this marker (launchers pass the environment on,
# minus SANDPOD_*): an execd orphaned by a killed lifecycle is no child of ours any more, but
# it still carries the marker, so the guards below find it.
SESSION_MARKER = "PYTEST_SANDPOD_SESSION"
os.environ[SESSION_MARKER] = uuid.uuid4().hex


def session_execds() -> set[int]:
    """pids of execds started (directly or not) by this test session, zombies left out.

    Run twice for every test (the leak check): /proc read directly, the command line first
    and the rest only for execds -- through psutil, three reads of every process on the host
    cost ~4 ms per call with 76 processes and grow with the hundreds a loaded CI run has."""
    found = set()
    mark = f"{SESSION_MARKER}={os.environ[SESSION_MARKER]}".encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                if b"sandpod_execd" not in f.read():
                    continue
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                if mark not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
        except (OSError, IndexError):  # gone meanwhile, or not ours to read
            continue
        found.add(int(entry.name))
    return found


def _check_execds(before: set[int], where: str) -> None:
    """Fail (after killing them) if execds of this session outlive ``where``."""
    leaked = []
    for pid in session_execds() - before - SESSION_DAEMON_PIDS:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            proc.wait(timeout=10)  # a graceful stop may still be under way
            continue
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            leaked.append((pid, proc.environ().get("SANDPOD_SANDBOX_ID")))
            proc.kill()
    assert not leaked, f"{where} leaked execd processes (pid, sandbox): {leaked}"


@pytest.fixture(autouse=True)
def no_leaked_execds(_session_daemons: None) -> Iterator[None]:
    """Fail a test that leaves an execd running anywhere on the host (orphans included)."""
    before = session_execds()
    yield
    _check_execds(before, "test")


@pytest.fixture(scope="module", autouse=True)
def no_leaked_execds_per_module(_session_daemons: None) -> Iterator[None]:
    """The same after a module's own fixtures are torn down."""
    before = session_execds()
    yield
    _check_execds(before, "module")


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:  # gone meanwhile, or a zombie
        return ["?"]


def _really_alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:  # gone, or a zombie psutil refuses to describe
        return False


def marker() -> str:
    """A unique token to find a test's processes by command line."""
    return f"sandpod-test-{uuid.uuid4().hex[:12]}"


def pids_with(token: str) -> list[int]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if any(token in part for part in proc.info["cmdline"] or []):
                found.append(proc.pid)
    return found
