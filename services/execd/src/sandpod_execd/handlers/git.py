"""``git`` family: clone, checkout, status and diff by running the sandbox's ``git``.

Each verb builds argv and environment, runs git through :func:`~sandpod_execd.gitops.run_git` (a
supervised request task; its process tree dies on timeout, on cancel and at ``close()``), and
turns the output into the reply. Credentials never reach argv (see
:mod:`sandpod_execd.gitcreds`); every message that leaves a handler went through the request's
scrubber, including those of unexpected exceptions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import TypeVar, cast

from sandpod_contract.errors import (
    FsAlreadyExists,
    FsNotFound,
    FsPermissionDenied,
    GitError,
    GitTimeout,
    InvalidCwd,
    SandpodError,
)
from sandpod_contract.messages.git import (
    EntryState,
    GitCheckout,
    GitClone,
    GitDiff,
    GitEntry,
    GitHead,
    GitPatch,
    GitRepo,
    GitStatus,
)
from sandpod_execd.clientpath import client_path
from sandpod_execd.files.rooted import Root, split
from sandpod_execd.gitcreds import DEFAULT_USERNAME, Askpass, Scrubber, is_remote, split_credentials
from sandpod_execd.gitops import BASE_CONFIG, GitRun, git_env, parse_status, run_git
from sandpod_execd.handlers import Deps, Route
from sandpod_execd.process import Process
from sandpod_execd.sandbox import SandboxContext

__all__ = ["GitHandlers"]

T = TypeVar("T")

CLONE_TIMEOUT = 600.0  # seconds, when the request sets none
DEFAULT_TIMEOUT = 60.0
SMALL_OUTPUT = 64 * 1024  # rev-parse and friends
STATUS_OUTPUT = 16 * 1024 * 1024  # porcelain output read at most (entries beyond are cut)
MAX_ENTRIES = 20_000
ENTRY_OVERHEAD = 64  # bytes of a wire entry besides its paths
REPLY_OVERHEAD = 4096


class GitHandlers:
    def __init__(self, deps: Deps) -> None:
        self._budget = max(deps.max_payload - REPLY_OVERHEAD, 4096)
        self._running: set[Process] = set()  # git processes now, killed at close()

    def routes(self) -> dict[tuple[str, str], Route]:
        return {
            ("git", "clone"): Route(self.clone),
            ("git", "checkout"): Route(self.checkout),
            ("git", "status"): Route(self.status),
            ("git", "diff"): Route(self.diff),
        }

    async def close(self) -> None:
        """Kill running git commands (their requests then fail instead of holding shutdown)."""
        for proc in list(self._running):
            proc.kill_tree()

    # -- verbs ------------------------------------------------------------------------------------

    async def clone(self, sbx: SandboxContext, req: GitClone) -> GitHead:
        url, url_user, url_password = split_credentials(req.url)
        password = req.token or url_password
        auth = Askpass(req.username or url_user or DEFAULT_USERNAME, password) if password else None
        job = self._job(sbx, req.timeout or CLONE_TIMEOUT, [url_password, req.token])
        return await _scrubbed(job.scrub, self._clone(job, req, url=url, auth=auth))

    async def _clone(self, job: _Job, req: GitClone, *, url: str, auth: Askpass | None) -> GitHead:
        sbx = job.sbx
        shown = job.scrub(req.url)
        source = _source(sbx, url)
        target = _fresh_target(sbx, req.target or f"/workspace/{_repo_name(url)}")
        args = ["clone", "--quiet"]
        args += [f"--branch={req.branch}"] if req.branch else []
        args += [f"--depth={req.depth}"] if req.depth else []
        creds: contextlib.AbstractContextManager[dict[str, str]] = (
            auth.env() if auth else contextlib.nullcontext({})
        )
        with creds as auth_env:
            config = ("-c", "credential.helper=") if auth else ()  # never store the token
            await job.git(
                (*config, *args, "--", source, target),
                sbx.command_path(None),
                "git clone",
                env=auth_env,
                ref=req.branch,
                url=shown,
            )
        if req.ref:
            await job.git(
                ("checkout", "--quiet", "--detach", req.ref), target, "git checkout", ref=req.ref
            )
        commit, branch = await job.head(target)
        return GitHead(
            path=client_path(sbx.workspace, target),
            commit=commit,
            branch=branch,
            url=shown,
            duration=job.elapsed,
        )

    async def checkout(self, sbx: SandboxContext, req: GitCheckout) -> GitHead:
        job = self._job(sbx, req.timeout or DEFAULT_TIMEOUT)
        return await _scrubbed(job.scrub, self._checkout(job, req))

    async def _checkout(self, job: _Job, req: GitCheckout) -> GitHead:
        repo = job.sbx.command_path(req.path)
        args = ("-b", req.ref) if req.create else (req.ref, "--")
        await job.git(
            ("checkout", "--quiet", *args), repo, "git checkout", ref=req.ref, path=req.path
        )
        commit, branch = await job.head(repo)
        return GitHead(
            path=client_path(job.sbx.workspace, repo),
            commit=commit,
            branch=branch,
            duration=job.elapsed,
        )

    async def status(self, sbx: SandboxContext, req: GitRepo) -> GitStatus:
        job = self._job(sbx, req.timeout or DEFAULT_TIMEOUT)
        return await _scrubbed(job.scrub, self._status(job, req))

    async def _status(self, job: _Job, req: GitRepo) -> GitStatus:
        repo = job.sbx.command_path(req.path)
        top = await job.git(("rev-parse", "--show-toplevel"), repo, "git status", path=req.path)
        root = os.fsdecode(top.stdout.strip())
        run = await job.git(
            ("status", "--porcelain=v2", "--branch", "-z", "--untracked-files=all"),
            root,
            "git status",
            max_output=STATUS_OUTPUT,
            path=req.path,
        )
        st, truncated = parse_status(run.stdout, MAX_ENTRIES)
        truncated = truncated or run.stdout_size > len(run.stdout)
        entries: list[GitEntry] = []
        size = 0
        for e in st.entries:
            size += ENTRY_OVERHEAD + 4 * (len(e.path) + len(e.orig_path or ""))
            if size > self._budget:
                truncated = True
                break
            entries.append(
                GitEntry(
                    path=e.path,
                    state=cast(EntryState, e.state),
                    index=e.index,
                    worktree=e.worktree,
                    orig_path=e.orig_path,
                )
            )
        return GitStatus(
            path=client_path(job.sbx.workspace, root),
            commit=st.commit,
            branch=st.branch,
            upstream=st.upstream,
            ahead=st.ahead,
            behind=st.behind,
            entries=tuple(entries),
            truncated=truncated,
        )

    async def diff(self, sbx: SandboxContext, req: GitDiff) -> GitPatch:
        job = self._job(sbx, req.timeout or DEFAULT_TIMEOUT)
        return await _scrubbed(job.scrub, self._diff(job, req))

    async def _diff(self, job: _Job, req: GitDiff) -> GitPatch:
        sbx = job.sbx
        repo = sbx.command_path(req.path)
        cap = min(req.max_bytes or self._budget, self._budget)
        args = ["diff", "--no-color", "--no-ext-diff"] + (["--cached"] if req.staged else [])
        if req.file is not None:  # /workspace/... names a file by its alias; else repo-relative
            args += ["--", sbx.command_path(req.file) if req.file.startswith("/") else req.file]
        run = await job.git(tuple(args), repo, "git diff", max_output=cap, path=req.path)
        text = run.stdout.decode("utf-8", "replace")
        encoded = text.encode()
        cut = len(encoded) > cap  # U+FFFD takes 3 bytes where a stray byte took 1
        if cut:
            text = encoded[:cap].decode("utf-8", "ignore")
        return GitPatch(
            path=client_path(sbx.workspace, repo),
            text=text,
            size=run.stdout_size,
            truncated=cut or run.stdout_size > len(run.stdout),
        )

    def _job(
        self, sbx: SandboxContext, timeout: float, secrets: list[str | None] | None = None
    ) -> _Job:
        return _Job(sbx, Scrubber(secrets or []), time.monotonic(), timeout, self._running)


@dataclasses.dataclass(slots=True)
class _Job:
    """One request's git work: its sandbox, scrubber and deadline."""

    sbx: SandboxContext
    scrub: Scrubber
    started: float
    timeout: float
    running: set[Process]

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    async def git(
        self,
        args: tuple[str, ...],
        cwd: str,
        what: str,
        *,
        env: dict[str, str] | None = None,
        max_output: int = SMALL_OUTPUT,
        ref: str | None = None,
        url: str | None = None,
        path: str | None = None,
    ) -> GitRun:
        """Run ``git <args>`` in ``cwd`` within what is left of the request's timeout."""
        left = self.timeout - self.elapsed
        if left <= 0:
            raise GitTimeout(
                f"{what} exceeded its timeout of {self.timeout:g}s", timeout=self.timeout
            )
        try:  # a missing cwd is refused by command() (process runtime) or by the spawn (jail)
            cmd = self.sbx.command(
                ("git", *BASE_CONFIG, *args), None, cwd, git_env(env), stdin=False
            )
            return await run_git(
                cmd,
                scrub=self.scrub,
                timeout=left,
                max_output=max_output,
                running=self.running,
                what=what,
                ref=ref,
                url=url,
            )
        except GitTimeout:  # say the request's timeout, not what was left of it for this step
            raise GitTimeout(
                f"{what} exceeded its timeout of {self.timeout:g}s", timeout=self.timeout
            ) from None
        except InvalidCwd as exc:
            shown = path or client_path(self.sbx.workspace, cwd)
            raise FsNotFound(f"{shown!r} does not exist or is not a directory", path=shown) from exc

    async def head(self, repo: str) -> tuple[str, str | None]:
        """(HEAD's object id, its branch or None when detached)."""
        run = await self.git(("rev-parse", "HEAD", "--abbrev-ref", "HEAD"), repo, "git rev-parse")
        lines = run.stdout.decode("utf-8", "replace").split()
        commit = lines[0] if lines else ""
        branch = lines[1] if len(lines) > 1 and lines[1] != "HEAD" else None
        return commit, branch


