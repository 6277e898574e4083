"""``sys`` family: ping, info, metrics and activity (all probes: none counts as activity);
configure (a claim's env) and freeze/thaw/freezer (pause for runtimes that cannot freeze from
outside: :mod:`sandpod_execd.freezer`)."""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import time

from sandpod_contract.catalogue import DATA_PLANE, PROTOCOL_VERSION
from sandpod_contract.errors import BadRequest, SandboxError
from sandpod_contract.messages.common import Empty
from sandpod_contract.messages.system import (
    Activity,
    Configure,
    Configured,
    Freeze,
    FreezeState,
    Info,
    Pong,
    SandboxMetrics,
    SnapshotTake,
    SnapshotTaken,
)
from sandpod_execd import __version__, cgstats, sysmetrics
from sandpod_execd.handlers import Deps, Route
from sandpod_execd.sandbox import WORKSPACE_ALIAS, SandboxContext
from sandpod_execd.snaptar import write_rootfs_changes, write_snapshot

__all__ = ["SystemHandlers"]

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RUNTIME = "process"
ISOLATION = "none"  # commands run on the host as execd's user
JAIL_RUNTIME = "local"
MAX_FREEZE_TIMEOUT = 60.0
JAIL_ISOLATION = "jail"  # namespaces, overlay root, cgroups, own uid (see the Sandbox's Isolated)


