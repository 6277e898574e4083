"""The async client of long-lived shell sessions (``sbx.sessions``); blocking twins: ``sync``.

A session is a real bash in the sandbox: ``cd``, ``export``, variables, functions and aliases
set by one ``run`` are there for the next. Commands of one session run one at a time in the
order sent; sessions run in parallel. A timeout ends the command, never the session.

    async with await sbx.sessions.create("build", cwd="/workspace") as sh:
        await sh.run("cd src && export CI=1")
        r = await sh.run("make test", timeout=600)
        print(r.exit_code, r.stdout, r.cwd)
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal, Self, TypeVar

from sandpod.channel import CONTROL_TIMEOUT, DEFAULT_TIMEOUT, NO_DEADLINE
from sandpod.errors import CommandFailed
from sandpod.session.types import SessionInfo, SessionResult
from sandpod_client.liveness import watch
from sandpod_contract.codec import Message
from sandpod_contract.errors import SandpodError, SessionNotFound
from sandpod_contract.messages.common import Empty
from sandpod_contract.messages.exec import ExecStatus
from sandpod_contract.messages.session import (
    SessionCommandRef,
    SessionCreate,
    SessionFetch,
    SessionListing,
    SessionOutputPart,
    SessionRef,
    SessionRun,
)
from sandpod_contract.messages.session import SessionInfo as WireInfo
from sandpod_contract.messages.session import SessionResult as WireResult

if TYPE_CHECKING:
    from types import TracebackType

    from sandpod.channel import Channel

__all__ = ["AsyncSession", "AsyncSessions"]

R = TypeVar("R", bound=Message)


class AsyncSessions:
    """``sbx.sessions``: create, find, list and delete shell sessions; run commands in them."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel

    async def _call(self, verb: str, msg: Message, reply: type[R], timeout: float) -> R:
        return await self._channel.call("session", verb, msg, reply, timeout)

    async def create(
        self,
        session_id: str | None = None,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> AsyncSession:
        """Start a shell (replacing a dead session of the same id).

        Raises:
            SessionAlreadyExists: a live session has this id.
            Busy: the sandbox has as many sessions as it allows.
            InvalidCwd, SpawnFailed: the shell could not start.
        """
        req = SessionCreate(session_id=session_id, cwd=cwd, env=dict(env) if env else None)
        info = await self._call("create", req, WireInfo, CONTROL_TIMEOUT * 3)
        return AsyncSession(self, SessionInfo._from_wire(info))

    async def get(self, session_id: str) -> AsyncSession:
        """A handle on an existing session. Raises SessionNotFound."""
        return AsyncSession(self, await self.status(session_id))

    async def list(self) -> list[SessionInfo]:
        """This sandbox's sessions, oldest first (dead ones included until deleted)."""
        listing = await self._call("list", Empty(), SessionListing, CONTROL_TIMEOUT)
        return [SessionInfo._from_wire(s) for s in listing.sessions]

    async def status(self, session_id: str) -> SessionInfo:
        """Where ``session_id`` stands. Raises SessionNotFound."""
        info = await self._call(
            "status", SessionRef(session_id=session_id), WireInfo, CONTROL_TIMEOUT
        )
        return SessionInfo._from_wire(info)

    async def delete(self, session_id: str) -> SessionInfo:
        """Kill the shell and everything it started; queued commands come back cancelled."""
        info = await self._call("delete", SessionRef(session_id=session_id), WireInfo, 15.0)
        return SessionInfo._from_wire(info)

    async def cancel(self, session_id: str, command_id: str) -> SessionInfo:
        """End a running (like Ctrl-C, but sure) or queued command; the session stays."""
        req = SessionCommandRef(session_id=session_id, command_id=command_id)
        return SessionInfo._from_wire(await self._call("cancel", req, WireInfo, CONTROL_TIMEOUT))

    async def run(
        self,
        session_id: str,
        command: str,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        stdin: bytes | str | None = None,
        max_output: int | None = None,
        check: bool = False,
        command_id: str | None = None,
    ) -> SessionResult:
        """Run ``command`` in the session's shell and return its own output and status.

        Args:
            command: one or more lines of shell, sourced by the session's bash.
            timeout: seconds (from when it starts, not while queued) before the command, and
                only the command, is ended; ``None``: no limit.
            stdin: bytes (or str) fed to the command, then EOF (default ``/dev/null``).
            max_output: per-stream capture cap in bytes (beyond it: ``*_truncated``).
            check: raise :class:`CommandFailed` unless it exited 0.
            command_id: your id for it (for :meth:`cancel`); a random one otherwise.

        Raises:
            SessionNotFound, SessionDead: no such session, or its shell exited.
            SandboxUnavailable, ExecLost: execd went away while the command ran.
        """
        command_id = command_id or uuid.uuid4().hex
        req = SessionRun(
            session_id=session_id,
            command=command,
            command_id=command_id,
            timeout=timeout,
            stdin=stdin.encode() if isinstance(stdin, str) else stdin,
            max_output=max_output,
        )

        async def probe() -> ExecStatus:
            info = await self.status(session_id)
            busy = info.state == "busy" or info.queued > 0
            return ExecStatus(exec_id=command_id, state="running" if busy else "exited")

        try:
            wire = await watch(
                self._call("run", req, WireResult, NO_DEADLINE),
                probe,
                what=f"session {session_id!r} command {command_id}",
            )
        except asyncio.CancelledError:
            # The caller gave up (task cancelled, Ctrl-C in the sync SDK): end the command.
            with contextlib.suppress(SandpodError):
                await asyncio.shield(self.cancel(session_id, command_id))
            raise
        result = SessionResult(
            session_id=wire.session_id,
            command_id=wire.command_id,
            exit_code=wire.exit_code,
            stdout_bytes=await self._rest(wire, "stdout", wire.stdout, wire.stdout_size),
            stderr_bytes=await self._rest(wire, "stderr", wire.stderr, wire.stderr_size),
            stdout_truncated=wire.stdout_truncated,
            stderr_truncated=wire.stderr_truncated,
            timed_out=wire.timed_out,
            cancelled=wire.cancelled,
            shell_exited=wire.shell_exited,
            duration=wire.duration,
            cwd=wire.cwd,
        )
        if check and not result.ok:
            raise CommandFailed(
                f"command exited with {result.exit_code}",
                exit_code=result.exit_code,
                timed_out=result.timed_out,
            )
        return result

    async def _rest(
        self, wire: WireResult, stream: Literal["stdout", "stderr"], head: bytes, size: int
    ) -> bytes:
        """Fetch the part of a stream that did not fit in the reply."""
        parts, offset = [head], len(head)
        while offset < size:
            req = SessionFetch(
                session_id=wire.session_id, command_id=wire.command_id, stream=stream, offset=offset
            )
            part = await self._call("fetch", req, SessionOutputPart, CONTROL_TIMEOUT)
            parts.append(part.data)
            offset += len(part.data)
            if part.eof or not part.data:
                break
        return b"".join(parts)


class AsyncSession:
    """A handle on one session; ``async with`` deletes it on exit."""

    def __init__(self, sessions: AsyncSessions, info: SessionInfo) -> None:
        self._sessions = sessions
        self.info = info

    @property
    def id(self) -> str:
        return self.info.session_id

    def __repr__(self) -> str:
        return f"<AsyncSession {self.id!r} pid={self.info.pid} {self.info.state}>"

    async def run(
        self,
        command: str,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        stdin: bytes | str | None = None,
        max_output: int | None = None,
        check: bool = False,
        command_id: str | None = None,
    ) -> SessionResult:
        """Run ``command`` in this session (see :meth:`AsyncSessions.run`)."""
        return await self._sessions.run(
            self.id,
            command,
            timeout=timeout,
            stdin=stdin,
            max_output=max_output,
            check=check,
            command_id=command_id,
        )

    async def status(self) -> SessionInfo:
        """Where this session stands."""
        self.info = await self._sessions.status(self.id)
        return self.info

    async def cancel(self, command_id: str) -> SessionInfo:
        """End a running or queued command of this session; the session stays."""
        self.info = await self._sessions.cancel(self.id, command_id)
        return self.info

    async def delete(self) -> SessionInfo:
        """Kill the shell and everything it started."""
        self.info = await self._sessions.delete(self.id)
        return self.info

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        with contextlib.suppress(SessionNotFound):
            await self.delete()