def _source(sbx: SandboxContext, url: str) -> str:
    """Local paths (and file:// URLs) under /workspace resolve like every sandbox path."""
    if url.startswith("file:///workspace"):
        return "file://" + sbx.command_path(url[len("file://") :])
    return url if is_remote(url) else sbx.command_path(url)


def _fresh_target(sbx: SandboxContext, target: str) -> str:
    """The path to clone into, as git in the sandbox sees it; checked (from the host, resolved
    in the sandbox's root: see ``files.rooted``) to be absent or an empty directory."""
    host = sbx.jail.inside(target) if sbx.jail is not None else sbx.resolve_cwd(target)
    root = sbx.fs_root
    shown = client_path(sbx.workspace, host)
    try:
        with root.acting():  # the sandbox user's view: what it cannot reach, git cannot use
            fresh = _absent_or_empty(root, host)
    except PermissionError as exc:
        raise FsPermissionDenied(
            f"{shown!r}: permission denied to the sandbox's user; clone somewhere it may write "
            "(e.g. under /workspace)",
            path=shown,
        ) from exc
    if not fresh:
        shown = client_path(sbx.workspace, host)
        raise FsAlreadyExists(f"{shown!r} exists and is not an empty directory", path=shown)
    return sbx.command_path(target)


def _absent_or_empty(root: Root, path: str) -> bool:
    """Blocking (a few syscalls): whether ``path`` does not exist or is an empty directory
    (a link to one included; a dangling link exists) that the sandbox's user may write into.

    Raises:
        PermissionError: the sandbox's user may not look there, or may not write where the
            clone would go (run inside ``root.acting()``).
    """
    try:
        root.stat(path, follow=False)
    except (FileNotFoundError, NotADirectoryError):
        _writable(root, split(path)[0])
        return True
    try:
        fd = root.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK)
    except PermissionError:
        raise
    except OSError:
        return False  # a file or a dangling link: git would not clone there
    try:
        if os.listdir(fd):
            return False
    finally:
        os.close(fd)
    _writable(root, path)
    return True


