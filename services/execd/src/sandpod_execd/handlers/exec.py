"""``exec`` family: one-shot and streaming exec, and the stream control verbs."""

from __future__ import annotations

import time
import uuid

import structlog

from sandpod_contract.errors import BadRequest, Busy, ExecIdInUse, ExecNotFound
from sandpod_contract.messages.exec import (
    ExecFetch,
    ExecRef,
    ExecRequest,
    ExecResult,
    ExecResume,
    ExecSignal,
    ExecStart,
    ExecStarted,
    ExecStatus,
    OutputPart,
    StdinWrite,
    StreamAck,
)
from sandpod_execd.handlers import Deps, Route
from sandpod_execd.oneshot import Outcome, run_to_completion, status_fields
from sandpod_execd.process import Process, spawn
from sandpod_execd.sandbox import SandboxContext
from sandpod_execd.streaming import StreamingExec, validate_signal
from sandpod_service.memory import Trimmer

__all__ = ["ExecHandlers", "reply_budget"]

log = structlog.get_logger("sandpod.execd.exec")

ENVELOPE_OVERHEAD = 1024  # room for the non-output fields of an ExecResult


def reply_budget(max_payload: int) -> int:
    """Bytes of output that fit in one reply next to the result's other fields."""
    return max(max_payload - ENVELOPE_OVERHEAD, 1024)


def _split_budget(budget: int, out: int, err: int) -> tuple[int, int]:
    """Share ``budget`` between stdout and stderr: each gets half, unused half goes to the other."""
    half = budget // 2
    a = min(out, max(half, budget - err))
    b = min(err, budget - a)
    return a, b