class SystemHandlers:
    def __init__(self, deps: Deps) -> None:
        self._settings = deps.settings
        self._max_payload = deps.max_payload
        self._started = time.time()
        self._families = tuple(sorted({op.family for op in DATA_PLANE}))

    def routes(self) -> dict[tuple[str, str], Route]:
        return {
            ("sys", "ping"): Route(self.ping, inline=True, quiet=True, activity=False),
            ("sys", "info"): Route(self.info, activity=False),
            ("sys", "metrics"): Route(self.metrics, quiet=True, activity=False),
            ("sys", "activity"): Route(self.activity, inline=True, quiet=True, activity=False),
            ("sys", "configure"): Route(self.configure, inline=True),
            # freeze is no activity (a paused sandbox is not idle-checked); thaw is: the idle
            # clock restarts at resume, so a long pause cannot expire it the moment it resumes.
            ("sys", "freeze"): Route(self.freeze, activity=False),
            ("sys", "thaw"): Route(self.thaw),
            ("sys", "freezer"): Route(self.freezer, inline=True, quiet=True, activity=False),
            # the lifecycle's snapshot (Kubernetes mode): no activity, a probe of the sandbox
            ("sys", "snapshot"): Route(self.snapshot, activity=False),
        }

    async def freeze(self, sbx: SandboxContext, req: Freeze) -> FreezeState:
        if not 0 < req.timeout <= MAX_FREEZE_TIMEOUT:
            raise BadRequest(f"timeout must be in (0, {MAX_FREEZE_TIMEOUT:g}] seconds")
        return await sbx.freezer.freeze(req.timeout)

    async def snapshot(self, sbx: SandboxContext, req: SnapshotTake) -> SnapshotTaken:
        """``req.path`` (``/workspace`` or below) as a tar file, written while the commands are
        frozen (see :mod:`sandpod_execd.snaptar`)."""
        if not 0 < req.timeout <= MAX_FREEZE_TIMEOUT:
            raise BadRequest(f"timeout must be in (0, {MAX_FREEZE_TIMEOUT:g}] seconds")
        inside = req.path == WORKSPACE_ALIAS or req.path.startswith(WORKSPACE_ALIAS + "/")
        rel = req.path.removeprefix(WORKSPACE_ALIAS)
        if sbx.jail is not None or not inside or ".." in rel.split("/"):
            raise BadRequest("sys.snapshot takes /workspace or a directory below it (Pods only)")
        state_dir, rootfs = self._settings.state_dir, self._settings.rootfs
        was_frozen = sbx.freezer.frozen
        state = await sbx.freezer.freeze(req.timeout)
        root_file, root_entries = None, 0
        try:
            file, entries = await write_snapshot(sbx.workspace / rel.strip("/"), state_dir)
            if req.rootfs and rootfs is not None:  # the same frozen moment as the workspace's
                try:
                    root_file, root_entries = await write_rootfs_changes(
                        rootfs, self._started, state_dir, (sbx.workspace, state_dir)
                    )
                except SandboxError:
                    file.unlink(missing_ok=True)
                    raise
        finally:
            if not was_frozen:
                await sbx.freezer.thaw()
        return SnapshotTaken(
            sandbox_id=sbx.sandbox_id,
            file=str(file),
            size=file.stat().st_size,
            entries=entries,
            mechanism=state.mechanism,
            rootfs_file=str(root_file or ""),
            rootfs_size=root_file.stat().st_size if root_file else 0,
            rootfs_entries=root_entries,
        )

    async def thaw(self, sbx: SandboxContext, _: Empty) -> FreezeState:
        return await sbx.freezer.thaw()

    async def freezer(self, sbx: SandboxContext, _: Empty) -> FreezeState:
        return sbx.freezer.state()

    async def close(self) -> None:
        """Nothing held."""

    async def configure(self, sbx: SandboxContext, req: Configure) -> Configured:
        bad = sorted(k for k in req.env if not ENV_NAME.fullmatch(k))
        if bad:
            raise BadRequest(f"environment variable names must be letters, digits and _: {bad[:5]}")
        sbx.configure(req.env, req.generation)
        return Configured(
            sandbox_id=sbx.sandbox_id,
            generation=sbx.config_generation,
            env_keys=tuple(sorted(req.env)) if sbx.config_generation == req.generation else (),
        )

    async def ping(self, sbx: SandboxContext, _: Empty) -> Pong:
        return Pong(sandbox_id=sbx.sandbox_id, time=time.time())

    async def info(self, sbx: SandboxContext, _: Empty) -> Info:
        s = self._settings
        return Info(
            sandbox_id=sbx.sandbox_id,
            execd_version=__version__,
            protocol_version=PROTOCOL_VERSION,
            runtime=JAIL_RUNTIME if sbx.jail else RUNTIME,
            isolation=JAIL_ISOLATION if sbx.jail else ISOLATION,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            started_at=self._started,
            workspace=WORKSPACE_ALIAS,  # as the sandbox's clients see it, never the host path
            max_request_bytes=s.max_request_bytes,
            max_payload=self._max_payload,
            default_window=s.default_window,
            max_window=s.max_window,
            default_max_output=s.default_max_output,
            families=self._families,
            max_output_limit=s.max_output_limit,
            rootfs=str(s.rootfs or ""),
        )

    async def metrics(self, sbx: SandboxContext, _: Empty) -> SandboxMetrics:
        jail = sbx.jail
        usage = await _usage(sbx)
        roots = [str(sbx.workspace)]
        if jail is not None and jail.upper is not None:
            roots.append(str(jail.upper))  # what the sandbox wrote outside /workspace
        disk = await sysmetrics.disk_usage(*roots)
        free, total = sysmetrics.filesystem(str(sbx.workspace))
        mem_total, mem_available = sysmetrics.host_memory()
        if usage.memory_limit is not None and usage.memory_limit < mem_total:
            mem_total = usage.memory_limit  # the sandbox's own ceiling is what it can use
            mem_available = min(mem_available, max(usage.memory_limit - usage.memory, 0))
        load1, load5, load15 = os.getloadavg()
        return SandboxMetrics(
            sandbox_id=sbx.sandbox_id,
            time=time.time(),
            source=usage.source,
            cpu_seconds=usage.cpu_seconds,
            cpu_count=os.cpu_count() or 1,
            load1=load1,
            load5=load5,
            load15=load15,
            memory_rss=usage.memory,
            memory_total=mem_total,
            memory_available=mem_available,
            disk_used=disk.used,
            disk_entries=disk.entries,
            disk_complete=disk.complete,
            disk_free=free,
            disk_total=total,
            processes=usage.processes,
            execs=sbx.registry.active,
        )

    async def activity(self, sbx: SandboxContext, _: Empty) -> Activity:
        now = time.time()
        if sbx.busy:  # a command a client waits for is running: that is activity, right now
            sbx.touch()
        return Activity(
            sandbox_id=sbx.sandbox_id,
            last_activity=sbx.last_activity,
            idle=max(now - sbx.last_activity, 0.0),
            time=now,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class _Usage:
    source: str
    processes: int
    cpu_seconds: float
    memory: int
    memory_limit: int | None


async def _usage(sbx: SandboxContext) -> _Usage:
    """A jail with cgroups is measured by them (nothing escapes a cgroup); otherwise the
    processes carrying the sandbox's id and workspace as its commands do (``/workspace`` in a
    jail) are summed from ``/proc``."""
    jail = sbx.jail
    if jail is not None and jail.cgroups is not None:
        cg = cgstats.read_usage(jail.cgroups, jail.holder)
        return _Usage("cgroup", cg.processes, cg.cpu_seconds, cg.memory, cg.memory_limit)
    procs = await sysmetrics.sandbox_processes(sbx.sandbox_id, sbx.env_workspace)
    return _Usage("procfs", procs.processes, procs.cpu_seconds, procs.rss, None)
