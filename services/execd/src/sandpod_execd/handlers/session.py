"""``session``-family handlers (see ``sandpod_contract.messages.session``).

``session.run`` takes its place in the session's queue in ``prepare`` (synchronously, in the
subscription callback), so commands of one session run in the order execd received them even
though each request is served by its own task. Each sandbox has its own
:class:`~sandpod_execd.sessions.SessionTable`; at shutdown every shell is killed.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from pathlib import Path

from sandpod_contract.errors import SessionError
from sandpod_contract.messages.common import Empty
from sandpod_contract.messages.session import (
    SessionCommandRef,
    SessionCreate,
    SessionFetch,
    SessionInfo,
    SessionListing,
    SessionOutputPart,
    SessionRef,
    SessionResult,
    SessionRun,
)
from sandpod_execd import proctree
from sandpod_execd.clientpath import client_path
from sandpod_execd.handlers import Deps, Route
from sandpod_execd.handlers.exec import reply_budget
from sandpod_execd.oneshot import status_fields
from sandpod_execd.process import Command
from sandpod_execd.sandbox import SandboxContext
from sandpod_execd.sessions import Place, Session, SessionLimits, SessionTable, Ticket

__all__ = ["SessionHandlers"]

SESSION_ID_ENV = "SANDPOD_SESSION_ID"
# The sandbox's own /tmp (a private tmpfs in the jail); files go through SessionDir, never by
# a path the sandbox could swap.
JAIL_TMP = "/tmp"  # noqa: S108
CANCEL_STATUS = 130
TIMEOUT_STATUS = 124


class SessionHandlers:
    def __init__(self, deps: Deps, limits: SessionLimits | None = None) -> None:
        self._deps = deps
        self._settings = deps.settings
        self._limits = limits or SessionLimits()
        self._tables: dict[str, SessionTable] = {}
        self._budget = reply_budget(deps.max_payload)

    def routes(self) -> dict[tuple[str, str], Route]:
        return {
            ("session", "create"): Route(self.create),
            ("session", "list"): Route(self.list, inline=True, activity=False),
            ("session", "status"): Route(self.status, inline=True, quiet=True, activity=False),
            ("session", "delete"): Route(self.delete),
            ("session", "run"): Route(
                self.run,
                prepare=self._enqueue,
                release=lambda sbx, prepared: prepared[0].dequeue(prepared[1]),
            ),
            ("session", "cancel"): Route(self.cancel, inline=True),
            ("session", "fetch"): Route(self.fetch),
        }

    async def close(self) -> None:
        """Kill every shell (and what it started) and remove the sessions' files."""
        sessions = [s for table in self._tables.values() for s in table]
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)

    def _table(self, sbx: SandboxContext) -> SessionTable:
        table = self._tables.get(sbx.sandbox_id)
        if table is None:
            table = SessionTable(self._limits, self._settings.result_ttl)
            self._tables[sbx.sandbox_id] = table
        return table

    def _bash(self, sbx: SandboxContext) -> str:
        if Path(sbx.shell).name == "bash":
            return sbx.shell
        if sbx.jail is not None:
            return "/bin/bash"  # not there: session.create fails with exec.command_not_found
        return shutil.which("bash", path=sbx.base_env.get("PATH")) or "/bin/bash"

    # -- verbs ---------------------------------------------------------------------------------

    async def create(self, sbx: SandboxContext, req: SessionCreate) -> SessionInfo:
        table = self._table(sbx)
        session_id = req.session_id or uuid.uuid4().hex[:12]
        # Re-admit after each await: a concurrent create of the same id may have won meanwhile.
        while (old := table.admit(session_id)) is not None:
            table.remove(session_id)
            await old.close()
        token = uuid.uuid4().hex
        env = {**(req.env or {}), SESSION_ID_ENV: session_id, proctree.TOKEN_ENV: token}
        cmd = sbx.command(
            (self._bash(sbx), "--noprofile", "--norc"), None, req.cwd, env, stdin=True
        )
        session = table.spawn(session_id, cmd, token, _place(sbx, cmd, req.cwd))
        self._deps.supervisor.spawn(session.shell.pump(), name=f"session:{session_id}")
        if not await session.shell.start(self._limits.start_timeout):
            table.remove(session_id)
            await session.close()
            raise SessionError(
                f"the shell of session {session_id!r} did not start", session_id=session_id
            )
        return _info(session, sbx.workspace)

    async def list(self, sbx: SandboxContext, _: Empty) -> SessionListing:
        return SessionListing(sessions=tuple(_info(s, sbx.workspace) for s in self._table(sbx)))

    async def status(self, sbx: SandboxContext, req: SessionRef) -> SessionInfo:
        return _info(self._table(sbx).get(req.session_id), sbx.workspace)

    async def delete(self, sbx: SandboxContext, req: SessionRef) -> SessionInfo:
        session = self._table(sbx).remove(req.session_id)
        await session.close()
        return _info(session, sbx.workspace)

    def _enqueue(self, sbx: SandboxContext, req: SessionRun) -> tuple[Session, Ticket]:
        session = self._table(sbx).get(req.session_id)
        return session, session.enqueue(req.command_id or uuid.uuid4().hex)

    async def run(
        self, sbx: SandboxContext, req: SessionRun, session: Session, ticket: Ticket
    ) -> SessionResult:
        outcome = await session.run(ticket, req.command, req.stdin, req.timeout)
        if outcome is None:  # cancelled while queued: it never ran
            return SessionResult(
                session_id=session.session_id, command_id=ticket.command_id, cancelled=True
            )
        max_output = self._settings.output_cap(req.max_output)  # the same ceiling as exec
        out = session.capture(ticket.command_id, outcome, max_output, self._budget)
        exit_code = outcome.status
        if outcome.shell_exited:
            exit_code, _ = status_fields(await session.shell.proc.wait())
        elif outcome.interrupted:
            exit_code = CANCEL_STATUS if ticket.cancelled else TIMEOUT_STATUS
        return SessionResult(
            session_id=session.session_id,
            command_id=ticket.command_id,
            exit_code=exit_code,
            stdout=out.stdout,
            stderr=out.stderr,
            stdout_size=out.stdout_size,
            stderr_size=out.stderr_size,
            stdout_truncated=out.stdout_truncated,
            stderr_truncated=out.stderr_truncated,
            timed_out=outcome.interrupted and not ticket.cancelled,
            cancelled=outcome.interrupted and ticket.cancelled,
            shell_exited=outcome.shell_exited,
            duration=outcome.duration,
            cwd=client_path(sbx.workspace, outcome.cwd) if outcome.cwd else None,
        )

    async def cancel(self, sbx: SandboxContext, req: SessionCommandRef) -> SessionInfo:
        session = self._table(sbx).get(req.session_id)
        if not session.shell.alive:
            raise session.dead_error()
        session.cancel(req.command_id)
        return _info(session, sbx.workspace)

    async def fetch(self, sbx: SandboxContext, req: SessionFetch) -> SessionOutputPart:
        session = self._table(sbx).get(req.session_id)
        size = min(req.max_bytes or self._budget, self._budget)
        try:
            data, eof = session.fetch(req.command_id, req.stream, req.offset, size)
        except KeyError:
            raise SessionError(
                f"no retained output of command {req.command_id!r} (fetched already, expired "
                f"after {self._settings.result_ttl:g}s, or replaced by newer results)",
                session_id=req.session_id,
                command_id=req.command_id,
            ) from None
        return SessionOutputPart(
            session_id=req.session_id,
            command_id=req.command_id,
            stream=req.stream,
            offset=req.offset,
            data=data,
            eof=eof,
        )