class ExecHandlers:
    def __init__(self, deps: Deps) -> None:
        self._settings = deps.settings
        self._prefix = deps.settings.prefix
        self._metrics = deps.metrics
        self._supervisor = deps.supervisor
        self._publish = deps.publish
        self._budget = reply_budget(deps.max_payload)
        self._trimmer = Trimmer()
        self._streams: set[StreamingExec] = set()  # running ones, for ``close``

    def routes(self) -> dict[tuple[str, str], Route]:
        return {
            ("exec", "run"): Route(
                self.run,
                prepare=lambda sbx, req: (self.register_run(sbx, req),),
                release=lambda sbx, prepared: sbx.registry.finished(prepared[0]),
            ),
            ("exec", "fetch"): Route(self.fetch),
            ("exec", "start"): Route(self.start),
            ("exec", "ack"): Route(self.ack, inline=True, quiet=True),
            ("exec", "stdin"): Route(self.stdin),
            ("exec", "signal"): Route(self.signal, inline=True),
            ("exec", "cancel"): Route(self.cancel, inline=True),
            ("exec", "resume"): Route(self.resume),
            ("exec", "status"): Route(self.status, inline=True, quiet=True, activity=False),
        }

    async def close(self) -> None:
        """Streams left with delivery only end now; the rest end through the supervisor's
        shutdown (their tasks kill their commands)."""
        for stream in self._streams:
            stream.shut_down()

    def _admit(self, sbx: SandboxContext, exec_id: str | None) -> str:
        if sbx.registry.active >= self._settings.max_execs:
            self._metrics.rejected.labels("busy").inc()
            raise Busy(
                f"{sbx.registry.active} execs running (limit {self._settings.max_execs})",
                limit=self._settings.max_execs,
            )
        if exec_id is not None and exec_id in sbx.registry:
            raise ExecIdInUse(f"exec id {exec_id!r} is in use; choose a fresh one", exec_id=exec_id)
        return exec_id or uuid.uuid4().hex

    # -- one-shot ------------------------------------------------------------------------------

    def register_run(self, sbx: SandboxContext, req: ExecRequest) -> str:
        """Synchronous part of ``exec.run``: admit and register, so probes find it at once."""
        exec_id = self._admit(sbx, req.exec_id)
        sbx.registry.started(exec_id)
        return exec_id

    async def run(self, sbx: SandboxContext, req: ExecRequest, exec_id: str) -> ExecResult:
        proc: Process | None = None
        try:
            cmd = sbx.command(req.argv, req.shell, req.cwd, req.env, stdin=req.stdin is not None)
            proc = spawn(cmd)
            sbx.registry.oneshots[exec_id] = proc
            self._metrics.running.inc()
            try:
                outcome = await run_to_completion(
                    proc,
                    stdin=req.stdin,
                    timeout=req.timeout,
                    max_output=self._settings.output_cap(req.max_output),
                    pipe_grace=self._settings.pipe_grace,
                )
            finally:
                self._metrics.running.dec()
        finally:
            sbx.registry.finished(exec_id, proc.returncode if proc is not None else None)
        self._metrics.exec_seconds.labels("run").observe(outcome.duration)
        self._metrics.stream_bytes.labels("run").inc(outcome.stdout.seen + outcome.stderr.seen)
        return self._result(sbx, exec_id, outcome)

    def _result(self, sbx: SandboxContext, exec_id: str, outcome: Outcome) -> ExecResult:
        out, err = outcome.stdout.value(), outcome.stderr.value()
        n_out, n_err = len(out), len(err)
        if n_out + n_err > self._budget:
            n_out, n_err = _split_budget(self._budget, n_out, n_err)
            unfetched = {
                name
                for name, n, d in (("stdout", n_out, out), ("stderr", n_err, err))
                if n < len(d)
            }
            if not sbx.registry.store_output(exec_id, out, err, unfetched):
                # Over the stored-output budget: what fits is all the client gets (truncated).
                out, err = out[:n_out], err[:n_err]
                log.warning("output_store_full", exec_id=exec_id)
        exit_code, sig = status_fields(outcome.returncode)
        return ExecResult(
            exec_id=exec_id,
            exit_code=exit_code,
            signal=sig,
            stdout=out[:n_out],
            stderr=err[:n_err],
            stdout_size=len(out),
            stderr_size=len(err),
            stdout_truncated=outcome.stdout.truncated or len(out) < outcome.stdout.kept,
            stderr_truncated=outcome.stderr.truncated or len(err) < outcome.stderr.kept,
            timed_out=outcome.timed_out,
            duration=outcome.duration,
        )

    async def fetch(self, sbx: SandboxContext, req: ExecFetch) -> OutputPart:
        sbx.registry.expire()
        stored = sbx.registry.stored.get(req.exec_id)
        if stored is None:
            raise ExecNotFound(
                f"no stored output for exec {req.exec_id!r} (fetched already or expired after "
                f"{self._settings.result_ttl:g}s)",
                exec_id=req.exec_id,
            )
        data = stored.stdout if req.stream == "stdout" else stored.stderr
        size = min(req.max_bytes or self._budget, self._budget)
        part = data[req.offset : req.offset + size]
        eof = req.offset + len(part) >= len(data)
        if eof:
            sbx.registry.fetched_to_end(req.exec_id, req.stream)
        return OutputPart(
            exec_id=req.exec_id, stream=req.stream, offset=req.offset, data=part, eof=eof
        )

    # -- streaming -----------------------------------------------------------------------------

    async def start(self, sbx: SandboxContext, req: ExecStart) -> ExecStarted:
        exec_id = self._admit(sbx, req.exec_id)
        self._check_deliver(req.deliver)
        stdin_pipe = req.stdin_open or req.stdin is not None
        cmd = sbx.command(req.argv, req.shell, req.cwd, req.env, stdin=stdin_pipe)
        proc = spawn(cmd)
        window = min(req.window or self._settings.default_window, self._settings.max_window)
        stream = StreamingExec(
            exec_id=exec_id,
            proc=proc,
            deliver=req.deliver,
            publish=self._publish,
            window=window,
            max_chunk=self._settings.max_chunk,
            timeout=req.timeout,
            abandon_after=req.abandon_after or self._settings.abandon_after,
            pipe_grace=self._settings.pipe_grace,
            initial_stdin=req.stdin,
            keep_stdin_open=req.stdin_open,
        )
        sbx.registry.streams[exec_id] = stream
        self._supervisor.spawn(self._drive(sbx, stream), name=f"stream:{exec_id}")
        return ExecStarted(
            exec_id=exec_id, pid=proc.pid, window=window, abandon_after=stream.abandon_after
        )

    def _check_deliver(self, deliver: str) -> None:
        """Frames never go into Sandpod's own subjects (a client could otherwise make execd
        publish requests to other sandboxes or the control plane).

        Raises:
            BadRequest: ``deliver`` is inside the installation's prefix.
        """
        if deliver.startswith(f"{self._prefix}."):
            raise BadRequest(
                f"deliver subject {deliver!r} is inside the Sandpod namespace; use an inbox",
                deliver=deliver,
            )

    async def _drive(self, sbx: SandboxContext, stream: StreamingExec) -> None:
        self._metrics.running.inc()
        self._streams.add(stream)
        try:
            await stream.run()
        finally:
            self._streams.discard(stream)
            self._metrics.running.dec()
            sbx.registry.finished(stream.exec_id, stream.proc.returncode)
            self._trimmer.soon()  # its retained frames go back to the kernel, not the heap
            self._metrics.exec_seconds.labels("stream").observe(
                time.monotonic() - stream.proc.started
            )

    def _stream(self, sbx: SandboxContext, exec_id: str) -> StreamingExec:
        stream = sbx.registry.streams.get(exec_id)
        if stream is None or stream.released:  # released: exit acked, verbs see no stream
            raise ExecNotFound(f"no streaming exec {exec_id!r} in this execd", exec_id=exec_id)
        return stream

    async def ack(self, sbx: SandboxContext, req: StreamAck) -> None:
        stream = sbx.registry.streams.get(req.exec_id)
        if stream is not None:
            stream.ack(req.seq)

    async def stdin(self, sbx: SandboxContext, req: StdinWrite) -> ExecStatus:
        stream = self._stream(sbx, req.exec_id)
        await stream.write_stdin(req.data, req.eof)
        return stream.status()

    async def signal(self, sbx: SandboxContext, req: ExecSignal) -> ExecStatus:
        sig = validate_signal(req.signal)
        proc = sbx.registry.oneshots.get(req.exec_id)
        if proc is not None:
            proc.signal_group(sig)
            return await self.status(sbx, ExecRef(exec_id=req.exec_id))
        stream = self._stream(sbx, req.exec_id)
        stream.send_signal(sig)
        return stream.status()

    async def cancel(self, sbx: SandboxContext, req: ExecRef) -> ExecStatus:
        proc = sbx.registry.oneshots.get(req.exec_id)
        if proc is not None:
            proc.kill_tree()  # the one-shot's result then reports signal 9
            return await self.status(sbx, req)
        stream = self._stream(sbx, req.exec_id)
        stream.cancel()
        return stream.status()

    async def resume(self, sbx: SandboxContext, req: ExecResume) -> ExecStatus:
        if req.deliver is not None:
            self._check_deliver(req.deliver)
        stream = self._stream(sbx, req.exec_id)
        await stream.resume(req.from_seq, req.deliver)
        return stream.status()

    async def status(self, sbx: SandboxContext, req: ExecRef) -> ExecStatus:
        reg = sbx.registry
        if req.exec_id in reg.streams:
            return reg.streams[req.exec_id].status()
        if req.exec_id in reg.oneshots:
            proc = reg.oneshots[req.exec_id]
            pid = proc.pid if proc is not None else None
            return ExecStatus(exec_id=req.exec_id, state="running", pid=pid)
        if reg.was_recent(req.exec_id):
            # A one-shot is "running" until its reply is made (a probe seeing "exited" twice
            # means the reply was lost), then "exited" with how, as far as execd remembers.
            code = reg.recent_returncode(req.exec_id)
            exit_code, sig = status_fields(code) if code is not None else (None, None)
            return ExecStatus(exec_id=req.exec_id, state="exited", exit_code=exit_code, signal=sig)
        raise ExecNotFound(f"exec {req.exec_id!r} is unknown to this execd", exec_id=req.exec_id)
