"""``proc``-family handlers (see ``sandpod_contract.messages.proc``).

Each sandbox has its own :class:`~sandpod_execd.procs.ProcTable`. ``start`` spawns and hands the
process's driver to the supervisor; the long-polls (``wait``, ``logs``, ``wait_port``) are
ordinary request tasks that answer when there is news or their ``wait`` ran out (at most
:data:`~sandpod_contract.messages.proc.MAX_WAIT` seconds). At shutdown every tree is ended.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import uuid

from sandpod_contract.codec import encode
from sandpod_contract.messages.proc import (
    ProcChunk,
    ProcInfo,
    ProcKill,
    ProcList,
    ProcListing,
    ProcLogPart,
    ProcLogs,
    ProcPortStatus,
    ProcRef,
    ProcSignal,
    ProcStart,
    ProcWait,
    ProcWaitPort,
)
from sandpod_execd import proctree
from sandpod_execd.clientpath import client_path
from sandpod_execd.handlers import Deps, Route
from sandpod_execd.handlers.exec import reply_budget
from sandpod_execd.oneshot import status_fields
from sandpod_execd.ports import wait_port
from sandpod_execd.process import kill_cgroup
from sandpod_execd.procs import BackgroundProc, ProcLimits, ProcTable, display
from sandpod_execd.sandbox import SandboxContext
from sandpod_execd.streaming import validate_signal

__all__ = ["ProcHandlers"]

PROC_ID_ENV = "SANDPOD_PROC_ID"


class ProcHandlers:
    def __init__(self, deps: Deps, limits: ProcLimits | None = None) -> None:
        self._deps = deps
        self._limits = limits or ProcLimits()
        self._tables: dict[str, ProcTable] = {}
        self._budget = reply_budget(deps.max_payload)
        self._closing = False  # shutdown: pending port waits answer at once

    def routes(self) -> dict[tuple[str, str], Route]:
        return {
            ("proc", "start"): Route(self.start),
            ("proc", "list"): Route(self.list, inline=True, activity=False),
            ("proc", "status"): Route(self.status, inline=True, quiet=True, activity=False),
            # Waiting and reading output are passive, like pty.read and watch.poll: a forgotten
            # `sandpod proc logs -f` must not keep an idle sandbox alive (schemas/docs/metrics.md).
            ("proc", "wait"): Route(self.wait, quiet=True, activity=False),
            ("proc", "logs"): Route(self.logs, quiet=True, activity=False),
            ("proc", "signal"): Route(self.signal, inline=True),
            ("proc", "kill"): Route(self.kill),
            ("proc", "remove"): Route(self.remove),
            ("proc", "wait_port"): Route(self.wait_port, quiet=True, activity=False),
        }

    async def close(self) -> None:
        """End every background process tree (SIGTERM, SIGKILL after a short grace).

        Running leaders get ``end_tree`` each; what the exited ones (up to the record limit,
        per sandbox) left running is found in one sweep for all, since a few ``/proc`` scans
        per record made a loaded execd take longer to stop than its callers wait."""
        self._closing = True
        procs = [bp for table in self._tables.values() for bp in table]
        grace = self._limits.shutdown_grace
        running = [bp for bp in procs if bp.proc.running]
        exited = [bp for bp in procs if not bp.proc.running]
        await asyncio.gather(
            *(bp.kill(signal.SIGTERM, grace) for bp in running),
            proctree.end_leftovers({bp.token for bp in exited}, signal.SIGTERM, grace),
            return_exceptions=True,
        )
        for bp in exited:
            if bp.proc.cgroup is not None:
                kill_cgroup(bp.proc.cgroup)  # jailed: strays re-parented inside the sandbox
        swept = {bp.proc_id for bp in exited}
        for table in self._tables.values():
            for bp in table:
                table.remove(bp.proc_id, ended=bp.proc_id in swept)
        await asyncio.gather(*(bp.closed() for bp in procs), return_exceptions=True)

    def _table(self, sbx: SandboxContext) -> ProcTable:
        table = self._tables.get(sbx.sandbox_id)
        if table is None:
            table = self._tables[sbx.sandbox_id] = ProcTable(self._limits)
        return table

    # -- verbs ---------------------------------------------------------------------------------

    async def start(self, sbx: SandboxContext, req: ProcStart) -> ProcInfo:
        table = self._table(sbx)
        proc_id = req.proc_id or uuid.uuid4().hex[:12]
        token = uuid.uuid4().hex
        cmd = sbx.command(req.argv, req.shell, req.cwd, req.env, stdin=req.stdin is not None)
        env = {**cmd.env, PROC_ID_ENV: proc_id, proctree.TOKEN_ENV: token}
        bp = table.start(
            dataclasses.replace(cmd, env=env),
            proc_id=proc_id,
            token=token,
            display=display(req.argv, req.shell),
            cwd=sbx.jail.inside(req.cwd) if sbx.jail else client_path(sbx.workspace, cmd.cwd),
            tags=req.tags,
            log_limit=table.log_limit(req.log_limit),
            timeout=req.timeout,
            stdin=req.stdin,
        )
        self._deps.supervisor.spawn(bp.run(), name=f"proc:{proc_id}")
        return _info(bp)

    async def list(self, sbx: SandboxContext, req: ProcList) -> ProcListing:
        infos: list[ProcInfo] = []
        used, truncated = 0, False
        for bp in self._table(sbx).list(req.tags, req.state):
            info = _info(bp)
            used += len(encode(info))
            if used > self._budget:
                truncated = True
                break
            infos.append(info)
        return ProcListing(procs=tuple(infos), truncated=truncated)

    async def status(self, sbx: SandboxContext, req: ProcRef) -> ProcInfo:
        return _info(self._table(sbx).get(req.proc_id))

    async def wait(self, sbx: SandboxContext, req: ProcWait) -> ProcInfo:
        bp = self._table(sbx).get(req.proc_id)
        if req.wait:
            await bp.wait(req.wait)
        return _info(bp)

    async def logs(self, sbx: SandboxContext, req: ProcLogs) -> ProcLogPart:
        bp = self._table(sbx).get(req.proc_id)
        budget = min(req.max_bytes or self._budget, self._budget)
        read = await bp.log.read_wait(req.cursor, budget, req.wait or 0.0, req.stream)
        return ProcLogPart(
            proc_id=bp.proc_id,
            cursor=read.cursor,
            next_cursor=read.next_cursor,
            skipped=read.skipped,
            eof=read.eof,
            state=bp.state,
            chunks=tuple(
                ProcChunk(offset=c.offset, stream=c.stream, data=c.data) for c in read.chunks
            ),
        )

    async def signal(self, sbx: SandboxContext, req: ProcSignal) -> ProcInfo:
        bp = self._table(sbx).get(req.proc_id)
        bp.send_signal(validate_signal(req.signal))
        return _info(bp)

    async def kill(self, sbx: SandboxContext, req: ProcKill) -> ProcInfo:
        bp = self._table(sbx).get(req.proc_id)
        sig = validate_signal(req.signal) if req.signal is not None else signal.SIGTERM
        grace = self._limits.default_grace if req.grace is None else req.grace
        await bp.kill(sig, grace)
        return _info(bp)

    async def remove(self, sbx: SandboxContext, req: ProcRef) -> ProcInfo:
        table = self._table(sbx)
        # Kill first and wait for the tree to be gone, so the reply means "nothing left".
        await table.get(req.proc_id).kill(signal.SIGKILL, 0)
        bp = table.remove(req.proc_id)
        await bp.closed()
        return _info(bp)

    async def wait_port(self, sbx: SandboxContext, req: ProcWaitPort) -> ProcPortStatus:
        bp: BackgroundProc | None = None
        if req.proc_id is not None:
            bp = self._table(sbx).get(req.proc_id)

        def exited() -> bool:
            return self._closing or (bp is not None and not bp.proc.running)

        netns = f"/proc/{sbx.jail.holder}/ns/net" if sbx.jail is not None else None
        result = await wait_port(
            req.port, req.kind, req.path or "/", req.wait or 0.0, stop=exited, netns=netns
        )
        return ProcPortStatus(
            port=req.port,
            ready=result.ready,
            status_code=result.status_code,
            reason=result.reason,
            proc_state=bp.state if bp is not None else None,
        )


def _info(bp: BackgroundProc) -> ProcInfo:
    exit_code, sig = (None, None)
    if bp.proc.returncode is not None:
        exit_code, sig = status_fields(bp.proc.returncode)
    return ProcInfo(
        proc_id=bp.proc_id,
        pid=bp.proc.pid,
        state=bp.state,
        command=bp.command,
        cwd=bp.cwd,
        tags=bp.tags,
        started_at=bp.started_at,
        ended_at=bp.ended_at,
        exit_code=exit_code,
        signal=sig,
        killed=bp.killed,
        timed_out=bp.timed_out,
        stdout_size=bp.sizes["stdout"],
        stderr_size=bp.sizes["stderr"],
        log_limit=bp.log_limit,
        log_start=bp.log.start,
        log_end=bp.log.total,
    )