def _place(sbx: SandboxContext, cmd: Command, cwd: str | None) -> Place:
    """Jailed, the session's files live in the sandbox's own /tmp, owned by its user, reached
    through the jail's root (resolved by the kernel as the sandbox sees it: a /tmp the sandbox
    turned into a link cannot lead execd to a host directory)."""
    if sbx.jail is None:
        return Place(root=sbx.fs_root, tmp=tempfile.gettempdir(), owner=None, cwd=cmd.cwd)
    jail = sbx.jail
    return Place(root=sbx.fs_root, tmp=JAIL_TMP, owner=jail.owner, cwd=jail.inside(cwd))


def _info(session: Session, workspace: Path) -> SessionInfo:
    """The wire view of ``session``; its cwd as the sandbox sees it (never the host's path)."""
    exit_code = sig = None
    if session.state == "dead" and session.shell.proc.returncode is not None:
        exit_code, sig = status_fields(session.shell.proc.returncode)
    return SessionInfo(
        session_id=session.session_id,
        pid=session.shell.proc.pid,
        state=session.state,
        cwd=client_path(workspace, session.shell.cwd),
        created_at=session.created_at,
        commands=session.commands,
        queued=session.queued,
        running=session.running.command_id if session.running is not None else None,
        exit_code=exit_code,
        signal=sig,
    )
