"""Starting a program on a new pseudo-terminal, and finding its whole process tree.

The program gets the pty's slave as stdin/stdout/stderr and becomes the leader of a new session
with the pty as its controlling terminal (via util-linux ``setsid --ctty`` when present: Python's
subprocess cannot call TIOCSCTTY in the child without ``preexec_fn``, which is unsafe in a
threaded process). Spawn errors are raised as the contract's typed errors before anything runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import os
import secrets
import shutil
import struct
import subprocess
import termios
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager

from sandpod_contract.errors import CommandNotFound, InvalidCwd, SpawnFailed

__all__ = ["TOKEN_VAR", "TerminalSpec", "session_tree", "set_size", "spawn_on_pty"]

TOKEN_VAR = "SANDPOD_PTY_TOKEN"  # noqa: S105 - a variable name; its value marks the tree
IUTF8: int = getattr(termios, "IUTF8", 0o40000)  # the Linux value; Python < 3.13 lacks the name


@dataclasses.dataclass(frozen=True, slots=True)
class TerminalSpec:
    """A fully resolved terminal: id, argv, absolute cwd, complete environment, sizes."""

    pty_id: str
    argv: tuple[str, ...]
    cwd: str
    env: Mapping[str, str]
    cols: int
    rows: int
    buffer_bytes: int
    abandon_after: float | None = None
    token: str = dataclasses.field(default_factory=lambda: secrets.token_hex(16))
    # jail (local runtime): enter the sandbox's pid namespace around the fork, and the cgroup
    # holding exactly this terminal's processes (killed whole on close)
    around_fork: Callable[[], AbstractContextManager[None]] | None = None
    cgroup: str | None = None


@functools.cache
def _ctty_wrapper() -> str | None:
    """util-linux ``setsid`` if it has ``--ctty`` (it makes the pty the controlling terminal).

    Python's subprocess cannot call TIOCSCTTY in the child without ``preexec_fn`` (unsafe in a
    threaded process); ``setsid --ctty`` does setsid + TIOCSCTTY and then execs the program, so
    the pid stays the program's. Without it the program still gets a session, and interactive
    shells take the terminal themselves, but other programs run without a controlling terminal.
    """
    path = shutil.which("setsid")
    if path is None:
        return None
    try:
        out = subprocess.run(
            [path, "--help"], capture_output=True, timeout=5, check=False
        ).stdout.decode(errors="replace")
    except (OSError, subprocess.SubprocessError):
        return None
    return path if "--ctty" in out else None


def _check_program(argv: tuple[str, ...], cwd: str, env: Mapping[str, str]) -> None:
    """Raise the typed spawn error now: the wrapper would only print it on the terminal."""
    program = argv[0]
    if "/" in program:
        path = os.path.join(cwd, program)
        if not os.path.exists(path):
            raise CommandNotFound(f"{program!r}: no such file", program=program)
        if os.path.isdir(path) or not os.access(path, os.X_OK):
            raise SpawnFailed(
                f"cannot start {program!r}: Permission denied", program=program, errno=13
            )
    elif shutil.which(program, path=env.get("PATH", os.defpath)) is None:
        raise CommandNotFound(f"{program!r}: command not found", program=program)


def session_tree(leader: int, token: str | None = None, *, by_ids: bool = True) -> list[int]:
    """Live processes of ``leader``'s tree (the leader itself excluded).

    With ``by_ids``: its descendants, its process group and its session. Only exact while the
    leader is not reaped (until then its pid, group and session ids cannot be reused). With
    ``token``: every process whose environment holds ``TOKEN_VAR=token``, which finds the
    processes that left the session *and* were orphaned (``setsid cmd &``), and stays exact
    after the leader is reaped. A process can escape only by clearing its environment.
    """
    marker = f"{TOKEN_VAR}={token}".encode() if token else None
    children: dict[int, list[int]] = {}
    found: set[int] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if by_ids and (ids := _ids(entry.path)) is not None:
            ppid, pgrp, sid = ids
            children.setdefault(ppid, []).append(pid)
            if leader in (pgrp, sid):
                found.add(pid)
        if marker is not None and pid not in found and marker in _environ(entry.path):
            found.add(pid)
    stack = [leader]
    while stack:
        for child in children.get(stack.pop(), []):
            found.add(child)
            stack.append(child)
    found.discard(leader)
    return sorted(found)


def _ids(proc_dir: str) -> tuple[int, int, int] | None:
    """(ppid, pgrp, session) from ``/proc/<pid>/stat``, or None if it is gone."""
    try:
        with open(os.path.join(proc_dir, "stat"), "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    # the command name may contain spaces and parentheses: parse after the last ')'
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[1]), int(fields[2]), int(fields[3])


def _environ(proc_dir: str) -> list[bytes]:
    try:
        with open(os.path.join(proc_dir, "environ"), "rb") as fh:
            return fh.read().split(b"\0")
    except OSError:  # gone, or not ours to read
        return []


def set_size(fd: int, cols: int, rows: int) -> None:
    """Set the window size (TIOCSWINSZ); on the master it signals SIGWINCH to the foreground."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def spawn_on_pty(spec: TerminalSpec) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``spec``'s program on a new pty; returns it and the master fd (non-blocking).

    Raises:
        InvalidCwd: the cwd is missing or not a directory.
        CommandNotFound: the program does not exist.
        SpawnFailed: any other reason it could not start.
    """
    if not os.path.isdir(spec.cwd):
        raise InvalidCwd(f"working directory {spec.cwd!r} does not exist", cwd=spec.cwd)
    _check_program(spec.argv, spec.cwd, spec.env)
    master, slave = os.openpty()
    try:
        set_size(master, spec.cols, spec.rows)
        attrs = termios.tcgetattr(slave)
        attrs[0] |= IUTF8  # erase whole UTF-8 characters, as terminals do today
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        wrapper = _ctty_wrapper()
        argv = (wrapper, "--ctty", *spec.argv) if wrapper else spec.argv
        enter = spec.around_fork() if spec.around_fork else contextlib.nullcontext()
        with enter:
            popen = subprocess.Popen(
                argv,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=spec.cwd,
                env={**spec.env, TOKEN_VAR: spec.token},
                # setsid --ctty makes the session itself (it must not be a group leader, or it
                # would fork and the pid would not be the program's)
                start_new_session=wrapper is None,
                close_fds=True,
            )
    except OSError as exc:
        os.close(master)
        raise SpawnFailed(
            f"cannot start {spec.argv[0]!r}: {exc.strerror}",
            program=spec.argv[0],
            errno=exc.errno or 0,
        ) from exc
    finally:
        os.close(slave)  # only the program holds the slave: its exit gives us EIO
    os.set_blocking(master, False)
    return popen, master