def _writable(root: Root, path: str) -> None:
    """Raise PermissionError if ``path`` is a directory the fs identity in force may not write
    into (a missing one is left to git, which makes the leading directories)."""
    try:
        fd = root.open(path, os.O_PATH | os.O_DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        return
    try:
        if not os.access(f"/proc/self/fd/{fd}", os.W_OK | os.X_OK, effective_ids=True):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
    finally:
        os.close(fd)


async def _scrubbed(scrub: Callable[[str], str], work: Awaitable[T]) -> T:
    """Run ``work``; whatever it raises leaves with a scrubbed message and details."""
    try:
        return await work
    except SandpodError as exc:
        exc.message = scrub(exc.message)
        exc.details = {k: scrub(v) if isinstance(v, str) else v for k, v in exc.details.items()}
        exc.args = (exc.message,)
        raise exc from None
    except Exception as exc:  # unexpected: its text may hold anything, so only scrubbed text
        raise GitError(scrub(f"{type(exc).__name__}: {exc}")) from None


def _repo_name(url: str) -> str:
    """``app`` for .../app.git, git@host:org/app.git or /srv/app/."""
    path = urllib.parse.urlsplit(url).path if "://" in url else url.rpartition(":")[2]
    name = path.rstrip("/").rpartition("/")[2]
    name = name.removesuffix(".git")
    return name if name not in ("", ".", "..") else "repo"
