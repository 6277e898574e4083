"""git in the sandbox: clone, checkout, status and diff; typed failures; credentials scrubbed."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.server
import os
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from conftest import Execd, NatsServer, free_port, pids_with
from sandpod import AsyncSandbox, Sandbox
from sandpod.errors import (
    BadRequest,
    FsAlreadyExists,
    FsNotFound,
    GitAuthFailed,
    GitError,
    GitNetwork,
    GitNotFound,
    GitTimeout,
)

GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "T",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "T",
    "GIT_COMMITTER_EMAIL": "t@example.com",
    "LC_ALL": "C",
}


def git(cwd: Path, *args: str) -> str:
    """Run git on the host (to build fixtures and inspect results)."""
    out = subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, check=True, capture_output=True)
    return out.stdout.decode().strip()


@pytest.fixture
def origin(tmp_path: Path) -> dict[str, str]:
    """A local repository: main (2 commits) and feature (1 more); returns path and commit ids."""
    repo = tmp_path / "origin"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "a.txt").write_text("one\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-q", "-m", "first")
    first = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-b", "feature")
    (repo / "f.txt").write_text("feature\n")
    git(repo, "add", "f.txt")
    git(repo, "commit", "-q", "-m", "feature")
    feature = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    (repo / "b.txt").write_text("two\n")
    git(repo, "add", "b.txt")
    git(repo, "commit", "-q", "-m", "second")
    main = git(repo, "rev-parse", "HEAD")
    return {"path": str(repo), "first": first, "feature": feature, "main": main}


@pytest.fixture
def target(state_dir: Path) -> tuple[Path, str]:
    """A clone destination in the shared sandbox: (host path, client path)."""
    name = f"g-{uuid.uuid4().hex[:10]}"
    return state_dir / "workspaces" / "shared" / name, f"/workspace/{name}"


async def test_clone_file_url_and_plain_path(
    sbx: AsyncSandbox, origin: dict[str, str], target: tuple[Path, str]
) -> None:
    """Cloning by file:// URL and by plain path checks out the remote's HEAD branch."""
    host, path = target
    head = await sbx.git.clone(f"file://{origin['path']}", path)
    assert (head.path, head.branch, head.commit) == (path, "main", origin["main"])
    assert (host / "b.txt").read_text() == "two\n"
    head2 = await sbx.git.clone(origin["path"], f"{path}-plain")
    assert head2.commit == origin["main"] and head2.url == origin["path"]


async def test_clone_from_a_repository_inside_the_workspace(
    sbx: AsyncSandbox, origin: dict[str, str], target: tuple[Path, str]
) -> None:
    """/workspace paths, relative paths and file:///workspace URLs resolve into the workspace."""
    _, path = target
    await sbx.git.clone(origin["path"], path)
    name = path.removeprefix("/workspace/")
    for i, url in enumerate((f"file://{path}", name, path)):
        head = await sbx.git.clone(url, f"{path}-copy{i}")
        assert head.commit == origin["main"], url


async def test_clone_default_target_is_named_after_the_repository(
    sbx: AsyncSandbox, origin: dict[str, str], state_dir: Path
) -> None:
    """Without a target the clone lands in /workspace/<repository name>."""
    name = f"r-{uuid.uuid4().hex[:8]}"
    bare = Path(origin["path"]).parent / f"{name}.git"
    git(Path(origin["path"]).parent, "clone", "-q", "--bare", origin["path"], str(bare))
    head = await sbx.git.clone(f"file://{bare}")
    assert head.path == f"/workspace/{name}"
    assert (state_dir / "workspaces" / "shared" / name / "a.txt").exists()


async def test_clone_branch_with_depth(
    sbx: AsyncSandbox, origin: dict[str, str], target: tuple[Path, str]
) -> None:
    """branch + depth=1 gives that branch with exactly one commit of history."""
    _, path = target
    head = await sbx.git.clone(f"file://{origin['path']}", path, branch="feature", depth=1)
    assert (head.branch, head.commit) == ("feature", origin["feature"])
    r = await sbx.exec(path, ["git", "rev-list", "--count", "HEAD"])
    assert r.stdout.strip() == "1"


