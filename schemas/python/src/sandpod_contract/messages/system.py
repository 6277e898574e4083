"""``sys`` family: liveness, self-description, resource metrics and activity of a sandbox.

``sys.ping``, ``sys.info``, ``sys.metrics`` and ``sys.activity`` are probes: none of them counts as
sandbox activity, so a monitor polling them never keeps an idle sandbox alive.
"""

from __future__ import annotations

import dataclasses

from sandpod_contract.codec import Message
from sandpod_contract.messages.common import Empty
from sandpod_contract.operations import Operation

__all__ = [
    "OPERATIONS",
    "Activity",
    "Configure",
    "Configured",
    "Freeze",
    "FreezeState",
    "Info",
    "Pong",
    "SandboxMetrics",
    "SnapshotTake",
    "SnapshotTaken",
]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Pong(Message):
    """Reply to ``sys.ping``."""

    TYPE = "sys.pong"
    sandbox_id: str
    time: float  # execd's wall clock, seconds since the epoch


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Info(Message):
    """Reply to ``sys.info``: what this execd is and the limits a client must respect."""

    TYPE = "sys.info"
    sandbox_id: str
    execd_version: str
    protocol_version: int
    runtime: str  # e.g. "process"
    isolation: str  # e.g. "none": commands run on the host as execd's user
    hostname: str
    pid: int
    started_at: float
    workspace: str  # the workspace as the sandbox sees it: "/workspace" (never a host path)
    max_request_bytes: int  # larger requests are refused with bad_request.too_large
    max_payload: int  # the NATS server's max payload as execd sees it
    default_window: int  # stream window used when a client does not ask for one
    max_window: int
    default_max_output: int  # per-stream capture cap of one-shot exec
    families: tuple[str, ...] = ()
    max_output_limit: int | None = None  # largest max_output honoured (None: an older execd)
    # the sandbox's own root filesystem as execd's commands see it ("/" in a Pod), whose
    # changes ``sys.snapshot`` can capture; "": none (the process runtime, an older execd)
    rootfs: str = ""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SandboxMetrics(Message):
    """Reply to ``sys.metrics``: a snapshot of what the sandbox uses now.

    ``source`` says how the sandbox's processes were counted: ``procfs`` (the ``process`` runtime:
    every live process whose environment carries the sandbox's id, summed) or ``cgroup`` (runtimes
    that give each sandbox its own cgroup: the kernel's accounting of it). Load and CPU count
    describe the machine; memory does too unless the sandbox has a smaller memory limit.
    """

    TYPE = "sys.metrics"
    sandbox_id: str
    time: float  # wall clock of the snapshot
    source: str  # "procfs" or "cgroup"
    cpu_seconds: float  # CPU time of the live processes (cgroup: charged to it, exited too)
    cpu_count: int  # CPUs the host has
    load1: float  # host load averages
    load5: float
    load15: float
    memory_rss: int  # bytes resident, summed over processes (cgroup: charged, cache included)
    memory_total: int  # host memory, or the sandbox's memory limit if smaller, bytes
    memory_available: int  # memory available for new work (within the limit), bytes
    disk_used: int  # bytes allocated under the workspace, and a jail's root layer (like du)
    disk_entries: int  # files and directories counted
    disk_complete: bool  # False: the walk hit its bound and disk_used is a lower bound
    disk_free: int  # bytes available to unprivileged users on the workspace's filesystem
    disk_total: int  # size of that filesystem, bytes
    processes: int  # live processes of the sandbox
    execs: int  # running execs (one-shot and streaming) of the sandbox


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Activity(Message):
    """Reply to ``sys.activity``: when a client last did something with the sandbox.

    Exec, stdin, stream acks, PTY input and every other non-probe verb count; the ``sys.*`` probes,
    ``exec.status`` and passive waits and readers (``watch.poll``, ``pty.read``, ``proc.wait``,
    ``proc.logs``, ``proc.wait_port``) do not.
    """

    TYPE = "sys.activity"
    sandbox_id: str
    last_activity: float  # wall clock of the last activity
    idle: float  # seconds since then, by execd's clock
    time: float  # execd's wall clock now


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Configure(Message):
    """``sys.configure``: the default environment of the sandbox's *new* commands from now on
    (execs, processes, sessions and terminals started later), on top of the template's.

    Sent by the pool service when a claim binds a warm sandbox (so a claim's env never forces a
    cold start) and by the lifecycle service after an instance restarts. ``env`` replaces the
    previous configured set; a ``generation`` lower than the last one applied is ignored (a late
    duplicate cannot undo a newer configuration). Counts as activity: a claimed sandbox's idle
    clock starts at the claim.
    """

    TYPE = "sys.configure"
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    generation: int = 0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Configured(Message):
    TYPE = "sys.configured"
    sandbox_id: str
    generation: int  # the generation in effect (higher than asked: the request was stale)
    env_keys: tuple[str, ...]  # names of the configured variables (values are not echoed)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Freeze(Message):
    """``sys.freeze``: stop every process execd started, and their descendants, until
    ``sys.thaw`` (pause of runtimes that cannot freeze the sandbox from outside, e.g. a Pod).

    execd itself keeps serving; while frozen it refuses new commands (exec, proc, session, pty,
    git) with ``sandbox.paused``. Idempotent: freezing a frozen sandbox re-checks that nothing
    escaped. ``timeout``: how long execd may take to get every process stopped.
    """

    TYPE = "sys.freeze"
    timeout: float = 5.0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FreezeState(Message):
    """Reply to ``sys.freeze``, ``sys.thaw`` and ``sys.freezer``: whether the sandbox's processes
    are frozen now, and how.

    ``mechanism``: ``cgroup`` (cgroup v2 ``cgroup.freeze`` on a cgroup holding only the commands;
    invisible to them) or ``signals`` (SIGSTOP to each process of the tree, SIGCONT on thaw: a
    process can observe it, e.g. a parent's ``waitpid(WUNTRACED)`` or SIGCHLD). Empty when never
    frozen. ``processes``: how many processes the last freeze stopped (or thaw continued).
    """

    TYPE = "sys.freeze_state"
    sandbox_id: str
    frozen: bool
    mechanism: str = ""
    processes: int = 0
    detail: str = ""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotTake(Message):
    """``sys.snapshot`` (the lifecycle's, Kubernetes mode): write ``path`` (a directory, e.g.
    ``/workspace``) as one POSIX tar file while the sandbox's commands are frozen (``sys.freeze``
    semantics; a sandbox already paused stays paused, any other is thawed after the copy).
    ``timeout``: how long execd may take to freeze them. The reply names the file, which the
    caller reads (``fs.read``) and removes (``fs.remove``). ``rootfs``: in the same freeze, also
    write what changed in the sandbox's root filesystem since execd started (the container's
    writable layer as the sandbox sees it: see ``Info.rootfs``) as a second tar."""

    TYPE = "sys.snapshot"
    path: str = "/workspace"
    timeout: float = 5.0
    rootfs: bool = False


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotTaken(Message):
    """Reply to ``sys.snapshot``: the tar file (``file``, a path ``fs.read`` accepts), its
    ``size`` in bytes, how many ``entries`` it holds, and how the commands were frozen
    (``mechanism``: ``cgroup`` or ``signals``, as in :class:`FreezeState`). With ``rootfs``
    asked and an execd that has a root filesystem to capture, ``rootfs_file`` names the second
    tar (its size and entries alongside); "" otherwise."""

    TYPE = "sys.snapshot_taken"
    sandbox_id: str
    file: str
    size: int
    entries: int
    mechanism: str = ""
    rootfs_file: str = ""
    rootfs_size: int = 0
    rootfs_entries: int = 0


OPERATIONS: tuple[Operation, ...] = (
    Operation("sys", "ping", Empty, Pong, "liveness; answers without touching any command"),
    Operation("sys", "info", Empty, Info, "runtime, isolation and limits of this execd"),
    Operation("sys", "metrics", Empty, SandboxMetrics, "cpu, memory, disk and process counts"),
    Operation("sys", "activity", Empty, Activity, "last client activity (for idle timeouts)"),
    Operation("sys", "configure", Configure, Configured, "default env of new commands (claims)"),
    Operation("sys", "freeze", Freeze, FreezeState, "stop every command's process tree (pause)"),
    Operation("sys", "thaw", Empty, FreezeState, "continue the frozen processes (resume)"),
    Operation("sys", "freezer", Empty, FreezeState, "whether the processes are frozen, and how"),
    Operation("sys", "snapshot", SnapshotTake, SnapshotTaken, "a directory as a tar, frozen"),
)
