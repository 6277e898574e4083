"""The asynchronous SDK's entry point: :class:`AsyncSandbox`, a handle on one sandbox.

Most calls are one NATS request on the sandbox's own subjects, answered by its execd with no
control plane in the path; errors arrive as the contract's typed exceptions. The handle owns (or
shares) the connection and hands a :class:`~sandpod.channel.Channel` (``channel``: call,
publish, subject, limits) to the per-family APIs (``fs``, ``proc``, ``sessions``, ``pty``,
``watch``, ``git`` and the exec family behind :meth:`AsyncSandbox.exec`), which never see this
class. Creating, claiming, listing, pausing and deleting go to the lifecycle and pool services
(:mod:`sandpod.control`, :mod:`sandpod.pools`). Names that lived here before the split are
re-exported.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self

from sandpod.channel import CONTROL_TIMEOUT, DEFAULT_TIMEOUT, bus_channel
from sandpod.config import (
    resolve_inbox_prefix,
    resolve_nats_creds,
    resolve_nats_url,
    resolve_prefix,
    resolve_tenant,
)
from sandpod.control import (
    SandboxInfo,
    api_call,
    create_object,
    create_sandbox,
    follow_events,
    list_sandboxes,
)
from sandpod.errors import SandpodError
from sandpod.exec.api import open_exec_stream, run_exec
from sandpod.exec.args import Command
from sandpod.exec.stream import AsyncExecStream
from sandpod.exec.types import ExecResult
from sandpod_bus import Bus, BusSettings
from sandpod_contract.messages.common import Empty
from sandpod_contract.messages.sandboxes import ObjectReply, Ref, Renew, SandboxEvent
from sandpod_contract.messages.system import Activity, Info, Pong, SandboxMetrics
from sandpod_contract.subjects import Subjects, validate_sandbox_id

if TYPE_CHECKING:  # the families are imported on first use: see AsyncSandbox.fs
    from sandpod.fs import AsyncFiles
    from sandpod.git import AsyncGit
    from sandpod.network import AsyncNetwork
    from sandpod.pools import ClaimInfo
    from sandpod.preview import Preview
    from sandpod.proc import AsyncProcesses
    from sandpod.pty import AsyncPtys
    from sandpod.session import AsyncSessions
    from sandpod.snapshots import AsyncSnapshots, SnapshotInfo
    from sandpod.volumes import VolumeMount
    from sandpod.watch import AsyncWatches

__all__ = ["AsyncExecStream", "AsyncSandbox", "Command"]


class AsyncSandbox:
    """A handle on one sandbox. Create with :meth:`connect`; close with :meth:`close`."""

    def __init__(self, bus: Bus, sandbox_id: str, subjects: Subjects, *, owns_bus: bool) -> None:
        self.bus = bus
        self.id = validate_sandbox_id(sandbox_id)
        self.subjects = subjects
        self._owns_bus = owns_bus
        self.channel = bus_channel(bus, subjects, self.id)  # what the families get, not ``self``
        self.claim_info: ClaimInfo | None = None  # set when this sandbox came from a claim

    # The per-family APIs, each imported and built on first use: a caller that only runs
    # commands (the CLI's `sandpod exec`) never loads the fs, pty, watch, ... modules and their
    # contract messages, a large part of the SDK's import time.

    @functools.cached_property
    def fs(self) -> AsyncFiles:
        from sandpod.fs import AsyncFiles

        return AsyncFiles(self.channel)

    @functools.cached_property
    def proc(self) -> AsyncProcesses:
        from sandpod.proc import AsyncProcesses

        return AsyncProcesses(self.channel)

    @functools.cached_property
    def sessions(self) -> AsyncSessions:
        from sandpod.session import AsyncSessions

        return AsyncSessions(self.channel)

    @functools.cached_property
    def pty(self) -> AsyncPtys:
        from sandpod.pty import AsyncPtys

        return AsyncPtys(self.channel)

    @functools.cached_property
    def watch(self) -> AsyncWatches:
        from sandpod.watch import AsyncWatches

        return AsyncWatches(self.channel)

    @functools.cached_property
    def git(self) -> AsyncGit:
        from sandpod.git import AsyncGit

        return AsyncGit(self.channel)

    @functools.cached_property
    def network(self) -> AsyncNetwork:
        """The sandbox's egress policy (a control-plane family: the lifecycle service)."""
        from sandpod.network import AsyncNetwork

        return AsyncNetwork(self.bus, self.subjects, self.id)

    @functools.cached_property
    def snapshots(self) -> AsyncSnapshots:
        """The installation's snapshots (a control-plane family: the lifecycle service)."""
        from sandpod.snapshots import AsyncSnapshots

        return AsyncSnapshots(self.bus, self.subjects)

    async def snapshot(
        self,
        name: str | None = None,
        *,
        ttl: int | None = None,
        retain: int | None = None,
        wait: float = 600.0,
    ) -> SnapshotInfo:
        """Capture this sandbox's files (its writable root layer and ``/workspace``) at one
        instant -- its processes frozen for the capture, then running on -- as a snapshot;
        only what changed since its last snapshot (or the one it started from) is stored.

        Raises:
            SnapshotFailed: the capture failed (the reason says why and whether to retry).
        """
        return await self.snapshots.create(self.id, name=name, ttl=ttl, retain=retain, wait=wait)

    async def fork(
        self,
        n: int = 1,
        *,
        snapshot: str | None = None,
        labels: Mapping[str, str] | None = None,
        wait: float = 60.0,
    ) -> list[AsyncSandbox]:
        """``n`` new sandboxes with exactly this sandbox's files now (a snapshot is taken, or
        ``snapshot`` is used), each isolated from the others and from this one. They share
        this handle's connection.

        Raises:
            SnapshotFailed: the capture failed. SandboxError: a fork failed to start (the forks
                made so far are deleted).
        """
        if n < 1:
            raise ValueError("n must be at least 1")
        name = snapshot or (await self.snapshot()).name

        async def one() -> SandboxInfo:
            obj = create_object(
                name=None,
                template=None,
                timeout=None,
                permanent=False,
                idle_timeout=None,
                labels=labels,
                env=None,
                snapshot=name,
            )
            return await create_sandbox(self.bus, self.subjects, obj, wait=wait)

        made = await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)
        forks = [
            type(self)(self.bus, m.name, self.subjects, owns_bus=False)
            for m in made
            if isinstance(m, SandboxInfo)
        ]
        failed = [m for m in made if isinstance(m, BaseException)]
        if failed:
            for f in forks:
                with contextlib.suppress(SandpodError):
                    await f.kill()
            raise failed[0]
        return forks

    @classmethod
    async def connect(
        cls,
        sandbox_id: str = "default",
        *,
        nats_url: str | None = None,
        prefix: str | None = None,
        connect_timeout: float = 5.0,
        bus: Bus | None = None,
        nats_creds: str | None = None,
        tenant: str | None = None,
        inbox_prefix: str | None = None,
    ) -> AsyncSandbox:
        """Connect to sandbox ``sandbox_id``.

        Args:
            nats_url: NATS URL(s); default ``$SANDPOD_NATS_URL``, ``$NATS_URL``, localhost.
            nats_creds: creds file for a NATS in operator mode; default ``$SANDPOD_NATS_CREDS``,
                else the client credential of a local ``sandpod up`` if readable
                (:func:`sandpod.config.resolve_nats_creds`).
            tenant: act as this tenant (control-plane requests on its own subjects), as a
                tenant credential requires; default ``$SANDPOD_TENANT``.
            inbox_prefix: reply-inbox prefix (a tenant credential's ``_INBOX.<token>``);
                default ``$SANDPOD_NATS_INBOX_PREFIX``, else ``_INBOX``.
            prefix: subject prefix of the installation (default ``$SANDPOD_PREFIX``/``sandpod``).
            bus: share an existing connection instead of opening one (not closed by ``close``).

        Raises:
            ConnectionLost: NATS is unreachable.
        """
        validate_sandbox_id(sandbox_id)
        subjects = Subjects(resolve_prefix(prefix), tenant=resolve_tenant(tenant))
        if bus is not None:
            return cls(bus, sandbox_id, subjects, owns_bus=False)
        settings = BusSettings(
            url=resolve_nats_url(nats_url),
            name=f"sandpod-sdk:{sandbox_id}",
            connect_timeout=connect_timeout,
            creds=resolve_nats_creds(nats_creds),
            inbox_prefix=resolve_inbox_prefix(inbox_prefix),
        )
        return cls(await Bus.connect(settings), sandbox_id, subjects, owns_bus=True)

    @classmethod
    async def create(
        cls,
        template: str | None = None,
        *,
        name: str | None = None,
        timeout: float | None = None,
        permanent: bool = False,
        idle_timeout: int | None = None,
        labels: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        network: Mapping[str, Any] | None = None,
        snapshot: str | None = None,
        idle_policy: str | None = None,
        volumes: Sequence[VolumeMount | str] = (),
        wait: float = 60.0,
        nats_url: str | None = None,
        prefix: str | None = None,
    ) -> AsyncSandbox:
        """Create a sandbox through the lifecycle service and return it once it is Ready.

        Args:
            template: SandboxTemplate name (default: the built-in template).
            name: sandbox id (default: generated).
            timeout: lifetime in seconds (default: the template's; ``permanent`` opts out).
            idle_timeout: expire after this many seconds without activity (0 disables).
            labels: labels to select it by later (``list(labels=...)``).
            env: environment for its commands.
            network: its own egress policy (default: the template's), e.g.
                ``{"mode": "allowlist", "allow": ["api.example.com:443"]}`` (see ``sbx.network``).
            snapshot: start from this SandboxSnapshot's files (see :meth:`snapshot`); its
                template is the default ``template``.
            idle_policy: what ``idle_timeout`` means: ``"Delete"`` or ``"Hibernate"`` (its
                files kept, processes stopped, memory freed; the next call wakes it and is
                answered once it runs again); default: the template's.
            volumes: SandboxVolumes to mount: ``VolumeMount("data", "/data", read_only=True)``
                or ``"data:/data:ro"`` (see :mod:`sandpod.volumes`).
            wait: seconds to wait for Ready.

        Raises:
            ResourceInvalid: bad arguments or unknown template or volume.
            VolumeInUse: a volume is held by another sandbox (named) in a conflicting mode.
            SandboxError: the sandbox failed to start (the reason is in the message), or no
                lifecycle service answers.
        """
        sbx = await cls.connect("default", nats_url=nats_url, prefix=prefix)
        try:
            obj = create_object(
                name=name,
                template=template,
                timeout=timeout,
                permanent=permanent,
                idle_timeout=idle_timeout,
                labels=labels,
                env=env,
                network=network,
                snapshot=snapshot,
                idle_policy=idle_policy,
                volumes=volumes,
            )
            info = await create_sandbox(sbx.bus, sbx.subjects, obj, wait=wait)
        except BaseException:
            await sbx.close()
            raise
        return cls(sbx.bus, info.name, sbx.subjects, owns_bus=True)

    @classmethod
    async def claim(
        cls,
        pool: str | None = None,
        *,
        template: str | None = None,
        timeout: float | None = None,
        idle_timeout: int | None = None,
        labels: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        name: str | None = None,
        wait: float = 60.0,
        nats_url: str | None = None,
        prefix: str | None = None,
        bus: Bus | None = None,
    ) -> AsyncSandbox:
        """Claim a ready sandbox from warm pool ``pool`` (or a cold one of ``template``).

        Returns as soon as the sandbox is bound and ready: from a warm pool in milliseconds;
        when the pool has no free member, after a cold create (``claim_info.bound_reason`` is
        then ``PoolExhausted``). ``timeout`` is the claim's lifetime in seconds (default: the
        template's), ``env`` the default environment of its commands, ``labels`` are added to
        the sandbox. ``kill()`` or :meth:`release` ends the claim and deletes the sandbox.

        Raises:
            PoolNotFound: no such pool.
            ClaimFailed: the sandbox failed to start (the reason is in the message).
            ClaimTimeout: not ready within ``wait`` seconds (the claim stays and may bind).
            ResourceInvalid: bad arguments or unknown template.
        """
        from sandpod.pools import claim_sandbox  # lazy: pools is a family

        sbx = await cls.connect("default", nats_url=nats_url, prefix=prefix, bus=bus)
        try:
            info, sandbox = await claim_sandbox(
                sbx.bus,
                sbx.subjects,
                pool=pool,
                template=template,
                name=name,
                timeout=timeout,
                idle_timeout=idle_timeout,
                labels=labels,
                env=env,
                wait=wait,
            )
        except BaseException:
            await sbx.close()
            raise
        out = cls(sbx.bus, sandbox, sbx.subjects, owns_bus=bus is None)
        out.claim_info = info
        return out

    async def release(self, wait: float = 30.0) -> None:
        """End this sandbox's claim and delete the sandbox (a sandbox not claimed: ``kill``)."""
        if self.claim_info is None:
            await self.kill(wait)
            return
        ref = Ref(name=self.claim_info.name, namespace=self.claim_info.namespace)
        await api_call(self.bus, self.subjects, "claims", "delete", ref, ObjectReply)

    @classmethod
    async def list(
        cls,
        labels: str | Mapping[str, str] | None = None,
        *,
        nats_url: str | None = None,
        prefix: str | None = None,
    ) -> list[SandboxInfo]:
        """Sandboxes known to the lifecycle service, filtered by a label selector."""
        async with await cls.connect("default", nats_url=nats_url, prefix=prefix) as sbx:
            return await list_sandboxes(sbx.bus, sbx.subjects, labels)

    async def describe(self) -> SandboxInfo:
        """This sandbox's resource: phase, conditions, expiry, last activity."""
        reply = await api_call(
            self.bus, self.subjects, "sandboxes", "get", Ref(name=self.id), ObjectReply
        )
        return SandboxInfo.of(reply.object)

    async def kill(self, wait: float = 30.0) -> None:
        """Delete this sandbox and wait until its instance is gone."""
        await api_call(
            self.bus,
            self.subjects,
            "sandboxes",
            "delete",
            Ref(name=self.id, wait=wait),
            ObjectReply,
            timeout=wait + 10,
        )

    async def renew(self, seconds: float) -> SandboxInfo:
        """Push this sandbox's expiry to now + ``seconds``."""
        reply = await api_call(
            self.bus,
            self.subjects,
            "sandboxes",
            "renew",
            Renew(name=self.id, seconds=seconds),
            ObjectReply,
        )
        return SandboxInfo.of(reply.object)

    async def pause(self, wait: float = 30.0) -> SandboxInfo:
        """Freeze the sandbox's processes (they continue on resume); returns once Paused, or
        after ``wait`` seconds with the phase it has then."""
        ref = Ref(name=self.id, wait=wait)
        reply = await api_call(
            self.bus, self.subjects, "sandboxes", "pause", ref, ObjectReply, timeout=wait + 10
        )
        return SandboxInfo.of(reply.object)

    async def resume(self, wait: float = 30.0) -> SandboxInfo:
        """Thaw the sandbox; returns once Running (or after ``wait`` seconds)."""
        ref = Ref(name=self.id, wait=wait)
        reply = await api_call(
            self.bus, self.subjects, "sandboxes", "resume", ref, ObjectReply, timeout=wait + 10
        )
        return SandboxInfo.of(reply.object)

    async def expose(
        self,
        port: int,
        *,
        public: bool = False,
        ttl: float | None = None,
        gateway: str | None = None,
        api_key: str | None = None,
    ) -> Preview:
        """Preview URLs of ``port`` through the gateway: a signed link valid ``ttl`` seconds
        (the gateway's default: an hour), or, with ``public=True``, a URL anyone may open until
        :meth:`unexpose`. ``gateway``/``api_key``: default ``$SANDPOD_GATEWAY_URL`` /
        ``$SANDPOD_API_KEY``, else a local ``sandpod up``'s
        (:func:`sandpod.preview.resolve_gateway`).

        Raises:
            BadRequest: no gateway or key configured, or a bad port or ttl.
            SandboxNotFound: the key's tenant has no such sandbox.
        """
        from sandpod.preview import create_preview, resolve_gateway

        gw = resolve_gateway(gateway, api_key)
        return await create_preview(gw, self.id, port, public=public, ttl=ttl)

    async def url(
        self,
        port: int,
        *,
        ttl: float | None = None,
        gateway: str | None = None,
        api_key: str | None = None,
    ) -> str:
        """A signed preview URL of ``port`` (path form), valid ``ttl`` seconds."""
        return (await self.expose(port, ttl=ttl, gateway=gateway, api_key=api_key)).url

    async def unexpose(
        self, port: int, *, gateway: str | None = None, api_key: str | None = None
    ) -> None:
        """Make ``port`` private again (signed links keep working until they expire)."""
        from sandpod.preview import remove_preview, resolve_gateway

        await remove_preview(resolve_gateway(gateway, api_key), self.id, port)

    def events(self) -> AsyncIterator[SandboxEvent]:
        """Live lifecycle events of this sandbox (created, ready, paused, expired, ...)."""
        return follow_events(self.bus, self.subjects, self.id, "sandbox", SandboxEvent)

    async def close(self) -> None:
        if self._owns_bus:
            await self.bus.drain()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    # -- sys -----------------------------------------------------------------------------------

    async def ping(self, timeout: float = CONTROL_TIMEOUT) -> float:
        """Round-trip time to the sandbox's execd in seconds."""
        t0 = time.perf_counter()
        await self.channel.call("sys", "ping", Empty(), Pong, timeout)
        return time.perf_counter() - t0

    async def info(self) -> SandboxInfo:
        """This sandbox as a resource: phase, conditions (``Isolated`` says which protections
        are active), expiry, idle timeout, last activity (the same as :meth:`describe`).

        Raises:
            ResourceNotFound: no lifecycle service knows it (a bare execd: see
                :meth:`runtime_info`).
        """
        return await self.describe()

    async def runtime_info(self, timeout: float = CONTROL_TIMEOUT) -> Info:
        """What the sandbox's execd says of itself: runtime, isolation, limits, workspace path.
        Answered by the sandbox itself, so it works without a lifecycle service too."""
        return await self.channel.call("sys", "info", Empty(), Info, timeout)

    async def metrics(self, timeout: float = CONTROL_TIMEOUT) -> SandboxMetrics:
        """What the sandbox uses now: CPU, memory, workspace disk, processes, running execs.

        A probe: it does not count as activity. Memory and load ``host`` fields describe the
        machine; ``disk_complete=False`` means the workspace walk hit its bound.
        """
        return await self.channel.call("sys", "metrics", Empty(), SandboxMetrics, timeout)

    async def activity(self, timeout: float = CONTROL_TIMEOUT) -> Activity:
        """When a client last did something with the sandbox (probes like this one do not count).

        Returns:
            ``Activity`` with ``last_activity`` (wall clock) and ``idle`` (seconds since).
        """
        return await self.channel.call("sys", "activity", Empty(), Activity, timeout)

    # -- exec ----------------------------------------------------------------------------------

    async def exec(
        self,
        cwd_or_command: str | Command | None,
        command: Command | None = None,
        /,
        *,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        max_output: int | None = None,
        check: bool = False,
    ) -> ExecResult:
        """Run a command to completion: ``exec("/workspace", "date")`` or ``exec(["ls", "-l"])``.

        Args:
            cwd: working directory (default: the workspace); first of two positionals.
            command: a shell string (run by the sandbox's shell) or an argv sequence.
            env: variables added to the sandbox's environment.
            stdin: bytes (or str) fed to the command, then EOF.
            timeout: seconds before execd kills the whole process tree (``None``: no limit);
                the result then has ``timed_out=True``.
            max_output: per-stream capture cap in bytes (beyond it: ``*_truncated``).
            check: raise :class:`CommandFailed` unless the command exited 0.

        Raises:
            SandboxNotFound, SandboxUnavailable, ExecLost: execd absent or lost mid-request.
            CommandNotFound, InvalidCwd, SpawnFailed: the command could not start.
            ArgvExpected: ``exec("ls", "-l")``: a program and its arguments given as
                ``(cwd, command)``; the message shows the argv form ``exec(["ls", "-l"])``.
            BadRequest: invalid arguments.
        """
        return await run_exec(
            self.channel,
            cwd_or_command,
            command,
            env=env,
            stdin=stdin,
            timeout=timeout,
            max_output=max_output,
            check=check,
        )

    def exec_stream(
        self,
        cwd_or_command: str | Command | None,
        command: Command | None = None,
        /,
        *,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        stdin_open: bool = False,
        timeout: float | None = None,
        window: int | None = None,
        abandon_after: float | None = None,
    ) -> AsyncExecStream:
        """Start a streaming exec; iterate it for :class:`OutputChunk` s, then ``await .wait()``.

        Args:
            cwd_or_command, command: as for :meth:`exec`.
            env: variables added to the sandbox's environment.
            stdin: initial stdin bytes (then EOF, unless ``stdin_open``).
            stdin_open: keep stdin open for :meth:`AsyncExecStream.write`/``close_stdin``.
            timeout: seconds before the whole tree is killed (default: no limit).
            window: bytes execd may have in flight unacknowledged (default from execd).
            abandon_after: seconds of client silence (no acks or keepalives) before execd kills
                the command; the SDK sends keepalives while the stream is open: until the
                ``async with`` block ends or, without one, until the iteration stops (leaving
                an ``async for`` early closes the stream and cancels the command).
        """
        return open_exec_stream(
            self.channel,
            cwd_or_command,
            command,
            env=env,
            stdin=stdin,
            stdin_open=stdin_open,
            timeout=timeout,
            window=window,
            abandon_after=abandon_after,
        )
