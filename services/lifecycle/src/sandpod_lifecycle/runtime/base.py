"""The runtime driver seam: what a driver is asked to do and what it reports back.

A driver turns an :class:`InstanceSpec` into an *instance* on this host (for the local runtime: a
namespace jail with a copy-on-write root and cgroup limits) and answers for it by sandbox id. The
reconciler decides *when* to create, pause, resume or destroy; the driver knows *how*, and says
honestly what it could not do: every instance carries ``protections``, one entry per protection,
``"active"`` or the reason it is not. Nothing here runs commands: execd enters the instance
through the jail file the driver writes (see ``sandpod_execd.jail``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, Protocol

from sandpod_contract.network import NetworkPolicy
from sandpod_contract.resources import ConditionReason
from sandpod_contract.subjects import validate_sandbox_id

__all__ = [
    "ACTIVE",
    "CreateFailed",
    "DestroyFailed",
    "HostCapabilities",
    "InstanceExists",
    "InstanceNotFound",
    "InstanceSpec",
    "InstanceStatus",
    "InstanceUnhealthy",
    "NetworkEnforcement",
    "NetworkNotSupported",
    "Resources",
    "RuntimeDriver",
    "RuntimeFailure",
    "RuntimeTimeout",
    "RuntimeUnavailable",
    "SeccompMode",
    "SnapshotLayer",
    "VolumeBind",
]

MiB = 1024 * 1024
SHM_FRACTION = 4  # /dev/shm may hold this fraction of the memory limit (see Resources)
MIN_DISK = 16 * MiB  # the smallest ext4 a sandbox's disk can be
ACTIVE = "active"  # the one value of ``protections`` that means "in force"
SeccompMode = Literal["default", "nested", "unconfined"]  # see runtime/seccomp.py


@dataclasses.dataclass(frozen=True, slots=True)
class NetworkEnforcement:
    """What a runtime made of a sandbox's egress policy (a driver's ``apply_network``):
    ``enforced`` when all of it is in force, else ``reason`` says what is not and why (it
    reaches ``status.network`` and the ``network.updated`` event, never hidden)."""

    enforced: bool
    reason: str = ""


class RuntimeFailure(Exception):
    """Root of driver errors. ``retryable``: trying the same call later may succeed."""

    retryable = False

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class RuntimeUnavailable(RuntimeFailure):
    """This host cannot provide the isolation the driver requires (see ``HostCapabilities``)."""


class NetworkNotSupported(RuntimeFailure):
    """The runtime gives this instance no network to apply a policy to (rootless, egress off,
    or a runtime without enforcement that refuses rather than ignores)."""

    code = "network.not_supported"


class InstanceExists(RuntimeFailure):
    """``create`` for a sandbox id that already has an instance (destroy it first)."""


class InstanceNotFound(RuntimeFailure):
    """The sandbox id has no instance on this host."""


class InstanceUnhealthy(RuntimeFailure):
    """The instance exists but reports why it does not serve, as a stable ``reason`` (a
    ``ConditionReason``: Unschedulable, OOMKilled...). ``terminal``: give up (the Sandbox is
    Failed, the instance destroyed); otherwise keep the instance and wait (``Ready=False``)."""

    def __init__(self, message: str, *, reason: ConditionReason, terminal: bool) -> None:
        super().__init__(message, reason=str(reason))
        self.reason = reason
        self.terminal = terminal
        self.retryable = not terminal


class CreateFailed(RuntimeFailure):
    """The instance could not be started; nothing of it was left behind."""

    retryable = True


class RuntimeTimeout(RuntimeFailure):
    """An operation (freeze, thaw) did not take effect in time; calling again may succeed."""

    retryable = True


class DestroyFailed(RuntimeFailure):
    """Some trace could not be removed yet (e.g. a process would not die); destroy again."""

    retryable = True


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Resources:
    """Limits of one instance. ``disk_bytes`` limits the writable layer, ``/workspace`` and
    ``/tmp`` together (None: the driver's default, 10 GiB for the local runtime). ``tmp_bytes``
    sizes ``/tmp`` where the driver cannot give a disk quota (a tmpfs charged to the instance's
    memory); None means ``memory_bytes``. ``/dev/shm`` (tmpfs, charged to the instance's memory
    too) is a quarter of ``memory_bytes`` at most (:attr:`shm_bytes`): what a sandbox parks there
    stays charged with no process to kill for it, so a full ``/dev/shm`` must still leave its
    processes room to run."""

    memory_bytes: int = 512 * MiB
    cpu_millicores: int = 1000
    pids: int = 512
    tmp_bytes: int | None = None
    disk_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.memory_bytes < 16 * MiB:
            raise ValueError(f"memory_bytes must be at least 16 MiB, got {self.memory_bytes}")
        if self.cpu_millicores < 10:
            raise ValueError(f"cpu_millicores must be at least 10, got {self.cpu_millicores}")
        if self.pids < 8:
            raise ValueError(f"pids must be at least 8, got {self.pids}")
        if self.tmp_bytes is not None and self.tmp_bytes < MiB:
            raise ValueError(f"tmp_bytes must be at least 1 MiB, got {self.tmp_bytes}")
        if self.disk_bytes is not None and self.disk_bytes < MIN_DISK:
            raise ValueError(f"disk_bytes must be at least 16 MiB, got {self.disk_bytes}")

    @property
    def shm_bytes(self) -> int:
        """The size of ``/dev/shm``: ``memory_bytes / SHM_FRACTION`` (or ``tmp_bytes`` if less)."""
        return min(self.memory_bytes // SHM_FRACTION, self.tmp_bytes or self.memory_bytes)


@dataclasses.dataclass(frozen=True, slots=True)
class SnapshotLayer:
    """One unpacked layer of a snapshot on this node: its files, which part of a sandbox it
    holds (``rootfs`` or ``workspace``; ``podroot``: a Pod's root filesystem changes) and the
    uid (= gid) that owned them when captured."""

    path: Path
    part: Literal["rootfs", "workspace", "podroot"]
    owner: int


@dataclasses.dataclass(frozen=True, slots=True)
class VolumeBind:
    """A SandboxVolume in an instance: ``source`` (a host directory, the volume's mounted
    filesystem) bound at ``target`` inside (validated by ``sandpod_contract.volumes``), read-only
    or not. A read-write bind hands the volume's files to the instance's uid first."""

    source: Path
    target: str
    read_only: bool = False
    key: tuple[str, str] = ("", "")  # (namespace, name) of the volume: whose files to hand over


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class InstanceSpec:
    """What to create.

    Attributes:
        sandbox_id: a DNS label; also the instance's hostname.
        rootfs: the read-only base of the copy-on-write root; None means the host's root
            filesystem (submounts such as /proc or /dev are not part of it) unless ``layers``
            are given.
        layers: read-only directories in overlay format (whiteouts, opaque directories),
            bottom first: an image's unpacked layers (the node's image store, shared by every
            sandbox of the image), or a built template's; stacked over ``rootfs`` when one is
            given, else the whole base.
        image: what ``layers`` are (``reference@digest``), for the jail file and ``get``.
        workdir: the image's working directory, the default cwd of shells and commands that
            name none (None: ``/workspace``).
        shell: the image's shell (its ``Cmd`` when that is a shell), for sessions and PTYs.
        uid, gid: the unprivileged identity commands run as; None lets the driver allocate a
            dedicated one per instance.
        env: environment every command of the instance starts with (on top of execd's base).
        egress: whether the template allows outbound network (the older allowlist form).
        network: the sandbox's effective egress policy; the local runtime (as root, with
            egress enabled) gives the instance a link filtered by it; None: loopback only.
        seccomp: the sandbox's seccomp filter: ``default``, ``nested`` (nested user namespaces
            allowed) or ``unconfined`` (none); anything but ``default`` is reported in
            ``protections`` (see ``runtime/seccomp.py``).
        snapshot: a snapshot's layers to restore, bottom first: ``rootfs`` ones stack over
            ``layers``, ``workspace`` ones become the workspace's lower layers; each is shown
            read-only with its owner's files as this instance's (see ``runtime/idmap.py``).
    """

    sandbox_id: str
    rootfs: Path | None = None
    layers: tuple[Path, ...] = ()
    image: str | None = None
    workdir: str | None = None
    shell: str | None = None
    resources: Resources = dataclasses.field(default_factory=Resources)
    uid: int | None = None
    gid: int | None = None
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    egress: bool = False
    seccomp: SeccompMode = "default"
    network: NetworkPolicy | None = None
    snapshot: tuple[SnapshotLayer, ...] = ()
    volumes: tuple[VolumeBind, ...] = ()  # SandboxVolumes bound into the instance

    def __post_init__(self) -> None:
        validate_sandbox_id(self.sandbox_id)
        for vol in self.volumes:
            if not vol.source.is_absolute() or not vol.target.startswith("/"):
                raise ValueError(f"a volume bind needs absolute paths, got {vol}")
        if self.seccomp not in ("default", "nested", "unconfined"):
            raise ValueError(f"seccomp must be default, nested or unconfined, got {self.seccomp!r}")
        for name, value in (("uid", self.uid), ("gid", self.gid)):
            if value is not None and not 0 < value < 2**32 - 1:
                raise ValueError(f"{name} must be an unprivileged id (1..2^32-2), got {value}")
        if self.rootfs is not None and not self.rootfs.is_absolute():
            raise ValueError(f"rootfs must be an absolute path, got {self.rootfs}")
        for layer in self.layers:
            if not layer.is_absolute():
                raise ValueError(f"a layer must be an absolute path, got {layer}")
        for name, path in (("workdir", self.workdir), ("shell", self.shell)):
            if path is not None and not path.startswith("/"):
                raise ValueError(
                    f"{name} must be an absolute path inside the sandbox, got {path!r}"
                )
        for key in self.env:
            if not key or "=" in key or "\0" in key:
                raise ValueError(f"invalid environment variable name {key!r}")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class InstanceStatus:
    """What the driver knows about one sandbox id on this host.

    ``exists`` is False when there is no trace at all (the other fields are then empty).
    ``running``: the instance's holder process is alive. ``jail_file`` is what execd's
    ``SANDPOD_EXECD_JAIL`` must point at to run commands inside the instance. ``upper_dir`` is
    the writable layer of the root (the unit of snapshots). ``protections`` maps each protection
    to ``"active"`` or why it is not; ``notes`` says what of the spec was not honoured (e.g.
    egress); ``detail`` says why an existing instance is not running. ``lost``: it ran and its
    holder exited (the instance will not serve again); ``oom_killed`` then says whether its
    memory cgroup's OOM killer, which could pick the holder and did kill, is the likely cause.
    """

    sandbox_id: str
    exists: bool
    running: bool = False
    paused: bool = False
    holder_pid: int | None = None
    uid: int | None = None
    gid: int | None = None
    jail_file: Path | None = None
    workspace: Path | None = None
    upper_dir: Path | None = None
    cgroups: tuple[str, ...] = ()
    protections: Mapping[str, str] = dataclasses.field(default_factory=dict)
    notes: tuple[str, ...] = ()
    detail: str = ""
    lost: bool = False
    oom_killed: bool = False
    address: str | None = None  # the instance's own IP address, where it has a link

    @property
    def degraded(self) -> dict[str, str]:
        """The protections that are not active, with their reasons."""
        return {name: why for name, why in self.protections.items() if why != ACTIVE}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class HostCapabilities:
    """What this host allows, detected once when the driver starts.

    ``problems`` lists why the driver cannot run at all (empty: usable); ``notes`` lists
    protections that will be degraded on every instance. ``cgroup_v1`` maps each v1 controller
    to its hierarchy's mount point; ``cgroup_v2`` is the unified mount point (None: not mounted)
    and ``cgroup_v2_controllers`` the controllers it offers.
    """

    root: bool
    namespaces: frozenset[str]
    unprivileged_user_namespaces: bool
    overlayfs: bool
    cgroup_v1: Mapping[str, Path]
    cgroup_v2: Path | None
    cgroup_v2_controllers: frozenset[str]
    freezer: str | None  # "v1" (freezer.state), "v2" (cgroup.freeze) or None
    tools: Mapping[str, str | None]
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def usable(self) -> bool:
        return not self.problems


class RuntimeDriver(Protocol):
    """A runtime: creates, inspects, pauses, resumes and destroys instances by sandbox id."""

    async def capabilities(self) -> HostCapabilities:
        """What this host allows (cached after the first call)."""
        ...

    async def create(self, spec: InstanceSpec) -> InstanceStatus:
        """Create and start the instance.

        Raises:
            RuntimeUnavailable: the host cannot isolate (see ``capabilities().problems``).
            InstanceExists: the id already has an instance.
            CreateFailed: starting failed; every trace was removed again.
        """
        ...

    async def inspect(self, sandbox_id: str) -> InstanceStatus:
        """The instance's status (``exists=False`` when there is none)."""
        ...

    async def pause(self, sandbox_id: str) -> InstanceStatus:
        """Freeze every process of the instance; returns once they are frozen.

        Raises:
            InstanceNotFound: no running instance.
        """
        ...

    async def resume(self, sandbox_id: str) -> InstanceStatus:
        """Thaw the instance's processes.

        Raises:
            InstanceNotFound: no running instance.
        """
        ...

    async def destroy(self, sandbox_id: str) -> None:
        """Remove every trace: processes, mounts, cgroups, directories (idempotent).

        Raises:
            DestroyFailed: something could not be removed yet; calling again continues.
        """
        ...

    async def list(self) -> list[str]:
        """Ids with any trace on this host, including half-created or orphaned ones."""
        ...
