"""The ``local`` runtime driver: each sandbox a namespace jail on this machine.

An instance is a holder process (see ``holder.py``) in its own mount, pid, ipc, uts, net and
cgroup namespaces, with a copy-on-write root, in cgroups that limit memory, cpu and pids and can
freeze it (see ``cgroups.py``). Its traces on the host, all removed by ``destroy``:

    <state_dir>/<id>/jail.json   what execd needs to run commands inside (SANDPOD_EXECD_JAIL)
    <state_dir>/<id>/upper/      the writable layer (the unit of snapshots)
    <state_dir>/<id>/work/       overlayfs scratch
    <state_dir>/<id>/root/       the overlay's mount point (mounted only inside the holder)
    <state_dir>/<id>/workspace/  mounted at /workspace, owned by the sandbox's uid (restored
                                 from a snapshot: the upper layer over its workspace layers)
    <state_dir>/<id>/wswork/     overlayfs scratch of a restored workspace
    <state_dir>/<id>/lowers/<n>/ a restored snapshot's layers, id-mapped (``idmap.py``): mounted
                                 only while the holder starts, which keeps its own copy
    <state_dir>/<id>/disk.img    with a disk quota (see ``diskquota.py``): the sandbox's own
    <state_dir>/<id>/disk/       filesystem, mounted here; upper/, work/ and workspace/ are
                                 then in disk/ (and /tmp is upper/tmp)
    <state_dir>/.disk/           one mkfs'd template image per disk size
    <state_dir>/.volumes/        SandboxVolumes (``volumes.py``): never removed by ``destroy``
    <cgroup hierarchy>/<parent>/<id>/   one per hierarchy used

The jail file (:class:`sandpod_service.jailfile.JailFile`, the one format execd reads too) is
written before anything else exists (a reservation of the uid, then ``phase: creating``) and
rewritten once the holder is ready, so a driver restarted after a crash finds, lists and
destroys whatever is left. Operations on one id are serialised; different ids run in parallel.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import os
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, MutableSequence, Sequence
from pathlib import Path
from typing import Literal, TypeVar

import structlog

from sandpod_contract.network import NetworkPolicy
from sandpod_contract.subjects import SANDBOX_ID_RE
from sandpod_lifecycle.network.egress import Egress
from sandpod_lifecycle.network.trust import SandboxTrust, write_trust
from sandpod_lifecycle.runtime import diskquota, hostcaps, jaildirs, jailtrust, seccomp, snapmounts
from sandpod_lifecycle.runtime.base import (
    ACTIVE,
    CreateFailed,
    DestroyFailed,
    HostCapabilities,
    InstanceExists,
    InstanceNotFound,
    InstanceSpec,
    InstanceStatus,
    NetworkNotSupported,
    RuntimeTimeout,
    RuntimeUnavailable,
)
from sandpod_lifecycle.runtime.cgroups import UNDELEGATED, CgroupPlan, SandboxCgroups
from sandpod_lifecycle.runtime.diskquota import DiskOptions
from sandpod_lifecycle.runtime.holder import HolderLayout, launch, oom_protection, wait_exit
from sandpod_lifecycle.runtime.uids import busy_uids, next_uid
from sandpod_lifecycle.runtime.volumes import LocalVolumes
from sandpod_service.jailfile import JailDisk, JailFile, JailReservation, JailWorkspace
from sandpod_service.procs import cgroup_join_file

__all__ = ["JAIL_FILE", "LocalRuntime", "LocalRuntimeConfig"]

log = structlog.get_logger("sandpod.lifecycle.local")
T = TypeVar("T")

JAIL_FILE = "jail.json"
WORKSPACE = "/workspace"
NAMESPACE_PROTECTIONS = (
    "mount_namespace",
    "pid_namespace",
    "ipc_namespace",
    "uts_namespace",
    "cgroup_namespace",
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LocalRuntimeConfig:
    """Settings of the local driver.

    Attributes:
        state_dir: per-sandbox directories go in ``<state_dir>/<id>`` (a directory without a
            jail file is never treated as ours, but keep it dedicated to the driver); always
            masked inside every sandbox (with ``mask_paths``: an empty read-only tmpfs over each).
        cgroup_parent: the cgroup under each hierarchy's root holding one cgroup per sandbox.
        core: which hierarchy freezes and tracks: ``auto`` (v1 freezer if mounted, else v2).
        uid_base, uid_count: each sandbox gets a uid (= gid) of its own from this range unless
            its spec names one, round-robin (see ``uids.py``); the service passes its
            installation's range (``installation.py``), so two installations never share one.
        default_disk_bytes: the disk quota of a sandbox whose resources name none.
        disk: how sandbox filesystems are provisioned (thin or preallocated, host reserve).
    """

    state_dir: Path
    cgroup_parent: str = "sandpod"
    core: Literal["auto", "v1", "v2"] = "auto"
    uid_base: int = 200_000
    uid_count: int = 100_000
    mask_paths: tuple[Path, ...] = (Path("/root"), Path("/home"))
    create_timeout: float = 15.0
    destroy_timeout: float = 15.0
    pause_timeout: float = 10.0
    default_disk_bytes: int = 10 * 1024**3
    disk: DiskOptions = dataclasses.field(default_factory=DiskOptions)


class LocalRuntime:
    """The local namespace-jail driver (implements ``RuntimeDriver``)."""

    def __init__(
        self,
        config: LocalRuntimeConfig,
        caps: HostCapabilities | None = None,
        egress: Egress | None = None,
    ) -> None:
        self.config = config
        self.egress = egress  # None: sandboxes keep loopback only (rootless, or egress off)
        # What a sandbox with header injections must trust and carry (the node's egress proxy;
        # None: no proxy runs here, so no injection is served)
        self.trust: Callable[[NetworkPolicy], SandboxTrust] | None = None
        self._caps = caps
        self._plan: CgroupPlan | None = None
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}  # id -> (lock, users)
        self._launchers: dict[str, subprocess.Popen[bytes]] = {}  # ours to reap
        self._disk_quota: str | None = None  # diskquota.probe(), once
        self.volumes = LocalVolumes(config.state_dir, config.disk)  # SandboxVolumes' storage

    # -- RuntimeDriver -------------------------------------------------------------------------

    async def capabilities(self) -> HostCapabilities:
        if self._caps is None:
            self._caps = await asyncio.to_thread(hostcaps.detect)
        return self._caps

    async def create(self, spec: InstanceSpec) -> InstanceStatus:
        caps = await self.capabilities()
        if caps.problems:
            raise RuntimeUnavailable("; ".join(caps.problems), problems=list(caps.problems))
        plan = self._cgroup_plan(caps)
        sid = spec.sandbox_id
        base = spec.rootfs or (spec.layers[0] if spec.layers else Path("/"))
        for layer in (base, *spec.layers):
            if not layer.is_dir():
                raise CreateFailed(f"rootfs {layer} is not a directory", rootfs=str(layer))
        async with self._lock(sid):
            if self._dir(sid).exists() or sid in plan.sandbox_ids():
                raise InstanceExists(f"sandbox {sid!r} already has an instance", sandbox_id=sid)
            # from here on every trace is ours to remove; in a thread: it reads every jail
            # record and every process's uids, which would stall the loop (other creates)
            uid, gid = await asyncio.to_thread(self._allocate, spec)
            try:
                await self._volumes(spec, uid, gid, chown=caps.root)
                await self._create(spec, base, plan, caps, uid=uid, gid=gid)
            except BaseException as exc:
                with contextlib.suppress(Exception):
                    await self._teardown(sid)
                if isinstance(exc, OSError | RuntimeError | ValueError):
                    raise CreateFailed(f"cannot create sandbox {sid!r}: {exc}") from exc
                raise
        log.info("jail_created", sandbox_id=sid)
        return await self.inspect(sid)

    async def inspect(self, sandbox_id: str) -> InstanceStatus:
        data = jaildirs.read_jail(self._dir(sandbox_id) / JAIL_FILE)
        if not isinstance(data, JailFile):  # none, or a crash right after allocation
            caps = await self.capabilities()
            cgroups = not caps.problems and sandbox_id in self._cgroup_plan(caps).sandbox_ids()
            if data is None and not cgroups:
                return InstanceStatus(sandbox_id=sandbox_id, exists=False)
            return InstanceStatus(sandbox_id=sandbox_id, exists=True, detail="orphaned traces")
        cg = SandboxCgroups.from_jail(data.cgroups)
        holder = data.holder_pid
        running = holder is not None and jaildirs.start_time(holder) == data.holder_start
        lost = not running and data.phase != "creating"
        detail = "" if running else "holder exited" if lost else "being created"
        return InstanceStatus(
            sandbox_id=sandbox_id,
            exists=True,
            running=running,
            paused=running and cg.freeze_requested(),
            holder_pid=holder if running else None,
            uid=data.uid,
            gid=data.gid,
            jail_file=self._dir(sandbox_id) / JAIL_FILE,
            workspace=data.workspace.outside,
            upper_dir=data.upper,
            cgroups=tuple(cg.dirs),
            protections=dict(data.protections),
            notes=data.notes,
            detail=detail,
            lost=lost,
            oom_killed=lost and not cg.holder_outside_memory and cg.oom_kills() > 0,
            address=self.egress.address(sandbox_id) if self.egress is not None else None,
        )

    async def pause(self, sandbox_id: str) -> InstanceStatus:
        return await self._freeze(sandbox_id, True)

    async def resume(self, sandbox_id: str) -> InstanceStatus:
        return await self._freeze(sandbox_id, False)

    async def while_frozen(self, sandbox_id: str, work: Callable[[JailFile], Awaitable[T]]) -> T:
        """Run ``work(jail record)`` while the instance's processes are frozen (a consistent
        view of its files: nothing in it can write), then thaw it -- unless it was paused
        before, which it stays.

        Raises:
            InstanceNotFound: no running instance. RuntimeTimeout: it would not freeze.
        """
        status = await self.inspect(sandbox_id)
        data = jaildirs.read_jail(self._dir(sandbox_id) / JAIL_FILE)
        if not status.running or not isinstance(data, JailFile):
            raise InstanceNotFound(
                f"sandbox {sandbox_id!r} has no running instance", sandbox_id=sandbox_id
            )
        was_paused = status.paused
        if not was_paused:
            await self._freeze(sandbox_id, True)
        try:
            return await work(data)
        finally:
            if not was_paused:
                await self._freeze(sandbox_id, False)

    async def apply_network(self, sandbox_id: str, policy: NetworkPolicy) -> None:
        """Swap a running instance's egress policy (one nft batch, nothing restarted).

        Raises:
            NetworkNotSupported: this runtime gives its sandboxes no network (rootless, off).
            InstanceNotFound: the instance has no link (not running, or created without one).
        """
        if self.egress is None:
            raise NetworkNotSupported(
                "this node gives sandboxes no network (rootless, or SANDPOD_NET=off): "
                "the policy cannot be applied"
            )
        async with self._lock(sandbox_id):
            before = self.egress.policy(sandbox_id)
            try:
                await self.egress.apply(sandbox_id, policy)
            except KeyError:
                raise InstanceNotFound(
                    f"sandbox {sandbox_id!r} has no network link on this node",
                    sandbox_id=sandbox_id,
                ) from None
            if self.trust is not None and before is not None:
                await self._retrust(sandbox_id, self.trust(before).pem, self.trust(policy).pem)

    async def _retrust(self, sandbox_id: str, before: str, after: str) -> None:
        """The running sandbox's trust files follow its injections (see
        :mod:`~sandpod_lifecycle.runtime.jailtrust`). A failure is logged: the proxy already
        intercepts, so TLS to a domain the files do not yet trust fails closed."""
        if before == after:
            return
        data = jaildirs.read_jail(self._dir(sandbox_id) / JAIL_FILE)
        if not isinstance(data, JailFile):
            return
        try:
            written = await asyncio.to_thread(jailtrust.retrust, data, after)
        except (OSError, ProcessLookupError) as exc:
            log.warning("trust_rewrite_failed", sandbox_id=sandbox_id, error=str(exc))
            return
        log.info("trust_rewritten", sandbox_id=sandbox_id, files=written)

    async def destroy(self, sandbox_id: str) -> None:
        async with self._lock(sandbox_id):
            await self._teardown(sandbox_id)
        log.info("jail_destroyed", sandbox_id=sandbox_id)

    async def list(self) -> list[str]:
        ids = set(self._records())
        caps = await self.capabilities()
        if not caps.problems:
            ids |= self._cgroup_plan(caps).sandbox_ids()
        return sorted(i for i in ids if SANDBOX_ID_RE.fullmatch(i))

    # -- internals -----------------------------------------------------------------------------

    def _dir(self, sandbox_id: str) -> Path:
        return self.config.state_dir / sandbox_id

    def _cgroup_plan(self, caps: HostCapabilities) -> CgroupPlan:
        if self._plan is None:
            self._plan = CgroupPlan.choose(caps, self.config.cgroup_parent, self.config.core)
        return self._plan

    @contextlib.asynccontextmanager
    async def _lock(self, sandbox_id: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(sandbox_id, (asyncio.Lock(), 0))
        self._locks[sandbox_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[sandbox_id]
            if users == 1:  # nobody else holds or waits for it: forget it (bounded memory)
                del self._locks[sandbox_id]
            else:
                self._locks[sandbox_id] = (lock, users - 1)

    async def _create(
        self,
        spec: InstanceSpec,
        base: Path,
        plan: CgroupPlan,
        caps: HostCapabilities,
        *,
        uid: int,
        gid: int,
    ) -> None:
        sid, d = spec.sandbox_id, self._dir(spec.sandbox_id)
        rootless = not caps.root
        unshare = caps.tools.get("unshare") or "unshare"
        disk_bytes, top, (snap_root, snap_ws) = await self._mounts(spec, d, base, uid, unshare)
        quota = disk_bytes is not None
        restored = bool(spec.snapshot)
        jaildirs.make_dirs(d, top, restored=restored, quota=quota)
        trust_env: dict[str, str] = {}
        if self.egress is not None and spec.network is not None:
            jaildirs.write_resolv_conf(base, top / "upper", str(self.egress.gateway))
            if self.trust is not None:  # every sandbox: an injection may be added later
                trust_env = write_trust(base, top / "upper", self.trust(spec.network))
        if not rootless:  # rootless, our own uid is the sandbox's uid inside: nothing to chown
            os.chown(top / "workspace", uid, gid)
        else:  # a root-owned base's directories cannot be copied up in our user namespace
            jaildirs.writable_var_tmp(top / "upper")
        cg = plan.for_sandbox(sid)
        record = JailFile(
            sandbox_id=sid,
            phase="creating",
            holder_pid=None,
            holder_start=None,
            uid=uid,
            gid=gid,
            join=tuple(cg.joined),
            track=cg.core,
            cgroups=cg.to_jail(),
            workspace=JailWorkspace(inside=WORKSPACE, outside=top / "workspace"),
            upper=top / "upper",
            rootfs=base,
            layers=spec.layers,
            image=spec.image,
            workdir=spec.workdir,
            shell=spec.shell,
            env={**trust_env, **spec.env},  # placeholders only: never a secret's value
            userns=rootless,
            protections={},
            notes=(),
            seccomp=spec.seccomp,
            disk=JailDisk(bytes=disk_bytes, mount=top) if disk_bytes is not None else None,
        )
        jaildirs.write_jail(d / JAIL_FILE, record)
        protections = cg.create(spec.resources)
        layout = HolderLayout(
            sandbox_id=sid,
            base=base,
            # stacked over base; without a rootfs the image's bottom layer is the base
            layers=(*(spec.layers if spec.rootfs is not None else spec.layers[1:]), *snap_root),
            userxattr=rootless and bool(spec.layers),
            upper=top / "upper",
            work=top / "work",
            root=d / "root",
            workspace=top / "workspace",
            tmp_bytes=spec.resources.tmp_bytes or spec.resources.memory_bytes,
            shm_bytes=spec.resources.shm_bytes,
            uid=uid,
            gid=gid,
            masks=(self.config.state_dir, *self.config.mask_paths),
            log=d / "holder.log",
            rootless=rootless,
            seccomp=spec.seccomp,
            helper=seccomp.helper(),
            tmp_in_upper=quota,
            workspace_lower=tuple(reversed(snap_ws)),
            workspace_work=top / "wswork" if restored else None,
            volumes=tuple((v.source, v.target, v.read_only) for v in spec.volumes),
        )
        procs = [cgroup_join_file(c) for c in cg.holder_joined]
        egress: str | None = None

        async def attach(pid: int) -> None:  # while the holder builds the root (see launch)
            nonlocal egress
            egress = await self._attach(spec, pid)

        try:
            popen, holder, skipped = await launch(
                layout,
                caps.tools,
                procs,
                hostcaps.PATH,
                self.config.create_timeout,
                on_pid=attach,
            )
        finally:  # the holder's mount namespace keeps its own copies
            await asyncio.to_thread(snapmounts.unmount, d)
        self._launchers[sid] = popen
        notes = list(caps.notes) if rootless else []
        if skipped:
            notes.append(
                f"rootless: these directories of the base have mounts below them and "
                f"are empty in the sandbox: {' '.join(skipped)}"
            )
        protections["holder_oom"] = oom_protection(cg, holder)
        protections.update(dict.fromkeys(NAMESPACE_PROTECTIONS, ACTIVE))
        self._egress_protections(spec, egress, protections, notes)
        protections.update(
            network=ACTIVE,
            rootfs=ACTIVE,
            unprivileged_user=ACTIVE,
            no_new_privs=ACTIVE,
            disk_quota=ACTIVE if quota else str(self._disk_quota),
        )
        protections["seccomp"] = seccomp.protection(holder, spec.seccomp, layout.helper)
        if rootless:
            protections["user_namespace"] = ACTIVE
            notes.append(
                f"rootless: uid {uid} inside is the unprivileged host uid "
                f"{os.geteuid()}, shared by every sandbox of this user"
            )
        running = dataclasses.replace(
            record,
            phase="running",
            holder_pid=holder,
            holder_start=jaildirs.start_time(holder),
            protections=protections,
            notes=tuple(notes),
        )
        jaildirs.write_jail(d / JAIL_FILE, running)

    async def _mounts(
        self, spec: InstanceSpec, d: Path, base: Path, uid: int, unshare: str
    ) -> tuple[int | None, Path, tuple[Sequence[Path], Sequence[Path]]]:
        """The disk (``_disk``: a loop mount) and a restore's id-mapped layers (``snapmounts``,
        in ``d/lowers``): independent, so made at once; both have finished, or failed, when
        this returns or raises (the caller's teardown never races a mount)."""
        rootless = not (await self.capabilities()).root
        disk, snaps = await asyncio.gather(
            self._disk(spec, d),
            asyncio.to_thread(
                snapmounts.mount, d, spec, base, uid=uid, rootless=rootless, unshare=unshare
            ),
            return_exceptions=True,
        )
        if isinstance(disk, BaseException):
            raise disk
        if isinstance(snaps, BaseException):
            raise snaps
        return disk[0], disk[1], snaps

    def _egress_protections(
        self,
        spec: InstanceSpec,
        egress: str | None,
        protections: dict[str, str],
        notes: MutableSequence[str],
    ) -> None:
        """Record the ``egress`` protection ``_attach`` returned (None: no network asked)."""
        if egress is None:
            return
        protections["egress"] = egress
        if self.egress is not None and spec.network is not None:
            off = self.egress.ipv6_off
            protections["egress_ipv6"] = ACTIVE if off is None else f"off: {off}"
            if off is not None:
                notes.append(f"IPv4 egress only: {off}")

    async def _volumes(self, spec: InstanceSpec, uid: int, gid: int, *, chown: bool) -> None:
        """Check the volume binds and hand each read-write one's files to the sandbox's uid
        (see ``volumes.py``; rootless, every sandbox's uid is ours already). Raises ValueError
        for a bind the sandbox could not see."""
        for vol in spec.volumes:
            for mask in (self.config.state_dir, *self.config.mask_paths):
                target, masked = Path(vol.target), Path(mask)
                if target == masked or masked in target.parents or target in masked.parents:
                    raise ValueError(
                        f"volume mount path {vol.target} overlaps {mask}, which this node masks "
                        "in every sandbox: choose another mount path"
                    )
            if chown and not vol.read_only and vol.key != ("", ""):
                await asyncio.to_thread(self.volumes.hand_over, *vol.key, uid, gid)

    async def _attach(self, spec: InstanceSpec, holder: int) -> str | None:
        """Give the instance its link when it has a policy and this node gives egress. Returns
        the ``egress`` protection: "active" (its policy is enforced), why the policy is not
        applied (the sandbox keeps loopback only: never an unfiltered network), or None (the
        spec asks for no network)."""
        if spec.network is None:
            return None
        if self.egress is None:
            if os.geteuid() != 0:
                return "unavailable: rootless: egress refused, the sandbox has loopback only"
            return "off on this node (SANDPOD_NET=off, or its setup failed): loopback only"
        addrs = await self.egress.attach(spec.sandbox_id, holder, spec.network)
        log.info(
            "jail_network",
            sandbox_id=spec.sandbox_id,
            address=str(addrs.sandbox),
            address6=str(addrs.sandbox6),
        )
        return ACTIVE

    async def _disk(self, spec: InstanceSpec, d: Path) -> tuple[int | None, Path]:
        """(the disk quota in bytes, where the sandbox's writable directories go): with a quota
        its own filesystem mounted in ``d`` (see ``diskquota.py``); without one (None) ``d``
        itself, and ``protections["disk_quota"]`` says why."""
        if self._disk_quota is None:
            self._disk_quota = await asyncio.to_thread(diskquota.probe)
        if self._disk_quota != ACTIVE:
            return None, d
        size = spec.resources.disk_bytes or self.config.default_disk_bytes
        state, options = self.config.state_dir, self.config.disk
        return size, await asyncio.to_thread(diskquota.attach, state, d, size, options)

    def _allocate(self, spec: InstanceSpec) -> tuple[int, int]:
        """Create the sandbox's directory with a stub jail file holding its uid, under a lock
        shared by every driver process using this state dir: two creates never pick the same
        uid, and a directory without a jail file is never ours (see ``list``).

        Raises:
            InstanceExists: another driver process created the id meanwhile.
            CreateFailed: the uid range is exhausted.
        """
        sid = spec.sandbox_id
        self.config.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # every process's uids, read before the lock (see next_uid): creates at once overlap it
        busy = busy_uids() if spec.uid is None else set()
        with (self.config.state_dir / ".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            uid = spec.uid
            if uid is None:
                used = {record.uid for record in self._records().values()}
                uid = next_uid(  # never a uid anything of an old sandbox may still hold
                    self.config.state_dir, self.config.uid_base, self.config.uid_count, used, busy
                )
                if uid is None:
                    raise CreateFailed("no free sandbox uid left in the configured range")
            try:
                self._dir(sid).mkdir(mode=0o700)
            except FileExistsError:
                raise InstanceExists(f"sandbox {sid!r} already has an instance") from None
            jaildirs.write_jail(
                self._dir(sid) / JAIL_FILE, JailReservation(sandbox_id=sid, uid=uid)
            )
        return uid, spec.gid if spec.gid is not None else uid

    def _records(self) -> dict[str, JailFile | JailReservation]:
        """id -> jail file of every sandbox directory (a directory without one is not ours)."""
        records = {}
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.config.state_dir):
                data = jaildirs.read_jail(Path(entry.path, JAIL_FILE)) if entry.is_dir() else None
                if data is not None:
                    records[entry.name] = data
        return records

    async def _freeze(self, sandbox_id: str, frozen: bool) -> InstanceStatus:
        async with self._lock(sandbox_id):
            status = await self.inspect(sandbox_id)
            if not status.running:
                raise InstanceNotFound(
                    f"sandbox {sandbox_id!r} has no running instance", sandbox_id=sandbox_id
                )
            data = jaildirs.read_jail(self._dir(sandbox_id) / JAIL_FILE)
            if not isinstance(data, JailFile):  # destroyed meanwhile, by another process
                raise InstanceNotFound(
                    f"sandbox {sandbox_id!r} has no jail file any more", sandbox_id=sandbox_id
                )
            cg = SandboxCgroups.from_jail(data.cgroups)
            if cg.core is None:
                raise RuntimeUnavailable(
                    f"cannot pause sandbox {sandbox_id!r}: {UNDELEGATED % 'freezer'}",
                    problems=[UNDELEGATED % "freezer"],
                )
            cg.set_frozen(frozen)
            if not await cg.wait_frozen(frozen, self.config.pause_timeout):
                raise RuntimeTimeout(
                    f"sandbox {sandbox_id!r} did not {'freeze' if frozen else 'thaw'} in time",
                    sandbox_id=sandbox_id,
                )
        return await self.inspect(sandbox_id)

    async def _teardown(self, sandbox_id: str) -> None:
        """Kill, then remove cgroups and directories. Safe on partial or absent instances."""
        d = self._dir(sandbox_id)
        data = jaildirs.read_jail(d / JAIL_FILE)
        cg: SandboxCgroups | None
        if isinstance(data, JailFile):
            cg = SandboxCgroups.from_jail(data.cgroups)
        else:
            caps = await self.capabilities()
            cg = self._cgroup_plan(caps).for_sandbox(sandbox_id) if not caps.problems else None
        popen = self._launchers.get(sandbox_id)
        if self.egress is not None:  # first: nothing leaves while the rest is torn down
            await self.egress.detach(sandbox_id)

        def reap() -> None:
            if popen is not None:
                popen.poll()

        if isinstance(data, JailFile) and (cg is None or cg.core is None):
            # No cgroup tracks the sandbox (rootless without delegation): its pid namespace
            # does. Killing the namespace's init (the holder) kills every process in it.
            await jaildirs.kill_holder(data, self.config.destroy_timeout, reap)
        if cg is not None:
            await cg.teardown(self.config.destroy_timeout, reap)
        # The launcher is dead or dying now: reap it, so no zombie of ours outlives destroy.
        if popen is not None and await wait_exit(popen, self.config.destroy_timeout):
            del self._launchers[sandbox_id]
        try:  # the sandbox's own filesystem, if any: its processes are gone
            await asyncio.to_thread(snapmounts.unmount, d)  # a create that crashed half-way
            await asyncio.to_thread(diskquota.detach, d)
        except OSError as exc:
            raise DestroyFailed(f"cannot unmount the disk of {sandbox_id!r}: {exc}") from exc
        if (d / JAIL_FILE).exists():  # never remove a directory that is not ours
            errors = await asyncio.to_thread(jaildirs.remove_tree, d)
            if errors:
                raise DestroyFailed(f"cannot remove {d}: {errors[:3]}", path=str(d))
