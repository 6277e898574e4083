"""Running the sandbox's ``git`` binary and making sense of what it says.

Every git command runs like an exec (:mod:`sandpod_execd.process`: its own session, pipes on the
loop, the whole tree killed on timeout), with an environment that makes it non-interactive and
predictable: ``GIT_TERMINAL_PROMPT=0`` (never wait for a password), ``LC_ALL=C`` (untranslated
messages), ssh in batch mode, no pager. git reports every failure with exit code 128 and a message,
so the message is the only signal there is: :func:`classify` maps it to the contract's typed
errors. Everything that leaves this module (error messages, details, output) has gone through the
request's :class:`~sandpod_execd.gitcreds.Scrubber` first.

:func:`parse_status` turns ``git status --porcelain=v2 --branch -z`` into plain data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from sandpod_contract.errors import (
    CommandNotFound,
    GitAuthFailed,
    GitError,
    GitNetwork,
    GitNotFound,
    GitTimeout,
    InvalidCwd,
    SpawnFailed,
)
from sandpod_execd.oneshot import run_to_completion
from sandpod_execd.process import Command, Process, spawn

__all__ = ["GitRun", "Status", "StatusEntry", "classify", "parse_status", "run_git"]

NONINTERACTIVE = {
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_SSH_COMMAND": "ssh -o BatchMode=yes",
    "GIT_PAGER": "cat",
    "LC_ALL": "C",
    "LANGUAGE": "C",
}
# Safety and liveness for every command: no ext:: transport (it runs arbitrary commands), and
# give up on a transfer slower than 1 KB/s for 60 s (the request's timeout still applies).
BASE_CONFIG = (
    "-c",
    "protocol.ext.allow=never",
    "-c",
    "http.lowSpeedLimit=1000",
    "-c",
    "http.lowSpeedTime=60",
)
STDERR_TAIL = 2000  # characters of git's stderr kept in a git.error message

_AUTH = (
    "authentication failed",
    "could not read username",
    "could not read password",
    "terminal prompts disabled",
    "permission denied (publickey",
    "access denied",
    "returned error: 401",
    "returned error: 403",
    "invalid username or password",
    "host key verification failed",
)
_REF_MISSING = (
    "not found in upstream",
    "did not match any file(s) known to git",
    "invalid reference",
    "unknown revision",
    "not a commit",
    "couldn't find remote ref",
    "not a valid object name",
)
_REPO_MISSING = (
    "repository not found",
    "does not appear to be a git repository",
    "does not exist",
    "returned error: 404",
    "not a git repository",
)
_NETWORK = (
    "could not resolve host",
    "could not resolve hostname",
    "failed to connect",
    "couldn't connect",
    "connection refused",
    "connection timed out",
    "network is unreachable",
    "operation timed out",
    "operation too slow",
    "connection reset",
    "early eof",
    "the remote end hung up",
    "unable to access",
    "could not read from remote",
)


@dataclasses.dataclass(frozen=True, slots=True)
class GitRun:
    stdout: bytes
    stderr: str  # scrubbed
    stdout_size: int  # bytes git wrote (more than len(stdout) when capped)
    duration: float


def classify(
    stderr: str, *, what: str, code: int, ref: str | None = None, url: str | None = None
) -> GitError:
    """The typed error for a failed git command (``stderr`` already scrubbed)."""
    low = stderr.lower()
    tail = stderr.strip()[-STDERR_TAIL:] or f"exit code {code}"
    last = tail.splitlines()[-1] if tail else ""
    if any(s in low for s in _AUTH):
        return GitAuthFailed(f"{what}: authentication failed: {last}", url=url)
    if any(s in low for s in _REF_MISSING):
        return GitNotFound(f"{what}: {last}", ref=ref)
    if any(s in low for s in _REPO_MISSING):
        return GitNotFound(f"{what}: {last}", url=url)
    if any(s in low for s in _NETWORK):
        return GitNetwork(f"{what}: cannot reach the remote: {last}", url=url)
    return GitError(f"{what} failed (exit {code}): {tail}", exit_code=code)


async def run_git(
    command: Command,
    *,
    scrub: Callable[[str], str],
    timeout: float,
    max_output: int,
    running: set[Process],
    what: str,
    ref: str | None = None,
    url: str | None = None,
) -> GitRun:
    """Run one git command to completion; raise the typed error if it failed.

    Raises:
        GitTimeout: ``timeout`` expired (the whole process tree was killed).
        GitAuthFailed, GitNotFound, GitNetwork, GitError: git failed (see :func:`classify`).
        InvalidCwd: the working directory does not exist (raised by spawn).
    """
    try:
        proc = spawn(command)
    except CommandNotFound:
        raise GitError("git is not installed in this sandbox") from None
    except InvalidCwd:
        raise
    except SpawnFailed as exc:  # the kernel refused: scrub whatever it says
        raise GitError(scrub(f"cannot run git: {exc.message}")) from None
    running.add(proc)
    try:
        outcome = await run_to_completion(
            proc, stdin=None, timeout=timeout, max_output=max_output, pipe_grace=0.2
        )
    finally:
        running.discard(proc)
    stderr = scrub(outcome.stderr.value().decode("utf-8", "replace"))
    if outcome.timed_out:
        raise GitTimeout(f"{what} exceeded its timeout of {timeout:g}s", timeout=timeout)
    if outcome.returncode != 0:
        raise classify(stderr, what=what, code=outcome.returncode, ref=ref, url=url)
    return GitRun(outcome.stdout.value(), stderr, outcome.stdout.seen, outcome.duration)


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    return {**NONINTERACTIVE, **(extra or {})}


@dataclasses.dataclass(frozen=True, slots=True)
class StatusEntry:
    path: str
    state: str
    index: str
    worktree: str
    orig_path: str | None = None


@dataclasses.dataclass(slots=True)
class Status:
    commit: str | None = None
    branch: str | None = None
    upstream: str | None = None
    ahead: int = 0
    behind: int = 0
    entries: list[StatusEntry] = dataclasses.field(default_factory=list)


def _state(xy: str) -> str:
    x, y = xy[0], xy[1]
    for letter, state in (
        ("R", "renamed"),
        ("C", "copied"),
        ("A", "added"),
        ("D", "deleted"),
        ("T", "type_changed"),
    ):
        if letter in (x, y):
            return state
    return "modified"


def _path(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def parse_status(out: bytes, max_entries: int) -> tuple[Status, bool]:
    """Parse ``git status --porcelain=v2 --branch -z``; ``(status, truncated)``."""
    st = Status()
    records = out.split(b"\0")
    i = 0
    truncated = False
    while i < len(records):
        rec = records[i]
        i += 1
        if not rec:
            continue
        if rec.startswith(b"# "):
            _header(st, rec[2:].decode("utf-8", "replace"))
            continue
        if len(st.entries) >= max_entries:
            truncated = True
            continue
        kind = rec[:1]
        if kind == b"1":  # 1 XY sub mH mI mW hH hI path
            f = rec.split(b" ", 8)
            xy = f[1].decode()
            st.entries.append(StatusEntry(_path(f[8]), _state(xy), xy[0], xy[1]))
        elif kind == b"2":  # 2 XY sub mH mI mW hH hI Xscore path NUL origPath
            f = rec.split(b" ", 9)
            xy = f[1].decode()
            orig = _path(records[i]) if i < len(records) else None
            i += 1
            st.entries.append(StatusEntry(_path(f[9]), _state(xy), xy[0], xy[1], orig))
        elif kind == b"u":  # u XY sub m1 m2 m3 mW h1 h2 h3 path
            f = rec.split(b" ", 10)
            xy = f[1].decode()
            st.entries.append(StatusEntry(_path(f[10]), "conflicted", xy[0], xy[1]))
        elif kind in (b"?", b"!"):
            state = "untracked" if kind == b"?" else "ignored"
            mark = kind.decode()
            st.entries.append(StatusEntry(_path(rec[2:]), state, mark, mark))
    return st, truncated


def _header(st: Status, line: str) -> None:
    key, _, value = line.partition(" ")
    if key == "branch.oid":
        st.commit = None if value == "(initial)" else value
    elif key == "branch.head":
        st.branch = None if value == "(detached)" else value
    elif key == "branch.upstream":
        st.upstream = value
    elif key == "branch.ab":
        ahead, _, behind = value.partition(" ")
        st.ahead, st.behind = abs(int(ahead)), abs(int(behind))
