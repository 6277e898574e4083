"""``pty``-family handlers (see ``sandpod_contract.messages.pty``); the terminals themselves live
in :mod:`sandpod_execd.terminal`.

Ordering: ``open``, ``resize``, ``signal``, ``get`` and ``list`` run inline (in arrival order);
``input`` queues its bytes in ``prepare`` (so inputs are written in arrival order) and its task
only waits until they are in the terminal; ``close`` kills in ``prepare`` (so input sent after a
close never reaches the program) and its task waits for the end; ``read`` is a task (it may wait).

Bounds: at most ``MAX_PTYS`` terminals per sandbox (exited ones are kept ``KEEP_EXITED`` seconds
or until their place is needed), replay buffers of ``MIN_BUFFER``..``MAX_BUFFER`` bytes
(``DEFAULT_BUFFER`` unless asked), at most ``MAX_PENDING_INPUT`` queued input bytes per terminal,
reads of at most one NATS message.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import structlog

from sandpod_contract.errors import BadRequest
from sandpod_contract.messages.common import Empty
from sandpod_contract.messages.pty import (
    PtyInfo,
    PtyInput,
    PtyList,
    PtyOpen,
    PtyOutput,
    PtyRead,
    PtyRef,
    PtyResize,
    PtySignal,
    PtyWritten,
)
from sandpod_execd.clientpath import client_path
from sandpod_execd.handlers import Deps, Route
from sandpod_execd.handlers.exec import reply_budget
from sandpod_execd.ptyspawn import TerminalSpec
from sandpod_execd.sandbox import SandboxContext
from sandpod_execd.streaming import validate_signal
from sandpod_execd.terminal import Terminal, TerminalSet

__all__ = ["DEFAULT_BUFFER", "MAX_BUFFER", "MAX_PTYS", "PtyHandlers"]

log = structlog.get_logger("sandpod.execd.pty")

MAX_PTYS = 32  # per sandbox, running or kept after exit
KEEP_EXITED = 300.0  # seconds an exited pty stays readable unless closed
KiB = 1024
DEFAULT_BUFFER = 1024 * KiB
MIN_BUFFER = 256 * KiB
MAX_BUFFER = 4096 * KiB
DEFAULT_READ = 512 * KiB
DEFAULT_TERM = "xterm-256color"
CLOSE_WAIT = 5.0  # seconds pty.close waits for the killed tree to end before replying


def info(term: Terminal, workspace: Path) -> PtyInfo:
    """The wire view of ``term``; its cwd as the sandbox sees it (never the host's path)."""
    exit_code, sig = term.status()
    spec = term.spec
    return PtyInfo(
        pty_id=spec.pty_id,
        pid=term.pid,
        argv=spec.argv,
        cwd=client_path(workspace, spec.cwd),
        cols=term.cols,
        rows=term.rows,
        state="running" if term.running else "exited",
        exit_code=exit_code,
        signal=sig,
        abandoned=term.abandoned,
        started_at=term.started_at,
        end_cursor=term.log.total,
        start_cursor=term.log.start,
        buffer_bytes=spec.buffer_bytes,
        abandon_after=spec.abandon_after,
    )


class PtyHandlers:
    def __init__(self, deps: Deps) -> None:
        self._deps = deps
        self._sets: dict[str, TerminalSet] = {}
        self._read_cap = reply_budget(deps.max_payload)

    def routes(self) -> dict[tuple[str, str], Route]:
        return {
            ("pty", "open"): Route(self.open_pty, inline=True),
            ("pty", "input"): Route(
                self.write_input,
                quiet=True,
                prepare=lambda sbx, req: (self._queue_input(sbx, req),),
                release=lambda sbx, prepared: prepared[0].cancel(),
            ),
            # A parked read is presence (it keeps abandon_after away) but not sandbox activity:
            # a forgotten viewer must not keep an idle sandbox alive forever.
            ("pty", "read"): Route(self.read, quiet=True, activity=False),
            ("pty", "resize"): Route(self.resize, inline=True),
            ("pty", "signal"): Route(self.signal, inline=True),
            ("pty", "get"): Route(self.get, inline=True, quiet=True, activity=False),
            ("pty", "list"): Route(self.list_ptys, inline=True, quiet=True, activity=False),
            ("pty", "close"): Route(
                self.close_pty, prepare=lambda sbx, req: (self._begin_close(sbx, req),)
            ),
        }

    async def close(self) -> None:
        """Kill every terminal's tree; their driving tasks then end within the shutdown grace."""
        for terms in self._sets.values():
            for term in terms:
                term.kill()

    def _terms(self, sbx: SandboxContext) -> TerminalSet:
        terms = self._sets.get(sbx.sandbox_id)
        if terms is None:
            terms = self._sets[sbx.sandbox_id] = TerminalSet(MAX_PTYS, KEEP_EXITED)
        return terms

    # -- verbs ---------------------------------------------------------------------------------

    async def open_pty(self, sbx: SandboxContext, req: PtyOpen) -> PtyInfo:
        terms = self._terms(sbx)
        pty_id = req.pty_id or uuid.uuid4().hex
        terms.admit(pty_id)
        argv = req.argv
        if argv is None and req.shell is None:
            argv = (sbx.shell, "-i", "-l")  # the login shell; it is interactive on a tty anyway
        cmd = sbx.command(
            argv, req.shell, req.cwd, {"TERM": DEFAULT_TERM, **(req.env or {})}, stdin=False
        )
        size = req.buffer_bytes or DEFAULT_BUFFER
        spec = TerminalSpec(
            pty_id=pty_id,
            argv=cmd.argv,
            cwd=cmd.cwd,
            env=cmd.env,
            cols=req.cols,
            rows=req.rows,
            buffer_bytes=min(max(size, MIN_BUFFER), MAX_BUFFER),
            abandon_after=req.abandon_after,
            around_fork=cmd.around_fork,
            cgroup=cmd.cgroup,
        )
        term = Terminal.open(spec)
        terms.add(term)
        self._deps.supervisor.spawn(term.run(self._deps.settings.pipe_grace), name=f"pty:{pty_id}")
        log.info(
            "pty_opened",
            sandbox_id=sbx.sandbox_id,
            pty_id=pty_id,
            pid=term.pid,
            argv0=spec.argv[0],
            cols=spec.cols,
            rows=spec.rows,
        )
        return info(term, sbx.workspace)

    def _queue_input(self, sbx: SandboxContext, req: PtyInput) -> asyncio.Future[int]:
        return self._terms(sbx).get(req.pty_id).write(req.data)

    async def write_input(
        self, sbx: SandboxContext, req: PtyInput, written: asyncio.Future[int]
    ) -> PtyWritten:
        return PtyWritten(pty_id=req.pty_id, written=await written)

    async def read(self, sbx: SandboxContext, req: PtyRead) -> PtyOutput:
        term = self._terms(sbx).get(req.pty_id)
        if req.cursor > term.log.total:
            raise BadRequest(
                f"cursor {req.cursor} is past the end of pty {req.pty_id!r}'s output "
                f"({term.log.total} bytes)",
                field="cursor",
                cursor=req.cursor,
                end_cursor=term.log.total,
            )
        size = min(req.max_bytes or DEFAULT_READ, self._read_cap)
        got = await term.log.read_wait(req.cursor, size, req.wait)
        term.touch()  # a long poll is presence too
        exit_code, sig = term.status() if got.eof else (None, None)
        return PtyOutput(
            pty_id=req.pty_id,
            data=got.data,
            cursor=got.cursor,
            next_cursor=got.next_cursor,
            skipped=got.skipped,
            exited=got.eof,
            exit_code=exit_code,
            signal=sig,
        )

    async def resize(self, sbx: SandboxContext, req: PtyResize) -> PtyInfo:
        term = self._terms(sbx).get(req.pty_id)
        term.resize(req.cols, req.rows)
        return info(term, sbx.workspace)

    async def signal(self, sbx: SandboxContext, req: PtySignal) -> PtyInfo:
        sig = validate_signal(req.signal)
        term = self._terms(sbx).get(req.pty_id)
        term.send_signal(sig)
        return info(term, sbx.workspace)

    async def get(self, sbx: SandboxContext, req: PtyRef) -> PtyInfo:
        return info(self._terms(sbx).get(req.pty_id), sbx.workspace)

    async def list_ptys(self, sbx: SandboxContext, req: Empty) -> PtyList:
        return PtyList(ptys=tuple(info(term, sbx.workspace) for term in self._terms(sbx)))

    def _begin_close(self, sbx: SandboxContext, req: PtyRef) -> Terminal:
        term = self._terms(sbx).pop(req.pty_id)
        term.kill()
        return term

    async def close_pty(self, sbx: SandboxContext, req: PtyRef, term: Terminal) -> PtyInfo:
        if not await term.wait_ended(CLOSE_WAIT):
            log.warning("pty_close_slow", sandbox_id=sbx.sandbox_id, pty_id=req.pty_id)
        log.info("pty_closed", sandbox_id=sbx.sandbox_id, pty_id=req.pty_id)
        return info(term, sbx.workspace)