async def test_clone_then_ref_is_a_detached_checkout(
    sbx: AsyncSandbox, origin: dict[str, str], target: tuple[Path, str]
) -> None:
    """ref checks out a commit after cloning, leaving HEAD detached."""
    host, path = target
    head = await sbx.git.clone(origin["path"], path, ref=origin["first"])
    assert (head.branch, head.commit) == (None, origin["first"])
    assert not (host / "b.txt").exists()


async def test_checkout_branch_new_branch_and_missing_ref(
    sbx: AsyncSandbox, origin: dict[str, str], target: tuple[Path, str]
) -> None:
    """checkout switches branches, creates one with create=True, and types a missing ref."""
    _, path = target
    await sbx.git.clone(origin["path"], path)
    head = await sbx.git.checkout(path, "feature")
    assert (head.branch, head.commit) == ("feature", origin["feature"])
    head = await sbx.git.checkout(path, "topic", create=True)
    assert (head.branch, head.commit) == ("topic", origin["feature"])
    with pytest.raises(GitNotFound) as info:
        await sbx.git.checkout(path, "no-such-ref")
    assert info.value.details["ref"] == "no-such-ref"


async def test_status_and_diff_after_changes(
    sbx: AsyncSandbox, origin: dict[str, str], target: tuple[Path, str]
) -> None:
    """status lists modified, staged and untracked paths with ahead/behind; diff shows them."""
    host, path = target
    await sbx.git.clone(origin["path"], path)
    clean = await sbx.git.status(path)
    assert clean.clean and (clean.branch, clean.upstream) == ("main", "origin/main")
    assert (clean.ahead, clean.behind) == (0, 0)
    (host / "a.txt").write_text("changed\n")
    (host / "b.txt").write_text("staged\n")
    (host / "new dir").mkdir()
    (host / "new dir" / "n.txt").write_text("new\n")
    assert (await sbx.exec(path, ["git", "add", "b.txt"])).exit_code == 0
    st = await sbx.git.status(f"{path}/new dir")  # any directory inside the repository works
    assert st.path == path
    got = {e.path: (e.state, e.index, e.worktree) for e in st.entries}
    assert got == {
        "a.txt": ("modified", ".", "M"),
        "b.txt": ("modified", "M", "."),
        "new dir/n.txt": ("untracked", "?", "?"),
    }
    work = await sbx.git.diff(path)
    assert "-one\n+changed\n" in work.text and "b.txt" not in work.text
    staged = await sbx.git.diff(path, staged=True)
    assert "-two\n+staged\n" in staged.text and "a.txt" not in staged.text
    only_a = await sbx.git.diff(path, "a.txt")
    assert only_a.text == work.text and not only_a.truncated
    cut = await sbx.git.diff(path, max_bytes=10)
    assert cut.truncated and len(cut.text) == 10 and cut.size == len(work.text)


async def test_status_ahead_behind_and_rename(
    sbx: AsyncSandbox, origin: dict[str, str], target: tuple[Path, str]
) -> None:
    """A local commit is ahead, a fetched remote one behind; a staged rename shows both paths."""
    host, path = target
    await sbx.git.clone(origin["path"], path)
    (host / "local.txt").write_text("x")
    r = await sbx.exec(
        path,
        "git add local.txt && git -c user.name=a -c user.email=a@b "
        "commit -qm local && git mv a.txt moved.txt",
    )
    assert r.exit_code == 0, r.stderr
    (Path(origin["path"]) / "c.txt").write_text("c")
    git(Path(origin["path"]), "add", "c.txt")
    git(Path(origin["path"]), "commit", "-q", "-m", "third")
    assert (await sbx.exec(path, ["git", "fetch", "-q"])).exit_code == 0
    st = await sbx.git.status(path)
    assert (st.ahead, st.behind) == (1, 1)
    assert [(e.path, e.state, e.orig_path) for e in st.entries] == [
        ("moved.txt", "renamed", "a.txt")
    ]


