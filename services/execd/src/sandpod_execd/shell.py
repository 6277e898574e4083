"""One persistent bash and the protocol to run commands in it (no NATS, no queueing).

Framing. For each command execd writes the command text to a private file ``<n>.cmd`` (and its
stdin to ``<n>.in``), then one fixed line of its own to the shell's stdin (shown wrapped)::

    export SANDPOD_COMMAND_TREE_ID=<token>; trap 'return 124' <SIG>
    { . <n>.cmd; } <<n>.in ><n>.out 2><n>.err
    printf '\\36<nonce> %d %s\\0' "$?" "$PWD"; unset SANDPOD_COMMAND_TREE_ID

The command is *sourced* in the shell itself, so ``cd``, ``export``, functions and aliases
persist; a syntax error or an unclosed quote in it only fails that ``.`` (status 2), it cannot
swallow the line that follows. Its stdout and stderr go to files, its stdin never is the
shell's, so nothing the command prints or reads can touch the protocol: the only thing the
shell writes to its own stdout is the end record, found by a random per-command nonce (a
command cannot guess it, and stray output from user traps is skipped). Output without a
trailing newline, binary output or text that looks like a marker are all just file contents.

Timeouts end the command, not the shell. execd sends the shell a real-time signal whose trap
(re-armed before every command) does ``return 124``, which abandons the sourced file, and
SIGKILLs every process the command started: the shell's descendants that did not exist before
it, and every process carrying the command's own tree token (a fresh one per command, exported
just for it, so processes that left the tree with ``setsid`` and were re-parented are found
too); background jobs of earlier commands carry older tokens and survive. It repeats this for
up to ``KILL_GRACE`` seconds (a ``return`` inside a shell function only leaves that function),
then sweeps the token once more; a shell that still does not answer is killed and the session
reports itself dead. The shell's own token (``SANDPOD_TREE_ID``) stays in every command's
environment, so deleting the session still finds everything any command left running.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import shlex
import signal
import time
from typing import Any

import structlog

from sandpod_contract.errors import SessionDead
from sandpod_execd import proctree
from sandpod_execd.process import Process
from sandpod_execd.sessiondir import SessionDir

__all__ = ["INTERRUPT_SIGNAL", "Outcome", "Shell"]

log = structlog.get_logger("sandpod.execd.session")

COMMAND_TOKEN = proctree.COMMAND_TOKEN_ENV
INTERRUPT_SIGNAL = int(signal.SIGRTMIN) + 7  # rarely used by anything else; trapped per command
KILL_GRACE = 2.0  # seconds the shell gets to abandon an interrupted command before it is killed
TIMEOUT_STATUS = 124
RECORD_LIMIT = 64 * 1024  # longest end record accepted (the cwd is in it)
READ_SIZE = 64 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome:
    """How one command ended. ``status`` is ``None`` when the shell died before reporting."""

    status: int | None
    cwd: str | None
    interrupted: bool  # timeout or cancel: the command was abandoned
    shell_exited: bool
    duration: float
    stdout: str  # file names in the session directory
    stderr: str


class Shell:
    """A running bash with a private directory for command files. ``pump()`` drives it."""

    def __init__(self, proc: Process, token: str, workdir: SessionDir, cwd: str) -> None:
        self.proc = proc
        self.token = token
        self.workdir = workdir
        self.cwd = cwd
        self._seq = 0
        self._buf = bytearray()
        self._waiting: tuple[bytes, asyncio.Future[tuple[int, str] | None]] | None = None
        self._ended = asyncio.Event()
        self._interrupt = asyncio.Event()

    @property
    def alive(self) -> bool:
        return not self._ended.is_set()

    # -- driving -------------------------------------------------------------------------------

    async def pump(self) -> None:
        """Read the shell's stdout (end records) and stderr (dropped) until it is gone."""
        try:
            await asyncio.gather(self._read_records(), self._drain_stderr())
            await self.proc.wait()
        finally:
            self._ended.set()
            if self._waiting is not None and not self._waiting[1].done():
                self._waiting[1].set_result(None)
            if self.proc.running:  # cancelled (execd stopping)
                await asyncio.shield(self.kill())
            self.proc.close_pipes()
            log.info("shell_ended", pid=self.proc.pid, returncode=self.proc.returncode)

    async def _read_records(self) -> None:
        while data := await self.proc.stdout.read(READ_SIZE):
            self._buf += data
            self._scan()

    async def _drain_stderr(self) -> None:
        # The shell's own stderr (xtrace, errors of our fixed line) is not anyone's output.
        while await self.proc.stderr.read(READ_SIZE):
            pass

    def _scan(self) -> None:
        if self._waiting is None:
            self._buf.clear()
            return
        prefix, future = self._waiting
        start = self._buf.find(prefix)
        if start < 0:
            del self._buf[: max(len(self._buf) - len(prefix) + 1, 0)]
            return
        end = self._buf.find(b"\0", start)
        if end < 0:
            if len(self._buf) - start > RECORD_LIMIT:
                self._buf.clear()
            return
        status, _, cwd = bytes(self._buf[start + len(prefix) : end]).partition(b" ")
        del self._buf[: end + 1]
        self._waiting = None
        if not future.done():
            future.set_result((int(status), cwd.decode("utf-8", "replace")))

    async def kill(self) -> None:
        """SIGKILL the shell and everything it started."""
        await proctree.end_tree(self.proc, self.proc.pid, self.token, signal.SIGKILL, 0)

    # -- commands ------------------------------------------------------------------------------

    async def start(self, timeout: float) -> bool:
        """Prepare the fresh shell; whether it answered within ``timeout`` seconds."""
        if self.proc.stdin is None:  # a shell without its command pipe cannot be driven
            return False
        # Aliases defined by one command should work in the next, as in an interactive shell.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            await self.proc.stdin.write(b"\\builtin shopt -s expand_aliases 2>/dev/null\n")
        return await self.sync(timeout)

    async def sync(self, timeout: float) -> bool:
        """Whether the shell answers an empty command within ``timeout`` seconds."""
        if self.proc.stdin is None:  # a shell without its command pipe cannot be driven
            return False
        nonce, future = self._expect()
        line = f"\\builtin printf '\\036%s %d %s\\0' {nonce} 0 \"$PWD\"\n"
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            await self.proc.stdin.write(line.encode())
        with contextlib.suppress(TimeoutError):
            record = await asyncio.wait_for(asyncio.shield(future), timeout)
            if record is not None:
                self.cwd = record[1]
                return True
        return False

    def _expect(self) -> tuple[str, asyncio.Future[tuple[int, str] | None]]:
        nonce = secrets.token_hex(16)
        future: asyncio.Future[tuple[int, str] | None] = asyncio.get_running_loop().create_future()
        self._waiting = (b"\x1e" + nonce.encode() + b" ", future)
        if not self.alive:
            future.set_result(None)
        return nonce, future

    def interrupt(self) -> None:
        """Abandon the running command (``session.cancel``); ``run`` reports it."""
        self._interrupt.set()

    async def run(self, command: str, stdin: bytes | None, timeout: float | None) -> Outcome:
        """Run one command in the shell; returns once it ended (or was abandoned).

        Raises:
            SessionDead: the shell has no command pipe (it cannot run anything).
        """
        if self.proc.stdin is None:
            raise SessionDead("the session's shell has no command pipe: start a new session")
        stdin_pipe = self.proc.stdin
        self._seq += 1
        files = {ext: f"{self._seq}.{ext}" for ext in ("cmd", "in", "out", "err")}
        self.workdir.write(files["cmd"], command.encode())
        if stdin is not None:
            self.workdir.write(files["in"], stdin)
        q = {ext: shlex.quote(self.workdir.path(name)) for ext, name in files.items()}
        source = q["in"] if stdin is not None else "/dev/null"
        nonce, future = self._expect()
        token = secrets.token_hex(16)  # this command's tree: what it starts inherits it
        line = (
            f"\\builtin export {COMMAND_TOKEN}={token}; "
            f"\\builtin trap '\\builtin return {TIMEOUT_STATUS} 2>/dev/null' {INTERRUPT_SIGNAL}; "
            f"{{ \\builtin . {q['cmd']}; }} <{source} >{q['out']} 2>{q['err']}; "
            f'\\builtin printf \'\\036%s %d %s\\0\' {nonce} "$?" "$PWD"; '
            f"\\builtin unset {COMMAND_TOKEN}\n"
        )
        before = proctree.children(self.proc.pid)  # earlier background jobs: spared
        started = time.monotonic()
        self._interrupt.clear()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            await stdin_pipe.write(line.encode())
        interrupted = not await self._wait(future, timeout)
        if interrupted:
            await self._abandon(future, before, token)
        record = future.result() if future.done() else None
        self.workdir.unlink(files["cmd"], files["in"])
        if record is not None:
            self.cwd = record[1]
        return Outcome(
            status=record[0] if record is not None else None,
            cwd=record[1] if record is not None else None,
            interrupted=interrupted,
            shell_exited=record is None,
            duration=time.monotonic() - started,
            stdout=files["out"],
            stderr=files["err"],
        )

    async def _wait(
        self, future: asyncio.Future[tuple[int, str] | None], timeout: float | None
    ) -> bool:
        """Whether the command ended by itself (rather than by timeout or interrupt)."""
        cancel = asyncio.ensure_future(self._interrupt.wait())
        waiters: set[asyncio.Future[Any]] = {future, cancel}
        try:
            done, _ = await asyncio.wait(
                waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            return future in done
        finally:
            cancel.cancel()
            await asyncio.gather(cancel, return_exceptions=True)

    async def _abandon(
        self, future: asyncio.Future[tuple[int, str] | None], before: set[int], token: str
    ) -> None:
        """Interrupt the shell and kill the command's processes until the shell reports back:
        the shell's descendants born since it started, and whatever carries its token (those
        that left the tree with setsid and were re-parented)."""
        deadline = time.monotonic() + KILL_GRACE
        while not future.done() and time.monotonic() < deadline:
            proctree.signal_pids([self.proc.pid], INTERRUPT_SIGNAL)
            snap = proctree.snapshot(token, COMMAND_TOKEN)
            keep = set(before)
            for pid in before:
                keep |= snap.subtree(pid)
            proctree.signal_pids((snap.subtree(self.proc.pid) - keep) | snap.tagged, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(future), 0.05)
        # What the command forked while the last pass was signalling carries its token too.
        proctree.kill_tagged(token, COMMAND_TOKEN)
        if not future.done():
            log.warning("shell_unresponsive", pid=self.proc.pid)
            await self.kill()
            await asyncio.wait({future}, timeout=KILL_GRACE)
            return
        # A signal still pending in the shell must fire now, not in the next command.
        if not await self.sync(KILL_GRACE):
            await self.kill()
