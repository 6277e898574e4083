"""The asynchronous SDK: :class:`AsyncSandbox` and :class:`AsyncExecStream`.

Every call is one NATS request on the sandbox's own subjects, answered by its execd; nothing goes
through a control plane. Errors arrive as the contract's typed exceptions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import Self, TypeVar

from sandpod._watch import watch
from sandpod.config import resolve_nats_creds, resolve_nats_url, resolve_prefix
from sandpod.control import SandboxInfo, api_call, create_object, follow_events
from sandpod.exec_args import (
    CONTROL_TIMEOUT,
    DEFAULT_TIMEOUT,
    NO_DEADLINE,
    REPLY_SLACK,
    Command,
    check_result,
    cwd_and_command,
    split_command,
)
from sandpod.fs import AsyncFiles
from sandpod.git import AsyncGit
from sandpod.pools import ClaimInfo, claim_object
from sandpod.proc import AsyncProcesses
from sandpod.pty import AsyncPtys
from sandpod.results import ExecResult, ExitStatus, OutputChunk
from sandpod.session import AsyncSessions
from sandpod.watch import AsyncWatches
from sandpod_bus import Bus, BusSettings, Inbound, Subscription
from sandpod_contract.codec import Message, decode_map, decode_reply, encode, unpack
from sandpod_contract.errors import (
    ConnectionLost,
    ExecLost,
    ExecNotFound,
    RequestTimeout,
    SandboxError,
    SandboxNotFound,
    SandboxUnavailable,
    SandpodError,
    StreamClosed,
)
from sandpod_contract.messages.common import Empty
from sandpod_contract.messages.exec import (
    ExecExit,
    ExecFetch,
    ExecRef,
    ExecRequest,
    ExecResume,
    ExecSignal,
    ExecStart,
    ExecStarted,
    ExecStatus,
    OutputPart,
    StdinWrite,
    StreamAck,
)
from sandpod_contract.messages.exec import (
    ExecResult as WireResult,
)
from sandpod_contract.messages.exec import (
    OutputChunk as WireChunk,
)
from sandpod_contract.messages.sandboxes import (
    ObjectReply,
    ObjectRequest,
    ObjectsReply,
    Ref,
    Renew,
    SandboxEvent,
    Selection,
)
from sandpod_contract.messages.system import Activity, Info, Pong, SandboxMetrics
from sandpod_contract.subjects import Subjects, validate_sandbox_id

__all__ = ["AsyncExecStream", "AsyncSandbox", "Command"]

log = logging.getLogger("sandpod")

R = TypeVar("R", bound=Message)

STDIN_CHUNK = 256 * 1024


class AsyncSandbox:
    """A handle on one sandbox. Create with :meth:`connect`; close with :meth:`close`."""

    def __init__(self, bus: Bus, sandbox_id: str, subjects: Subjects, *, owns_bus: bool) -> None:
        self.bus = bus
        self.id = validate_sandbox_id(sandbox_id)
        self.subjects = subjects
        self._owns_bus = owns_bus
        self.fs = AsyncFiles(self)
        self.proc = AsyncProcesses(self)
        self.sessions = AsyncSessions(self)
        self.pty = AsyncPtys(self)
        self.watch = AsyncWatches(self)
        self.git = AsyncGit(self)
        self.claim_info: ClaimInfo | None = None  # set when this sandbox came from a claim

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
    ) -> AsyncSandbox:
        """Connect to sandbox ``sandbox_id``.

        Args:
            nats_url: NATS URL(s); default ``$SANDPOD_NATS_URL``, ``$NATS_URL``, localhost.
            nats_creds: creds file for a NATS in operator mode; default ``$SANDPOD_NATS_CREDS``.
            prefix: subject prefix of the installation (default ``$SANDPOD_PREFIX``/``sandpod``).
            bus: share an existing connection instead of opening one (not closed by ``close``).

        Raises:
            ConnectionLost: NATS is unreachable.
        """
        validate_sandbox_id(sandbox_id)
        subjects = Subjects(resolve_prefix(prefix))
        if bus is not None:
            return cls(bus, sandbox_id, subjects, owns_bus=False)
        settings = BusSettings(
            url=resolve_nats_url(nats_url),
            name=f"sandpod-sdk:{sandbox_id}",
            connect_timeout=connect_timeout,
            creds=resolve_nats_creds(nats_creds),
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
            wait: seconds to wait for Ready.

        Raises:
            ResourceInvalid: bad arguments or unknown template.
            SandboxError: the sandbox failed to start (the reason is in the message), or no
                lifecycle service answers.
        """
        sbx = await cls.connect("default", nats_url=nats_url, prefix=prefix)
        try:
            obj = create_object(name=name, template=template, timeout=timeout,
                                permanent=permanent, idle_timeout=idle_timeout, labels=labels,
                                env=env)  # fmt: skip
            reply = await api_call(sbx.bus, sbx.subjects, "sandboxes", "create",
                                   ObjectRequest(object=obj, wait_ready=wait), ObjectReply,
                                   timeout=wait + 10)  # fmt: skip
            info = SandboxInfo.of(reply.object)
            if not info.ready:
                failed = info.condition("Failed") or info.condition("Ready") or {}
                raise SandboxError(
                    f"sandbox {info.name} is {info.phase or 'not ready'}: "
                    f"{failed.get('reason', '')} {failed.get('message', '')}".strip(),
                    sandbox_id=info.name,
                )
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
        sbx = await cls.connect("default", nats_url=nats_url, prefix=prefix, bus=bus)
        try:
            obj = claim_object(pool=pool, template=template, name=name, timeout=timeout,
                               idle_timeout=idle_timeout, labels=labels, env=env)  # fmt: skip
            reply = await api_call(sbx.bus, sbx.subjects, "claims", "create",
                                   ObjectRequest(object=obj, wait_ready=wait), ObjectReply,
                                   timeout=wait + 10)  # fmt: skip
            info = ClaimInfo.of(reply.object)
            if info.sandbox is None:  # a bound claim always names one: a server bug otherwise
                raise SandboxError(f"claim {info.name} replied without a sandbox")
        except BaseException:
            await sbx.close()
            raise
        out = cls(sbx.bus, info.sandbox, sbx.subjects, owns_bus=bus is None)
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
            selector = labels if isinstance(labels, str) or labels is None else ",".join(
                f"{k}={v}" for k, v in labels.items()
            )  # fmt: skip
            reply = await api_call(sbx.bus, sbx.subjects, "sandboxes", "list",
                                   Selection(selector=selector), ObjectsReply)  # fmt: skip
        return [SandboxInfo.of(o) for o in reply.items]

    async def describe(self) -> SandboxInfo:
        """This sandbox's resource: phase, conditions, expiry, last activity."""
        reply = await api_call(self.bus, self.subjects, "sandboxes", "get", Ref(name=self.id),
                               ObjectReply)  # fmt: skip
        return SandboxInfo.of(reply.object)

    async def kill(self, wait: float = 30.0) -> None:
        """Delete this sandbox and wait until its instance is gone."""
        await api_call(self.bus, self.subjects, "sandboxes", "delete",
                       Ref(name=self.id, wait=wait), ObjectReply, timeout=wait + 10)  # fmt: skip

    async def renew(self, seconds: float) -> SandboxInfo:
        """Push this sandbox's expiry to now + ``seconds``."""
        reply = await api_call(self.bus, self.subjects, "sandboxes", "renew",
                               Renew(name=self.id, seconds=seconds), ObjectReply)  # fmt: skip
        return SandboxInfo.of(reply.object)

    async def pause(self, wait: float = 30.0) -> SandboxInfo:
        """Freeze the sandbox's processes (they continue on resume); returns once Paused, or
        after ``wait`` seconds with the phase it has then."""
        ref = Ref(name=self.id, wait=wait)
        reply = await api_call(self.bus, self.subjects, "sandboxes", "pause", ref, ObjectReply,
                               timeout=wait + 10)  # fmt: skip
        return SandboxInfo.of(reply.object)

    async def resume(self, wait: float = 30.0) -> SandboxInfo:
        """Thaw the sandbox; returns once Running (or after ``wait`` seconds)."""
        ref = Ref(name=self.id, wait=wait)
        reply = await api_call(self.bus, self.subjects, "sandboxes", "resume", ref, ObjectReply,
                               timeout=wait + 10)  # fmt: skip
        return SandboxInfo.of(reply.object)

    def events(self) -> AsyncIterator[SandboxEvent]:
        """Live lifecycle events of this sandbox (created, ready, paused, expired, ...)."""
        return follow_events(self.bus, self.subjects, self.id)

    async def close(self) -> None:
        if self._owns_bus:
            await self.bus.drain()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    # -- plumbing ------------------------------------------------------------------------------

    def _subject(self, family: str, verb: str) -> str:
        return self.subjects.sandbox(self.id, family, verb)

    async def _call(
        self, family: str, verb: str, msg: Message, reply: type[R], timeout: float
    ) -> R:
        try:
            data = await self.bus.request(self._subject(family, verb), encode(msg), timeout)
        except SandboxNotFound as exc:
            raise SandboxNotFound(
                f"sandbox {self.id!r} has no execd answering; is it running (`sandpod up`)?",
                sandbox_id=self.id,
            ) from exc
        return decode_reply(reply, data)

    # -- sys -----------------------------------------------------------------------------------

    async def ping(self, timeout: float = CONTROL_TIMEOUT) -> float:
        """Round-trip time to the sandbox's execd in seconds."""
        t0 = time.perf_counter()
        await self._call("sys", "ping", Empty(), Pong, timeout)
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
        return await self._call("sys", "info", Empty(), Info, timeout)

    async def metrics(self, timeout: float = CONTROL_TIMEOUT) -> SandboxMetrics:
        """What the sandbox uses now: CPU, memory, workspace disk, processes, running execs.

        A probe: it does not count as activity. Memory and load ``host`` fields describe the
        machine; ``disk_complete=False`` means the workspace walk hit its bound.
        """
        return await self._call("sys", "metrics", Empty(), SandboxMetrics, timeout)

    async def activity(self, timeout: float = CONTROL_TIMEOUT) -> Activity:
        """When a client last did something with the sandbox (probes like this one do not count).

        Returns:
            ``Activity`` with ``last_activity`` (wall clock) and ``idle`` (seconds since).
        """
        return await self._call("sys", "activity", Empty(), Activity, timeout)

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
            BadRequest: invalid arguments.
        """
        cwd, command = cwd_and_command(cwd_or_command, command)
        argv, shell = split_command(command)
        data = stdin.encode() if isinstance(stdin, str) else stdin
        if data is not None and len(data) > self.bus.max_payload // 2:
            return await self._exec_via_stream(
                cwd,
                command,
                env=env,
                stdin=data,
                timeout=timeout,
                max_output=max_output,
                check=check,
            )
        exec_id = uuid.uuid4().hex
        req = ExecRequest(
            exec_id=exec_id,
            argv=argv,
            shell=shell,
            cwd=cwd,
            env=dict(env) if env else None,
            stdin=data,
            timeout=timeout,
            max_output=max_output,
        )
        deadline = timeout + REPLY_SLACK if timeout else NO_DEADLINE
        try:
            wire = await watch(
                self._call("exec", "run", req, WireResult, deadline),
                lambda: self._status(exec_id),
                what=f"exec {exec_id}",
            )
        except asyncio.CancelledError:
            # The caller gave up (task cancelled, Ctrl-C in the sync SDK): do not leave the
            # command running in the sandbox.
            await asyncio.shield(self._cancel_quietly(exec_id))
            raise
        stdout = await self._complete(wire, "stdout", wire.stdout, wire.stdout_size)
        stderr = await self._complete(wire, "stderr", wire.stderr, wire.stderr_size)
        result = ExecResult(
            exec_id=wire.exec_id,
            exit_code=wire.exit_code,
            signal=wire.signal,
            stdout_bytes=stdout,
            stderr_bytes=stderr,
            stdout_truncated=wire.stdout_truncated,
            stderr_truncated=wire.stderr_truncated,
            timed_out=wire.timed_out,
            duration=wire.duration,
        )
        if check:
            check_result(result)
        return result

    async def _complete(self, wire: WireResult, stream: str, head: bytes, size: int) -> bytes:
        """Fetch the part of the output that did not fit in the reply."""
        parts = [head]
        offset = len(head)
        while offset < size:
            req = ExecFetch(exec_id=wire.exec_id, stream=stream, offset=offset)  # type: ignore[arg-type]
            part = await self._call("exec", "fetch", req, OutputPart, CONTROL_TIMEOUT)
            if not part.data:
                break
            parts.append(part.data)
            offset += len(part.data)
            if part.eof:
                break
        return b"".join(parts)

    async def _exec_via_stream(
        self,
        cwd: str | None,
        command: Command,
        *,
        env: Mapping[str, str] | None,
        stdin: bytes,
        timeout: float | None,
        max_output: int | None,
        check: bool,
    ) -> ExecResult:
        """A one-shot exec whose stdin is too large for one message: stream it in."""
        cap = max_output if max_output is not None else 16 * 1024 * 1024
        out: list[bytes] = []
        err: list[bytes] = []
        sizes = {"stdout": 0, "stderr": 0}
        async with self.exec_stream(cwd, command, env=env, stdin_open=True, timeout=timeout) as st:
            feeder = asyncio.create_task(st._feed_all(stdin))
            try:
                async for chunk in st:
                    room = cap - sizes[chunk.stream]
                    if room > 0:
                        (out if chunk.stream == "stdout" else err).append(chunk.data[:room])
                    sizes[chunk.stream] += len(chunk.data)
            finally:
                feeder.cancel()
                await asyncio.gather(feeder, return_exceptions=True)
            status = await st.wait()
        result = ExecResult(
            exec_id=status.exec_id,
            exit_code=status.exit_code,
            signal=status.signal,
            stdout_bytes=b"".join(out),
            stderr_bytes=b"".join(err),
            stdout_truncated=sizes["stdout"] > cap,
            stderr_truncated=sizes["stderr"] > cap,
            timed_out=status.timed_out,
            duration=status.duration,
        )
        if check:
            check_result(result)
        return result

    async def _cancel_quietly(self, exec_id: str) -> None:
        with contextlib.suppress(SandpodError):
            await self._call("exec", "cancel", ExecRef(exec_id=exec_id), ExecStatus, 2.0)

    async def _status(self, exec_id: str) -> ExecStatus:
        return await self._call(
            "exec", "status", ExecRef(exec_id=exec_id), ExecStatus, CONTROL_TIMEOUT
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
        cwd, command = cwd_and_command(cwd_or_command, command)
        return AsyncExecStream(
            self,
            cwd,
            command,
            env=env,
            stdin=stdin,
            stdin_open=stdin_open,
            timeout=timeout,
            window=window,
            abandon_after=abandon_after,
        )


class AsyncExecStream:
    """A running streaming exec: async-iterate for output, then :meth:`wait` for the exit.

    Who owns the remote command: ``async with`` keeps it (and the keepalives that stop execd
    from abandoning it) until the block ends. Without ``async with``, the iteration owns it:
    leaving an ``async for`` early (``break``, an exception, the iterator collected) closes the
    stream, which cancels a command still running, so nothing keeps acking a stream nobody reads.
    """

    def __init__(
        self,
        sandbox: AsyncSandbox,
        cwd: str | None,
        command: Command,
        *,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        stdin_open: bool = False,
        timeout: float | None = None,
        window: int | None = None,
        abandon_after: float | None = None,
        probe_interval: float = 1.0,
    ) -> None:
        argv, shell = split_command(command)
        self._sbx = sandbox
        self._bus = sandbox.bus
        self._exec_id = uuid.uuid4().hex
        self._inbox = self._bus.new_inbox()
        self._request = ExecStart(
            deliver=self._inbox,
            exec_id=self._exec_id,
            argv=argv,
            shell=shell,
            cwd=cwd,
            env=dict(env) if env else None,
            stdin=stdin.encode() if isinstance(stdin, str) else stdin,
            stdin_open=stdin_open,
            timeout=timeout,
            window=window,
            abandon_after=abandon_after,
        )
        self._abandon_after = abandon_after or 60.0
        self._probe_interval = probe_interval
        # Bounded by the protocol: execd never has more than `window` unacked bytes in flight.
        self._frames: asyncio.Queue[WireChunk | ExecExit | SandpodError] = asyncio.Queue()
        self._expected = 1
        self._consumed = 0  # highest seq handed to the user
        self._unacked_bytes = 0
        self._resume_asked_for = 0
        self._window = 0
        self._sub: Subscription | None = None
        self._keepalive: asyncio.Task[None] | None = None
        self._exit: ExitStatus | None = None
        self._started = False
        self._closed = False
        self._managed = False  # inside ``async with``: the block, not an iteration, closes it
        self.pid: int | None = None

    @property
    def exec_id(self) -> str:
        return self._exec_id

    @property
    def exit(self) -> ExitStatus | None:
        """The exit status once the stream ended, else ``None``."""
        return self._exit

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> Self:
        """Start the command (implicit on first iteration or ``async with``)."""
        if self._started:
            return self
        self._started = True
        self._sub = await self._bus.subscribe(
            self._inbox, self._on_frame, pending_msgs=1 << 20, pending_bytes=256 * 1024 * 1024
        )
        try:
            started = await self._sbx._call(
                "exec", "start", self._request, ExecStarted, CONTROL_TIMEOUT
            )
        except BaseException:
            await self._sub.stop()
            raise
        self.pid = started.pid
        self._window = started.window
        if started.abandon_after:
            self._abandon_after = started.abandon_after
        self._keepalive = asyncio.create_task(self._keep_alive(), name=f"keepalive:{self._exec_id}")
        return self

    async def close(self) -> None:
        """Stop listening; if the command still runs, cancel it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._keepalive is not None:
            self._keepalive.cancel()
            await asyncio.gather(self._keepalive, return_exceptions=True)
        if self._started and self._exit is None:
            with contextlib.suppress(SandpodError):
                await self.cancel()
        if self._sub is not None:
            await self._sub.stop()

    async def __aenter__(self) -> Self:
        self._managed = True
        return await self.start()

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _iteration_ended(self) -> None:
        """An iteration stopped (finished, broken out of, failed, collected): without a context
        manager to do it later, close now, cancelling a command that still runs."""
        if not self._managed:
            await self.close()

    # -- frames --------------------------------------------------------------------------------

    async def _on_frame(self, msg: Inbound) -> None:
        try:
            raw = unpack(msg.data)
            kind = raw.get("kind") if isinstance(raw, dict) else None
            frame: WireChunk | ExecExit = (
                decode_map(ExecExit, raw) if kind == "exit" else decode_map(WireChunk, raw)
            )
        except SandpodError as exc:
            log.warning("dropping malformed frame on %s: %s", msg.subject, exc)
            return
        if frame.exec_id != self._exec_id or frame.seq < self._expected:
            return  # a duplicate after a resume
        if frame.seq > self._expected:
            # Frames were lost (e.g. across a reconnect): ask for them again, once per gap.
            if self._resume_asked_for != self._expected:
                with contextlib.suppress(SandpodError):
                    await self._ask_resume()
            return
        self._expected += 1
        self._frames.put_nowait(frame)

    async def _ask_resume(self) -> ExecStatus:
        self._resume_asked_for = self._expected
        req = ExecResume(exec_id=self._exec_id, from_seq=self._expected, deliver=self._inbox)
        return await self._sbx._call("exec", "resume", req, ExecStatus, CONTROL_TIMEOUT)

    async def _probe(self) -> ExecStatus:
        try:
            return await self._ask_resume()
        except ExecNotFound as exc:
            if self._exit is None:
                raise ExecLost(f"execd no longer knows stream {self._exec_id}") from exc
            raise

    async def _keep_alive(self) -> None:
        """Tell execd we are alive (even while the user is slow) so it does not abandon us."""
        interval = max(self._abandon_after / 4, 0.05)
        while True:
            await asyncio.sleep(interval)
            with contextlib.suppress(SandpodError):
                await self._ack(force=True)

    async def _ack(self, force: bool = False) -> None:
        if not force and self._unacked_bytes < max(self._window // 4, 1):
            return
        self._unacked_bytes = 0
        msg = StreamAck(exec_id=self._exec_id, seq=self._consumed)
        await self._bus.publish(self._sbx._subject("exec", "ack"), encode(msg))

    async def _next_frame(self) -> WireChunk | ExecExit:
        missed = 0
        while True:
            try:
                item = await asyncio.wait_for(self._frames.get(), self._probe_interval)
            except TimeoutError:
                try:
                    await self._probe()
                    missed = 0
                except SandboxNotFound as exc:
                    raise SandboxUnavailable("execd stopped answering during the stream") from exc
                except RequestTimeout as exc:
                    missed += 1
                    if missed >= 3:
                        raise SandboxUnavailable("execd did not answer 3 liveness probes") from exc
                except ConnectionLost:
                    missed += 1
                    if missed >= 30:
                        raise
                continue
            if isinstance(item, SandpodError):
                raise item
            return item

    def __aiter__(self) -> AsyncIterator[OutputChunk]:
        """The chunks until the exit; a generator, so leaving the loop early runs its cleanup
        (at once on ``aclose``, else when the loop collects the abandoned generator)."""
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[OutputChunk]:
        try:
            while True:
                try:
                    chunk = await self.__anext__()
                except StopAsyncIteration:
                    return
                yield chunk
        finally:
            await self._iteration_ended()

    async def __anext__(self) -> OutputChunk:
        if self._exit is not None or self._closed:
            raise StopAsyncIteration
        await self.start()
        frame = await self._next_frame()
        self._consumed = frame.seq
        if isinstance(frame, ExecExit):
            self._exit = ExitStatus(
                exec_id=frame.exec_id,
                exit_code=frame.exit_code,
                signal=frame.signal,
                timed_out=frame.timed_out,
                cancelled=frame.cancelled,
                abandoned=frame.abandoned,
                duration=frame.duration,
                stdout_size=frame.stdout_size,
                stderr_size=frame.stderr_size,
            )
            with contextlib.suppress(SandpodError):
                await self._ack(force=True)
            if self._keepalive is not None:
                self._keepalive.cancel()
            raise StopAsyncIteration
        self._unacked_bytes += len(frame.data)
        await self._ack()
        return OutputChunk(stream=frame.stream, data=frame.data, seq=frame.seq)

    async def wait(self) -> ExitStatus:
        """Consume (and discard) remaining output, then return the exit status."""
        async for _ in self:
            pass
        assert self._exit is not None
        return self._exit

    # -- control -------------------------------------------------------------------------------

    async def write(self, data: bytes | str) -> None:
        """Write to stdin (needs ``stdin_open=True``); returns once execd put it in the pipe."""
        await self.start()
        payload = data.encode() if isinstance(data, str) else data
        for i in range(0, max(len(payload), 1), STDIN_CHUNK):
            await self._stdin(payload[i : i + STDIN_CHUNK], eof=False)

    async def close_stdin(self) -> None:
        """Send EOF on stdin."""
        await self.start()
        await self._stdin(b"", eof=True)

    async def _feed_all(self, data: bytes) -> None:
        await self.write(data)
        await self.close_stdin()

    async def _stdin(self, data: bytes, eof: bool) -> None:
        """One ``exec.stdin`` request. It has no deadline (a command may leave its stdin full
        for as long as it likes), so execd's liveness is probed meanwhile: a dead execd is a
        typed error, not a write that hangs forever.

        Raises:
            StreamClosed: the command exited or closed its stdin.
            SandboxUnavailable, ExecLost: execd died or was replaced during the write.
        """
        req = StdinWrite(exec_id=self._exec_id, data=data, eof=eof)
        try:
            await watch(
                self._sbx._call("exec", "stdin", req, ExecStatus, NO_DEADLINE),
                lambda: self._sbx._status(self._exec_id),
                what=f"a stdin write to exec {self._exec_id}",
                interval=self._probe_interval,
                exit_means_lost=False,
            )
        except ExecNotFound as exc:
            raise StreamClosed("the command has already exited") from exc

    async def signal(self, sig: int) -> None:
        """Send signal ``sig`` to the command's process group."""
        await self.start()
        req = ExecSignal(exec_id=self._exec_id, signal=int(sig))
        with contextlib.suppress(ExecNotFound):
            await self._sbx._call("exec", "signal", req, ExecStatus, CONTROL_TIMEOUT)

    async def cancel(self) -> None:
        """Kill the command's whole tree; the stream then ends with ``cancelled=True``."""
        await self.start()
        req = ExecRef(exec_id=self._exec_id)
        with contextlib.suppress(ExecNotFound):
            await self._sbx._call("exec", "cancel", req, ExecStatus, CONTROL_TIMEOUT)