async def test_not_found_for_missing_repository_branch_and_paths(
    sbx: AsyncSandbox, origin: dict[str, str], target: tuple[Path, str], tmp_path: Path
) -> None:
    """Missing repository, missing branch, a directory that is no repository: git.not_found."""
    _, path = target
    with pytest.raises(GitNotFound):
        await sbx.git.clone(str(tmp_path / "nope"), path)
    with pytest.raises(GitNotFound):
        await sbx.git.clone(f"file://{tmp_path}/nope.git", path)
    with pytest.raises(GitNotFound) as info:
        await sbx.git.clone(origin["path"], path, branch="no-such-branch")
    assert info.value.details["ref"] == "no-such-branch"
    with pytest.raises(GitNotFound):
        await sbx.git.status(str(tmp_path))
    with pytest.raises(FsNotFound):
        await sbx.git.status(f"{path}/missing")


async def test_network_error_for_a_closed_port(sbx: AsyncSandbox, target: tuple[Path, str]) -> None:
    """Nothing listening on the port: git.network, retryable."""
    _, path = target
    with pytest.raises(GitNetwork) as info:
        await sbx.git.clone(f"http://127.0.0.1:{free_port()}/x.git", path, timeout=30)
    assert info.value.retryable


class Recorder:
    """What the fake git server saw: Authorization headers, and whether argv leaked a secret."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.auth: list[str] = []
        self.argv_leaks: list[list[str]] = []

    def check_argv(self) -> None:
        for proc in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if any(self.secret in arg for arg in proc.info["cmdline"] or []):
                    self.argv_leaks.append(proc.info["cmdline"])


@contextlib.contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[int]:
    """An HTTP server with ``handler`` on a free loopback port, in a thread; yields the port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@contextlib.contextmanager
def basic_auth_server(secret: str) -> Iterator[tuple[int, Recorder]]:
    """An HTTP server on 127.0.0.1 that answers every request 401 Basic (a thread)."""
    seen = Recorder(secret)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.check_argv()  # git is waiting on us right now: is the secret in anyone's argv?
            if header := self.headers.get("Authorization"):
                seen.auth.append(header)
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="sandpod-test"')
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    with serving(Handler) as port:
        yield port, seen


async def test_auth_failed_and_credentials_never_leak(
    sbx: AsyncSandbox, target: tuple[Path, str], shared_execd: Execd
) -> None:
    """401 is git.auth_failed; the password reaches git (askpass), never argv, errors or logs."""
    _, path = target
    password = f"pw-{uuid.uuid4().hex}"
    with basic_auth_server(password) as (port, seen):
        with pytest.raises(GitAuthFailed) as info:
            await sbx.git.clone(f"http://alice:{password}@127.0.0.1:{port}/x.git", path)
        with pytest.raises(GitAuthFailed) as info2:
            await sbx.git.clone(f"http://127.0.0.1:{port}/y.git", path, token=password)
    expected = base64.b64encode(f"alice:{password}".encode()).decode()
    assert f"Basic {expected}" in seen.auth  # the credentials were really used
    assert seen.argv_leaks == []
    for err in (info.value, info2.value):
        assert password not in str(err) and password not in repr(err.details)
        assert password not in str(err.__cause__) and password not in str(err.__context__)
    assert "alice:" not in str(info.value) and "***@" in info.value.details["url"]
    assert password not in shared_execd.log.read_text()


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@contextlib.contextmanager
def dumb_http_server(repo: Path, secret: str) -> Iterator[tuple[int, Recorder]]:
    """Serve the bare repository ``repo`` over git's dumb HTTP protocol (a thread), only to
    requests whose Basic credentials carry ``secret`` as the password (401 otherwise)."""
    seen = Recorder(secret)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.check_argv()
            header = self.headers.get("Authorization", "")
            if header:
                seen.auth.append(header)
            _, _, password = base64.b64decode(header.removeprefix("Basic ")).decode().partition(":")
            if password != secret:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="sandpod-test"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            # /repo.git/<file>[?query]: the query (smart protocol) is ignored, so git falls
            # back to fetching plain files
            relative = self.path.split("?", 1)[0].split("/", 2)[-1]
            file = (repo / relative).resolve()
            if not file.is_relative_to(repo) or not file.is_file():
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = file.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    with serving(Handler) as port:
        yield port, seen


