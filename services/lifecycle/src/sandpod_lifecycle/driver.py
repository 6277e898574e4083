"""What the reconciler needs from a runtime, and the execd launcher every local runtime shares.

A driver owns *instances*: whatever makes a sandbox real on this host (a jail and its execd, or
just an execd for the unisolated ``process`` runtime). The reconciler decides when; the driver
knows how. ``protections()`` names each protection and whether it is active, so the Sandbox's
``Isolated`` condition (and ``sandpod up``) can say what is degraded instead of hiding it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import json
import os
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

import structlog

from sandpod_contract.network import NetworkPolicy
from sandpod_contract.resources import ConditionReason, SandboxSpec, SandboxTemplateSpec
from sandpod_lifecycle.runtime.base import NetworkEnforcement, RuntimeFailure

__all__ = [
    "Driver",
    "ExecdLauncher",
    "Instance",
    "LauncherBusy",
    "NoNetworkEnforcement",
    "Owner",
    "RenewsCredentials",
    "ReportsLoss",
]

log = structlog.get_logger("sandpod.lifecycle.driver")


@dataclasses.dataclass(frozen=True, slots=True)
class Instance:
    sandbox_id: str
    running: bool
    paused: bool
    pid: int | None = None  # execd's pid
    detail: str = ""
    # A problem the runtime reports on a live instance; ``terminal``: the instance will not
    # serve again (e.g. its container was OOM-killed and is not restarted).
    reason: ConditionReason | None = None
    terminal: bool = False
    # This instance's own protections when they differ per instance (a template loosened its
    # seccomp filter); None: the driver's ``protections()`` hold for every instance.
    protections: Mapping[str, str] | None = None
    # Where the gateway reaches the instance's TCP ports (``status.endpoint["address"]``): an
    # IP literal (the Pod IP; the sandbox's own address; 127.0.0.1 for the process runtime,
    # whose commands listen on the host). None: not reachable (yet).
    address: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Owner:
    """The Sandbox object an instance belongs to (the Pod runtime attaches Pods to it)."""

    namespace: str
    uid: str
    # The Sandbox already ran an instance (phase Running/Paused): a missing one was lost, not
    # never made. Runtimes whose instances hold state that a new one would not have (the Pod's
    # emptyDirs) report that instead of quietly starting afresh.
    started: bool = False


class Driver(Protocol):
    name: str

    def protections(self) -> dict[str, str]:
        """protection -> "active" or why it is not."""

    async def ensure(
        self,
        sandbox_id: str,
        spec: SandboxSpec,
        template: SandboxTemplateSpec,
        owner: Owner | None = None,
    ) -> Instance:
        """Create the instance if missing (idempotent); return it."""

    async def inspect(self, sandbox_id: str) -> Instance | None:
        """The instance, or None if there is none."""

    async def pause(self, sandbox_id: str) -> ConditionReason | None:
        """Freeze the instance's processes. Returns how, when the runtime has a choice
        (a ``ConditionReason``: CgroupFrozen or SignalStopped), else None."""

    async def resume(self, sandbox_id: str) -> None: ...

    async def destroy(self, sandbox_id: str) -> None:
        """Remove the instance and every trace of it (idempotent)."""

    async def list(self) -> list[str]:
        """Ids of instances present on this host (for orphan cleanup after a crash)."""

    async def apply_network(self, sandbox_id: str, policy: NetworkPolicy) -> NetworkEnforcement:
        """Make the instance's egress follow ``policy`` (its effective one) now, without
        restarting anything; idempotent. A runtime that enforces nothing says so
        (:class:`NoNetworkEnforcement`). Raises RuntimeFailure (retried) when it could not."""


class NoNetworkEnforcement:
    """The default ``apply_network`` of a driver: egress is not enforced, and it says why."""

    name: str
    network_reason = "egress is not enforced: commands share the host's network"

    async def apply_network(self, sandbox_id: str, policy: NetworkPolicy) -> NetworkEnforcement:
        return NetworkEnforcement(False, f"{self.name} runtime: {self.network_reason}")


@runtime_checkable
class RenewsCredentials(Protocol):
    """A driver whose instances hold credentials that expire (the Pod runtime's NATS JWTs)."""

    async def renew_credentials(self, sandbox_id: str, spec: SandboxSpec, owner: Owner) -> None:
        """Renew the instance's credentials if due (cheap when not). Raises RuntimeFailure."""


@runtime_checkable
class ReportsLoss(Protocol):
    """A driver that notices by itself when an instance dies (the local runtime's holders)."""

    def on_lost(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(sandbox_id)`` (on the event loop) when an instance dies."""


class ExecdLauncher:
    """Starts and stops one execd process per sandbox; pid files make it survive our restarts.

    execd processes are not tied to the lifecycle process (no PDEATHSIG): a restarted lifecycle
    finds them through ``<state>/instances/<id>.json`` and adopts or destroys them. Each execd
    holds an ``flock`` on ``<state>/instances/<id>.lock`` for its whole life, so two launchers
    (replicas on one host, one of them dead or stalled mid-start) never run two for one id.

    ``nats_creds``: the lifecycle's own creds file, handed to its execds (a NATS in operator
    mode). These execds run on the host, outside the jails (which have no network and mask the
    state dir), so the sandboxes' code never sees it; per-sandbox creds are the Pod runtime's.
    """

    def __init__(
        self, state_dir: Path, nats_url: str, prefix: str, nats_creds: str | None = None
    ) -> None:
        self.dir = state_dir / "instances"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.state_dir = state_dir
        self.nats_url = nats_url
        self.prefix = prefix
        self.nats_creds = nats_creds

    def _record(self, sandbox_id: str) -> Path:
        return self.dir / f"{sandbox_id}.json"

    def pid(self, sandbox_id: str) -> int | None:
        """The live execd pid of ``sandbox_id`` (checked against /proc), else None."""
        try:
            data = json.loads(self._record(sandbox_id).read_text())
            pid = int(data["pid"])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError, KeyError):
            return None
        return pid if b"sandpod_execd" in cmdline and data.get("id") == sandbox_id else None

    def _lock_path(self, sandbox_id: str) -> Path:
        return self.dir / f"{sandbox_id}.lock"

    async def start(self, sandbox_id: str, env: Mapping[str, str]) -> int:
        """Start ``sandbox_id``'s execd, or adopt the one already running; return its pid.

        The execd holds an ``flock`` on ``<id>.lock`` for its whole life (it inherits the
        locked file from us). So whoever starts one first takes the lock: a replica that died
        or was stopped between spawning and recording never makes a second one appear, and the
        running one is found and adopted (by its record, else by who holds the lock).

        Raises:
            LauncherBusy: another launcher holds the lock and its execd is not up yet (retry).
        """
        fd = os.open(self._lock_path(sandbox_id), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return self._adopt(sandbox_id)
        try:
            return await self._spawn(sandbox_id, env, fd)
        finally:
            os.close(fd)  # the execd keeps the lock; if it never started, nobody holds it

    def _adopt(self, sandbox_id: str) -> int:
        pid = self.pid(sandbox_id) or _lock_holder(self._lock_path(sandbox_id))
        if pid is None:
            raise LauncherBusy(
                f"another launcher is starting the execd of {sandbox_id!r}", sandbox_id=sandbox_id
            )
        if self.pid(sandbox_id) != pid:  # its launcher died before recording it
            log.warning("execd_adopted_unrecorded", sandbox_id=sandbox_id, pid=pid)
            self._write_record(sandbox_id, pid)
        return pid

    def _write_record(self, sandbox_id: str, pid: int) -> None:
        tmp = self._record(sandbox_id).with_suffix(".tmp")
        tmp.write_text(json.dumps({"id": sandbox_id, "pid": pid}))
        tmp.replace(self._record(sandbox_id))

    async def _spawn(self, sandbox_id: str, env: Mapping[str, str], lock: int) -> int:
        log_path = self.state_dir / "logs" / f"execd-{sandbox_id}.log"
        log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.close(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
        log_path.chmod(0o600)  # logs may name paths and ids of other tenants: owner only
        full_env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("SANDPOD_")},
            "SANDPOD_NATS_URL": self.nats_url,
            "SANDPOD_PREFIX": self.prefix,
            "SANDPOD_SANDBOX_ID": sandbox_id,
            "SANDPOD_STATE_DIR": str(self.state_dir),
            "SANDPOD_EXECD_LOCK_FD": str(lock),
            **({"SANDPOD_NATS_CREDS": self.nats_creds} if self.nats_creds else {}),
            **env,
        }
        with log_path.open("ab") as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "sandpod_execd",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=full_env,
                start_new_session=True,  # outlives us; killed by stop()
                pass_fds=(lock,),  # the instance's lock, held as long as it lives
            )
        self._write_record(sandbox_id, proc.pid)
        return proc.pid

    async def stop(self, sandbox_id: str, grace: float = 5.0) -> None:
        pid = self.pid(sandbox_id)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            if not await _wait_gone(pid, grace):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                await _wait_gone(pid, 5.0)
        self._record(sandbox_id).unlink(missing_ok=True)

    def known(self) -> list[str]:
        return sorted(p.stem for p in self.dir.glob("*.json"))


class LauncherBusy(RuntimeFailure):
    """Another launcher is starting this sandbox's execd right now; try again shortly."""

    retryable = True


def _lock_holder(path: Path) -> int | None:
    """The pid of a live execd that has ``path`` open (the holder of its lock), if any."""
    target = os.stat(path)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if b"sandpod_execd" not in Path(entry.path, "cmdline").read_bytes():
                continue
            for fd in os.scandir(Path(entry.path, "fd")):
                st = os.stat(fd.path)
                if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
                    return int(entry.name)
        except OSError:
            continue
    return None


async def _wait_gone(pid: int, timeout: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        try:
            os.kill(pid, 0)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)  # noqa: ASYNC222 - WNOHANG never blocks
        except ProcessLookupError:
            return True
        await asyncio.sleep(0.02)
    return False
