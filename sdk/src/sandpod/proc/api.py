"""The async client of background processes (``sbx.proc``); the blocking twins are ``sync``.

``await sbx.proc.start("npm run dev", proc_id="web")`` returns an :class:`AsyncProc` handle;
``sbx.proc.get("web")`` finds it again from any connection. Output is read by cursor from
execd's bounded log (``logs``, ``follow``, ``output``), so a client that went away re-attaches
with the last cursor it saw. Waiting (``wait``, ``follow``, ``wait_for_log``, ``wait_for_port``)
is a loop of execd long-polls; while one is pending the SDK probes execd's liveness, so a dead
execd surfaces as :class:`~sandpod.errors.SandboxUnavailable` within seconds, never a hang.
"""

from __future__ import annotations

import codecs
import dataclasses
import re
import signal as _signal
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Literal, TypeVar

from sandpod.channel import CONTROL_TIMEOUT, REPLY_SLACK
from sandpod.exec.args import cwd_and_command, split_command
from sandpod.proc.handle import AsyncProc
from sandpod.proc.types import (
    LogChunk,
    LogMatch,
    LogRead,
    ProcessInfo,
    ProcExited,
    ProcOutput,
    ProcWaitTimeout,
    Stream,
)
from sandpod_client.liveness import watch
from sandpod_contract.codec import Message
from sandpod_contract.messages.common import Empty
from sandpod_contract.messages.exec import ExecStatus
from sandpod_contract.messages.proc import (
    MAX_WAIT,
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
from sandpod_contract.messages.system import Pong

if TYPE_CHECKING:
    from sandpod.channel import Channel

__all__ = ["AsyncProcesses"]

R = TypeVar("R", bound=Message)
POLL = 25.0  # seconds per long-poll request (execd caps them at 60)
LONG_POLL_PROBE_INTERVAL = (
    2.0  # liveness probes while a long-poll is pending (the client's default is 1 s)
)
MATCH_WINDOW = 64 * 1024  # characters of an unfinished line kept for wait_for_log
_STREAMS = ("stdout", "stderr")


class AsyncProcesses:
    """``sbx.proc``: start, find, list, wait for, read and end background processes."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel

    async def _call(self, verb: str, msg: Message, reply: type[R], timeout: float) -> R:
        return await self._channel.call("proc", verb, msg, reply, timeout)

    async def _poll(self, verb: str, msg: Message, reply: type[R], wait: float) -> R:
        """A long-poll request, with execd's liveness probed while it is pending."""
        return await watch(
            self._call(verb, msg, reply, wait + REPLY_SLACK),
            self._alive,
            what=f"proc.{verb}",
            interval=LONG_POLL_PROBE_INTERVAL,
        )

    async def _alive(self) -> ExecStatus:
        await self._channel.call("sys", "ping", Empty(), Pong, CONTROL_TIMEOUT)
        return ExecStatus(exec_id="", state="running")

    async def start(
        self,
        cwd_or_command: str | Sequence[str],
        command: str | Sequence[str] | None = None,
        /,
        *,
        proc_id: str | None = None,
        tags: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        timeout: float | None = None,
        log_limit: int | None = None,
    ) -> AsyncProc:
        """Start a background process: ``start("npm run dev")`` or ``start(cwd, ["argv"])``.

        Args:
            cwd_or_command, command: as for ``exec``: a shell string or an argv sequence,
                optionally preceded by the working directory.
            proc_id: your id for it (unique among kept records); a random one otherwise.
            tags: labels to find it by with :meth:`list`.
            env: variables added to the sandbox's environment (it also gets
                ``SANDPOD_PROC_ID``).
            stdin: bytes written to its stdin, then EOF (default: ``/dev/null``).
            timeout: seconds after which its whole tree is killed (default: none).
            log_limit: bytes of output execd keeps (default 2 MiB; clamped to execd's max).

        Raises:
            ProcIdInUse: the id is taken (remove the old record or choose another).
            Busy: the sandbox's table of processes is full of running ones.
            CommandNotFound, InvalidCwd, SpawnFailed: it could not start.
            ArgvExpected: ``start("ls", "-l")``: a program and its arguments given as
                ``(cwd, command)``; pass one argv list.
        """
        cwd, cmd = cwd_and_command(cwd_or_command, command)
        argv, shell = split_command(cmd)
        req = ProcStart(
            proc_id=proc_id,
            argv=argv,
            shell=shell,
            cwd=cwd,
            env=dict(env) if env else None,
            tags=dict(tags) if tags else None,
            stdin=stdin.encode() if isinstance(stdin, str) else stdin,
            timeout=timeout,
            log_limit=log_limit,
        )
        info = await self._call("start", req, ProcInfo, CONTROL_TIMEOUT)
        return AsyncProc(self, ProcessInfo._from_wire(info))

    async def get(self, proc_id: str) -> AsyncProc:
        """A handle on a kept process. Raises ProcNotFound."""
        return AsyncProc(self, await self.status(proc_id))

    async def list(
        self,
        *,
        tags: Mapping[str, str] | None = None,
        state: Literal["running", "exited"] | None = None,
    ) -> list[ProcessInfo]:
        """Kept processes, oldest first; every given tag must match, ``state`` if given."""
        req = ProcList(tags=dict(tags) if tags else None, state=state)
        listing = await self._call("list", req, ProcListing, CONTROL_TIMEOUT)
        return [ProcessInfo._from_wire(p) for p in listing.procs]

    async def status(self, proc_id: str) -> ProcessInfo:
        """Where ``proc_id`` stands. Raises ProcNotFound."""
        info = await self._call("status", ProcRef(proc_id=proc_id), ProcInfo, CONTROL_TIMEOUT)
        return ProcessInfo._from_wire(info)

    async def wait(self, proc_id: str, timeout: float | None = None) -> ProcessInfo:
        """Wait for the process to exit; its final info.

        Raises:
            ProcWaitTimeout: still running after ``timeout`` seconds (``None``: wait forever).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = _slice(deadline)
            info = await self._poll("wait", ProcWait(proc_id=proc_id, wait=wait), ProcInfo, wait)
            if info.state == "exited":
                return ProcessInfo._from_wire(info)
            if deadline is not None and time.monotonic() >= deadline:
                raise ProcWaitTimeout(f"{proc_id!r} still running after {timeout:g}s")

    async def kill(
        self, proc_id: str, signal: int = _signal.SIGTERM, grace: float = 5.0
    ) -> ProcessInfo:
        """End the whole tree: ``signal`` to every process, SIGKILL after ``grace`` seconds.

        Returns once it is gone. Killing an exited process kills whatever it left running.
        """
        req = ProcKill(proc_id=proc_id, signal=int(signal), grace=grace)
        return ProcessInfo._from_wire(await self._call("kill", req, ProcInfo, grace + REPLY_SLACK))

    async def signal(self, proc_id: str, sig: int) -> ProcessInfo:
        """Send ``sig`` to the process group (e.g. SIGHUP to reload); nothing else happens."""
        req = ProcSignal(proc_id=proc_id, signal=int(sig))
        return ProcessInfo._from_wire(await self._call("signal", req, ProcInfo, CONTROL_TIMEOUT))

    async def remove(self, proc_id: str) -> ProcessInfo:
        """SIGKILL the tree if anything still runs, then forget the record and its log."""
        info = await self._call("remove", ProcRef(proc_id=proc_id), ProcInfo, REPLY_SLACK)
        return ProcessInfo._from_wire(info)

    async def logs(
        self,
        proc_id: str,
        cursor: int = 0,
        *,
        wait: float = 0.0,
        max_bytes: int | None = None,
        stream: Stream | None = None,
    ) -> LogRead:
        """One read of the output after ``cursor`` (waiting up to ``wait`` s for some)."""
        req = ProcLogs(
            proc_id=proc_id,
            cursor=cursor,
            max_bytes=max_bytes,
            wait=min(wait, MAX_WAIT) or None,
            stream=stream,
        )
        part = await self._poll("logs", req, ProcLogPart, req.wait or 0.0)
        chunks = [LogChunk(c.stream, c.data, c.offset) for c in part.chunks]
        if chunks and part.skipped:
            chunks[0] = dataclasses.replace(chunks[0], skipped=part.skipped)
        return LogRead(chunks, part.cursor, part.next_cursor, part.skipped, part.eof, part.state)

    async def follow(
        self, proc_id: str, cursor: int = 0, *, stream: Stream | None = None
    ) -> AsyncIterator[LogChunk]:
        """Yield output from ``cursor`` as it comes, until the process exited and all was read.

        Stop iterating whenever you like; the process keeps running. To re-attach later, pass
        the ``end`` of the last chunk you got as ``cursor``.
        """
        while True:
            read = await self.logs(proc_id, cursor, wait=POLL, stream=stream)
            for chunk in read.chunks:
                yield chunk
            cursor = read.next_cursor
            if read.eof:
                return

    async def output(self, proc_id: str, *, cursor: int = 0) -> ProcOutput:
        """All output kept from ``cursor`` up to now, per stream (does not wait)."""
        out: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
        end = (await self.status(proc_id)).log_end
        skipped = 0
        while cursor < end:
            read = await self.logs(proc_id, cursor)
            skipped += read.skipped
            for chunk in read.chunks:
                out[chunk.stream].append(chunk.data)
            if read.next_cursor <= cursor:
                break
            cursor = read.next_cursor
        return ProcOutput(b"".join(out["stdout"]), b"".join(out["stderr"]), skipped, cursor)

    async def wait_for_log(
        self,
        proc_id: str,
        pattern: str | re.Pattern[str],
        timeout: float | None = 30.0,
        *,
        stream: Stream | None = None,
        cursor: int = 0,
    ) -> LogMatch:
        """Wait until the output (from ``cursor``; default: the beginning) matches ``pattern``.

        ``pattern`` is searched in each line (UTF-8 text without its newline, so ``^`` and ``$``
        anchor to the line), per stream, including a last line not yet ended by a newline
        (prompts). Returns the first match; its ``cursor`` is just after the matching line.

        Raises:
            ProcExited: the process exited and its output ended without a match.
            ProcWaitTimeout: no match within ``timeout`` seconds.
        """
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = None if timeout is None else time.monotonic() + timeout
        # surrogateescape: undecodable bytes survive the round trip, so cursors stay exact.
        decoders = {s: codecs.getincrementaldecoder("utf-8")("surrogateescape") for s in _STREAMS}
        pending = dict.fromkeys(_STREAMS, "")
        while True:
            read = await self.logs(proc_id, cursor, wait=_slice(deadline), stream=stream)
            for chunk in read.chunks:
                decoder = decoders[chunk.stream]
                text = pending[chunk.stream] + decoder.decode(chunk.data)
                lines = text.split("\n")  # the last one is unfinished (maybe a prompt)
                pos = 0
                for i, line in enumerate(lines):
                    pos += len(line) + (i < len(lines) - 1)
                    if m := regex.search(line):
                        held = len(decoder.getstate()[0])  # bytes of a split character
                        rest = text[pos:].encode("utf-8", "surrogateescape")
                        shown = line.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
                        return LogMatch(chunk.stream, shown, m, chunk.end - held - len(rest))
                pending[chunk.stream] = lines[-1][-MATCH_WINDOW:]
            cursor = read.next_cursor
            if read.eof:
                info = await self.status(proc_id)
                raise ProcExited(
                    f"{proc_id!r} exited ({_how(info)}) without output matching {regex.pattern!r}",
                    proc_id=proc_id,
                    exit_code=info.exit_code,
                    signal=info.signal,
                )
            if deadline is not None and time.monotonic() >= deadline:
                raise ProcWaitTimeout(
                    f"no output of {proc_id!r} matched {regex.pattern!r} within {timeout:g}s",
                    proc_id=proc_id,
                )

    async def wait_for_port(
        self,
        port: int,
        *,
        proc_id: str | None = None,
        kind: Literal["tcp", "http"] = "tcp",
        path: str = "/",
        timeout: float | None = 30.0,
    ) -> None:
        """Wait until ``port`` on the sandbox's loopback accepts (checked inside the sandbox).

        ``kind="http"`` also needs ``GET path`` to answer 200..399. With ``proc_id`` the wait
        fails as soon as that process exits.

        Raises:
            ProcExited: ``proc_id`` exited first.
            ProcWaitTimeout: not ready within ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = _slice(deadline)
            req = ProcWaitPort(
                port=port,
                kind=kind,
                path=None if path == "/" else path,
                proc_id=proc_id,
                wait=wait,
            )
            status = await self._poll("wait_port", req, ProcPortStatus, wait)
            if status.ready:
                return
            if status.proc_state == "exited":
                info = await self.status(proc_id or "")
                raise ProcExited(
                    f"{proc_id!r} exited ({_how(info)}) before port {port} was ready",
                    proc_id=proc_id,
                    port=port,
                    exit_code=info.exit_code,
                )
            if deadline is not None and time.monotonic() >= deadline:
                raise ProcWaitTimeout(
                    f"port {port} not ready within {timeout:g}s ({status.reason})",
                    port=port,
                    status_code=status.status_code,
                )


# -- helpers -----------------------------------------------------------------------------------


def _slice(deadline: float | None) -> float:
    """Seconds for the next long-poll: at most POLL, at most what is left (never negative)."""
    if deadline is None:
        return POLL
    return max(min(POLL, deadline - time.monotonic()), 0.0)


def _how(info: ProcessInfo) -> str:
    if info.signal is not None:
        try:
            return _signal.Signals(info.signal).name
        except ValueError:
            return f"signal {info.signal}"
    return f"exit code {info.exit_code}"