async def test_authenticated_clone_succeeds_and_keeps_no_credentials(
    sbx: AsyncSandbox,
    origin: dict[str, str],
    target: tuple[Path, str],
    tmp_path: Path,
    shared_execd: Execd,
) -> None:
    """A token (or URL credentials) opens a protected remote; afterwards it is nowhere: not in
    .git/config, the remote URL, a reply, argv or execd's log."""
    host, path = target
    bare = tmp_path / "bare.git"
    git(tmp_path, "clone", "-q", "--bare", origin["path"], str(bare))
    git(bare, "update-server-info")  # what the dumb protocol reads
    token = f"tok-{uuid.uuid4().hex}"
    with dumb_http_server(bare.resolve(), token) as (port, seen):
        clean = f"http://127.0.0.1:{port}/repo.git"
        head = await sbx.git.clone(clean, path, token=token)
        head2 = await sbx.git.clone(
            f"http://alice:{token}@127.0.0.1:{port}/repo.git", f"{path}-url"
        )
        status = await sbx.git.status(path)
    assert (head.branch, head.commit) == ("main", origin["main"])
    assert (head2.branch, head2.commit) == ("main", origin["main"])
    expected = base64.b64encode(f"x-access-token:{token}".encode()).decode()
    assert f"Basic {expected}" in seen.auth  # the token really was what opened it
    assert seen.argv_leaks == []
    for clone in (host, host.with_name(host.name + "-url")):
        assert (clone / "b.txt").read_text() == "two\n"
        assert token not in (clone / ".git" / "config").read_text()
        assert git(clone, "remote", "get-url", "origin") == clean
    for reply in (head, head2, status):
        assert token not in repr(reply)
    assert token not in shared_execd.log.read_text()


async def test_clone_timeout_kills_git(sbx: AsyncSandbox, target: tuple[Path, str]) -> None:
    """A remote that never answers: git.timeout after the timeout, and no git process left."""
    _, path = target
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # connections queue, nobody answers
        port = silent.getsockname()[1]
        url = f"http://127.0.0.1:{port}/x.git"
        with pytest.raises(GitTimeout) as info:
            await sbx.git.clone(url, path, timeout=1)
        # Checked while the remote still hangs (closing it would end a stray helper by itself):
        # git and its transport helper name the URL on their command lines; SIGKILLed ones are
        # gone within moments, a survivor would stay.
        deadline = asyncio.get_running_loop().time() + 10
        while left := [p for p in pids_with(url) if _running(p)]:
            assert asyncio.get_running_loop().time() < deadline, f"git processes left: {left}"
            await asyncio.sleep(0.05)
    assert info.value.retryable and info.value.details["timeout"] == 1


async def test_hostile_input(
    sbx: AsyncSandbox, origin: dict[str, str], target: tuple[Path, str], tmp_path: Path
) -> None:
    """Option-like URLs and refs are refused; ext:: never runs; a non-empty target is refused."""
    host, path = target
    with pytest.raises(BadRequest):
        await sbx.git.clone("--upload-pack=touch /tmp/x", path)
    with pytest.raises(BadRequest):
        await sbx.git.clone(origin["path"], path, branch="-x")
    marker = tmp_path / "ext-ran"
    with pytest.raises(GitError):
        await sbx.git.clone(f"ext::sh -c touch% {marker}", path)
    assert not marker.exists()
    host.mkdir()
    (host / "keep").write_text("x")
    with pytest.raises(FsAlreadyExists):
        await sbx.git.clone(origin["path"], path)


def test_sync_sdk_git(
    nats: NatsServer, shared_execd: Execd, origin: dict[str, str], target: tuple[Path, str]
) -> None:
    """The blocking SDK clones and reports status."""
    _, path = target
    with Sandbox.connect("shared", nats_url=nats.url) as sbx:
        head = sbx.git.clone(origin["path"], path, depth=1)
        assert head.branch == "main"
        assert sbx.git.status(path).clean
        assert sbx.git.diff(path).text == ""
