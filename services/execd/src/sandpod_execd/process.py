"""Spawning and controlling one command, knowing nothing about NATS.

A command runs as the leader of its own session and process group (``setsid``), with its stdout and
stderr on enlarged pipes we read without blocking, and its stdin on a pipe we write without
blocking. Exit is observed through a pidfd, so no watcher thread exists per child. Killing a
command kills its whole tree: the process group plus any descendant that left it with setsid
(found by walking ``/proc``), so grandchildren never outlive a timeout or a cancel.

This is the ``process`` runtime: **no isolation**. Commands run on the host as execd's user. In the
local runtime a :class:`~sandpod_execd.jail.Jail` builds the Command: its argv enters the sandbox,
``around_fork`` wraps the fork (into the sandbox's pid namespace) and ``cgroup`` holds exactly
this command's processes, which ``kill_tree`` also kills (strays re-parented inside the sandbox
are no longer our descendants).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import fcntl
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path

from sandpod_contract.errors import CommandNotFound, InvalidCwd, SpawnFailed
from sandpod_service.procs import descendants

__all__ = ["Command", "PipeReader", "PipeWriter", "Process", "descendants", "kill_cgroup", "spawn"]

TREE_TOKEN = "SANDPOD_TREE_ID"  # noqa: S105 - a variable name, not a secret
F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ, not exported by Python 3.11
PIPE_SIZE = 1024 * 1024
KILL_PASSES = 16  # kill_tree's scans, each of which may find children forked during the last


@dataclasses.dataclass(frozen=True, slots=True)
class Command:
    """A fully resolved command: argv, absolute cwd, complete environment."""

    argv: tuple[str, ...]
    cwd: str
    env: Mapping[str, str]
    stdin: bool  # give the command a stdin pipe (else /dev/null)
    around_fork: Callable[[], AbstractContextManager[None]] | None = None  # jail: enter its pid ns
    cgroup: str | None = None  # jail: a cgroup directory holding only this command's processes
    token: str | None = None  # value of TREE_TOKEN in its environment: finds re-parented orphans


class PipeReader:
    """Non-blocking reads from a pipe's read end on the running loop."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self.fd = fd
        self.closed = False

    async def read(self, size: int) -> bytes:
        """Up to ``size`` bytes as soon as any are available; ``b""`` at EOF."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                return os.read(self.fd, size)
            except BlockingIOError:
                pass
            ready = loop.create_future()
            loop.add_reader(self.fd, _set_once, ready)
            try:
                await ready
            finally:
                loop.remove_reader(self.fd)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self.fd)


class PipeWriter:
    """Non-blocking writes to a pipe's write end; ``write`` returns once all bytes are in."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self.fd = fd
        self.closed = False

    async def write(self, data: bytes) -> None:
        """Write all of ``data``. Raises BrokenPipeError if the reader went away."""
        loop = asyncio.get_running_loop()
        view = memoryview(data)
        while view:
            if self.closed:
                raise BrokenPipeError(errno.EPIPE, "stdin is closed")
            try:
                n = os.write(self.fd, view)
                view = view[n:]
                continue
            except BlockingIOError:
                pass
            ready = loop.create_future()
            loop.add_writer(self.fd, _set_once, ready)
            try:
                await ready
            finally:
                loop.remove_writer(self.fd)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self.fd)


def _set_once(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Process:
    """A running command: its pipes, exit status and tree-wide kill."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        stdout: int,
        stderr: int,
        stdin: int | None,
        *,
        cgroup: str | None = None,
        token: str | None = None,
    ) -> None:
        self.pid = popen.pid
        self.cgroup = cgroup
        self.token = token
        self._popen = popen
        self.stdout = PipeReader(stdout)
        self.stderr = PipeReader(stderr)
        self.stdin = PipeWriter(stdin) if stdin is not None else None
        self.started = time.monotonic()
        self.returncode: int | None = None
        self._exited = asyncio.get_running_loop().create_future()
        self._watch()

    def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            pidfd = os.pidfd_open(self.pid)
        except OSError:  # very old kernel: poll instead
            loop.call_later(0.01, self._poll)
            return

        def on_exit() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            self._reap()

        loop.add_reader(pidfd, on_exit)

    def _poll(self) -> None:
        if not self._reap():
            asyncio.get_running_loop().call_later(0.01, self._poll)

    def _reap(self) -> bool:
        if self._popen.poll() is None:
            return False
        self.returncode = self._popen.returncode
        if not self._exited.done():
            self._exited.set_result(self.returncode)
        return True

    @property
    def running(self) -> bool:
        return self.returncode is None

    async def wait(self) -> int:
        """Wait for exit; the raw return code (negative: killed by that signal)."""
        return await asyncio.shield(self._exited)

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the command's process group (and the leader if it left the group)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)
        if self.running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, sig)

    def kill_tree(self) -> None:
        """SIGKILL the group, every descendant (setsid'd ones included) and every process
        carrying the command's tree token (orphans re-parented away from the tree).

        Scans repeat until one finds nobody new (at most ``KILL_PASSES``): a member alive
        during a scan may fork a child that leaves the group before the signals land, and
        only the next scan sees it. A process with SIGKILL pending forks no more.
        """
        killed: set[int] = set()
        for _ in range(KILL_PASSES):
            self.signal_group(signal.SIGKILL)
            fresh = set(descendants(self.pid)) - killed
            if self.token is not None:
                fresh |= set(tagged(TREE_TOKEN, self.token)) - killed
            if not fresh:
                break
            for pid in fresh:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            killed |= fresh
        if self.cgroup is not None:
            kill_cgroup(self.cgroup)

    def close_pipes(self) -> None:
        self.stdout.close()
        self.stderr.close()
        if self.stdin is not None:
            self.stdin.close()


def tagged(name: str, value: str) -> list[int]:
    """Live processes whose environment holds ``name=value`` (children inherit it, so this finds
    a tree's members even after they left its group and were re-parented)."""
    needle = f"\0{name}={value}\0".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                env = b"\0" + f.read() + b"\0"
        except OSError:
            continue
        if needle in env:
            found.append(int(entry.name))
    return found


def kill_cgroup(path: str, passes: int = 64) -> None:
    """SIGKILL every process in the cgroup directory ``path`` (gone already: nothing to do).

    cgroup v2 has ``cgroup.kill``. On v1, each pass opens a pidfd per listed pid, re-reads the
    list and signals the pids still listed, so a recycled pid is never hit; a process forked
    during a pass shows up in the next one (a process with SIGKILL pending cannot fork), and
    the passes end when nothing new appears.
    """
    with contextlib.suppress(OSError):
        Path(path, "cgroup.kill").write_text("1")
        return
    procs = Path(path, "cgroup.procs")
    signalled: set[int] = set()
    for _ in range(passes):
        try:
            fresh = {int(p) for p in procs.read_text().split()} - signalled
        except OSError:
            return
        if not fresh:
            return
        fds = {}
        for pid in fresh:
            with contextlib.suppress(OSError):
                fds[pid] = os.pidfd_open(pid)
        try:
            still = {int(p) for p in procs.read_text().split()}
            for pid, fd in fds.items():
                if pid in still:
                    with contextlib.suppress(OSError):
                        signal.pidfd_send_signal(fd, signal.SIGKILL)
        except OSError:
            return
        finally:
            for fd in fds.values():
                os.close(fd)
        signalled |= fresh


def _pipe() -> tuple[int, int]:
    r, w = os.pipe2(os.O_CLOEXEC)
    with contextlib.suppress(OSError):  # larger pipes: fewer wake-ups on bulk output
        fcntl.fcntl(r, F_SETPIPE_SZ, PIPE_SIZE)
    return r, w


def spawn(cmd: Command) -> Process:
    """Start ``cmd`` in a new session; must be called on the event loop.

    Raises:
        InvalidCwd: ``cmd.cwd`` is missing or not a directory.
        CommandNotFound: the program does not exist.
        SpawnFailed: any other reason the kernel refused (permission, exec format...).
    """
    if not os.path.isdir(cmd.cwd):
        raise InvalidCwd(f"working directory {cmd.cwd!r} does not exist", cwd=cmd.cwd)
    out_r, out_w = _pipe()
    err_r, err_w = _pipe()
    in_r, in_w = _pipe() if cmd.stdin else (None, None)
    try:
        with cmd.around_fork() if cmd.around_fork else contextlib.nullcontext():
            popen = subprocess.Popen(
                cmd.argv,
                stdin=in_r if in_r is not None else subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                cwd=cmd.cwd,
                env=dict(cmd.env),
                start_new_session=True,
                close_fds=True,
            )
    except FileNotFoundError as exc:
        for fd in (out_r, err_r, in_w):
            if fd is not None:
                os.close(fd)
        raise CommandNotFound(f"{cmd.argv[0]!r}: command not found", program=cmd.argv[0]) from exc
    except OSError as exc:
        for fd in (out_r, err_r, in_w):
            if fd is not None:
                os.close(fd)
        raise SpawnFailed(
            f"cannot start {cmd.argv[0]!r}: {exc.strerror}",
            program=cmd.argv[0],
            errno=exc.errno or 0,
        ) from exc
    finally:
        for fd in (out_w, err_w, in_r):
            if fd is not None:
                os.close(fd)
    return Process(popen, out_r, err_r, in_w, cgroup=cmd.cgroup, token=cmd.token)
