"""The fs resolver on a temporary tree standing in for a sandbox's root: links, ``..`` and
changes through symlinked parents stay inside it (the fast layer of ``test_fs_jail``)."""

from __future__ import annotations

import ctypes
import errno
import os
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandpod_contract.errors import FsError
from sandpod_execd import sysmetrics
from sandpod_execd.files import listing, ops, rooted, search
from sandpod_execd.files.atomic import AtomicFile
from sandpod_execd.files.listing import Budget
from sandpod_execd.files.paths import Paths, guard
from sandpod_execd.files.rooted import (
    RESOLVE_IN_ROOT,
    RESOLVE_NO_MAGICLINKS,
    Root,
    openat2,
    openat2_available,
    tree,
)
from sandpod_execd.pathglob import GlobSet
from sandpod_execd.watching import Watcher
from sandpod_service import openat2 as openat2_mod

pytestmark = pytest.mark.skipif(
    not openat2_available(), reason="this kernel has no openat2: run on Linux >= 5.6"
)


@pytest.fixture
def world(tmp_path: Path) -> tuple[Path, Path]:
    """``(root, outside)``: a sandbox root whose links all aim at ``outside``'s twin
    ``root/outside``; ``outside`` (the "host") holds files that must never be touched."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    for top, content in ((outside, "host"), (root / "outside", "sandbox")):
        top.mkdir(parents=True)
        for name in ("f", "victim", "modeme"):
            (top / name).write_text(content)
            (top / name).chmod(0o644)
    (root / "workspace").mkdir()
    (root / "workspace" / "abs").symlink_to(f"{outside}")  # the host path: inside the root here
    (root / "workspace" / "rel").symlink_to("../../../../outside")
    (root / "workspace" / "top").symlink_to("/")
    (root / "outside" / "sub").mkdir()
    (root / "outside" / "sub" / "up").symlink_to("/")
    Path(root, str(outside).lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    Path(root, str(outside).lstrip("/")).symlink_to("/outside")
    return root, outside


@pytest.fixture
def root(world: tuple[Path, Path]) -> Iterator[Root]:
    r = Root(str(world[0]), jailed=True)
    yield r
    r.close()


def untouched(outside: Path) -> None:
    assert sorted(p.name for p in outside.iterdir()) == ["f", "modeme", "victim"]
    for p in outside.iterdir():
        assert p.read_text() == "host" and (p.stat().st_mode & 0o7777) == 0o644, p


@pytest.mark.parametrize(
    "via", ["abs", "rel", "top/outside", "top/../../outside", "abs/sub/up/outside"]
)
def test_links_and_dotdot_resolve_inside_the_root(
    root: Root, world: tuple[Path, Path], via: str
) -> None:
    """Absolute links, relative links climbing past the top and `..` at the root all stay in
    the root: the sandbox's twin is read, never the outside file."""
    chunk = ops.read_chunk(root, f"/workspace/{via}/f", 0, 100, None)
    assert chunk.data == b"sandbox"
    untouched(world[1])


def test_changes_through_symlinked_parents_stay_inside(
    root: Root, world: tuple[Path, Path]
) -> None:
    """write, mkdir, remove, move, copy, chmod and chown through a link to the outside path
    change the root's twin only."""
    top, outside = world
    ops.write_file(
        root, "/workspace/abs/f", b"new", mode=None, owner=None, make_parents=False, exclusive=False
    )
    assert ops.remove(root, "/workspace/abs/victim", recursive=False, missing_ok=False)
    ops.chmod(root, "/workspace/rel/modeme", 0o600, recursive=False)
    ops.chmod(root, "/workspace/top/outside", 0o750, recursive=True)
    ops.chown(root, "/workspace/abs", os.getuid(), -1, recursive=True)
    ops.mkdir(root, "/workspace/rel/made/deeper", parents=True, mode=0o700, owner=None)
    ops.copy(
        root,
        "/workspace/abs",
        "/workspace/copy",
        recursive=True,
        overwrite=False,
        make_parents=False,
    )
    ops.move(root, "/workspace/rel/f", "/workspace/moved", overwrite=False, make_parents=False)
    twin = top / "outside"
    assert sorted(p.name for p in twin.iterdir()) == ["made", "modeme", "sub"]
    assert (top / "workspace" / "moved").read_text() == "new"
    assert (twin / "modeme").stat().st_mode & 0o7777 == 0o750
    assert (twin / "made" / "deeper").stat().st_mode & 0o7777 == 0o700
    assert (top / "workspace" / "copy" / "sub" / "up").is_symlink()  # copied as a link
    untouched(outside)


def test_walks_never_leave_the_root(root: Root, world: tuple[Path, Path]) -> None:
    """list, glob and search through a link list the root's twin and never descend links."""
    found = listing.list_dir(
        root, "/workspace/abs", depth=5, hidden=True, limit=100, cursor=None, budget=Budget()
    )
    assert [rel for rel, _ in found.entries] == ["f", "modeme", "sub", "sub/up", "victim"]
    assert found.entries[0][1].path == "/workspace/abs/f"
    hits = listing.glob(
        root, "/workspace", "**/f", hidden=False, kind=None, limit=10, budget=Budget()
    )
    assert [rel for rel, _ in hits.entries] == []  # links are not descended into
    matches = search.search(
        root,
        "/workspace/rel",
        "host",
        regex=False,
        case_sensitive=True,
        pattern=None,
        hidden=False,
        binary=False,
        limit=10,
        budget=Budget(),
    )
    assert matches.matches == [] and matches.files_scanned == 3
    fd = root.open("/", os.O_RDONLY | os.O_DIRECTORY)
    try:
        names = {name for _, name, _ in tree(fd)}
    finally:
        os.close(fd)
    assert "f" in names and "host" not in names


def test_write_through_a_link_chain_and_loops(root: Root, world: tuple[Path, Path]) -> None:
    """A write through a chain of links replaces the final target (resolved in the root) and
    keeps the links; a loop is ELOOP (fs.invalid_path)."""
    top, outside = world
    (top / "workspace" / "l1").symlink_to("l2")
    (top / "workspace" / "l2").symlink_to(f"{outside}/f")  # -> /outside/f in the root
    assert root.follow_last("/workspace/l1") == f"{outside}/f"
    atomic = AtomicFile(root, "/workspace/l1")
    atomic.write(b"chained")
    atomic.commit()
    assert (top / "outside" / "f").read_text() == "chained"
    assert (top / "workspace" / "l1").is_symlink()
    (top / "workspace" / "dirlink").symlink_to(f"{outside}/sub")  # -> /outside/sub
    (top / "outside" / "sub" / "back").symlink_to("../f")  # .. after a link: /outside, not /ws
    ops.write_file(
        root,
        "/workspace/dirlink/back",
        b"back",
        mode=None,
        owner=None,
        make_parents=False,
        exclusive=False,
    )
    assert (top / "outside" / "f").read_text() == "back"
    assert not (top / "workspace" / "f").exists()
    (top / "workspace" / "loop").symlink_to("loop")
    with pytest.raises(FsError) as caught, guard(Paths("/", root=root)):
        ops.write_file(
            root,
            "/workspace/loop",
            b"x",
            mode=None,
            owner=None,
            make_parents=False,
            exclusive=False,
        )
    assert caught.value.code == "fs.invalid_path"
    untouched(outside)


def test_errors_name_the_client_path(root: Root) -> None:
    """Errors name the path in the root (not a bare name from an *at call), typed as before."""
    paths = Paths("/", root=root)
    with pytest.raises(FsError) as caught, guard(paths):
        ops.read_chunk(root, "/workspace/abs/missing", 0, 10, None)
    assert (caught.value.code, caught.value.details["path"]) == (
        "fs.not_found",
        "/workspace/abs/missing",
    )
    with pytest.raises(FsError) as caught, guard(paths):
        ops.write_file(
            root,
            "/workspace/abs/f/x",
            b"",
            mode=None,
            owner=None,
            make_parents=True,
            exclusive=False,
        )
    assert caught.value.code == "fs.not_a_directory"
    with pytest.raises(FsError) as caught, guard(paths):
        ops.mkdir(root, "/workspace/abs/f", parents=True, mode=None, owner=None)
    assert caught.value.code == "fs.already_exists"
    assert paths.is_protected("/workspace/top/") and paths.is_protected("/workspace/..")


def test_magic_links_are_refused_and_a_missing_openat2_fails_closed(root: Root) -> None:
    """RESOLVE_NO_MAGICLINKS refuses /proc/<pid>/root-style jumps; a jailed root without
    openat2 refuses every operation with fs.error (ENOSYS) instead of resolving racily."""
    host = os.open("/", os.O_PATH | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError, match="symbolic links") as caught:
            openat2(host, "proc/self/root", os.O_PATH, 0, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
        assert caught.value.errno == errno.ELOOP
    finally:
        os.close(host)
    root.usable = False
    with pytest.raises(FsError) as refused:
        ops.read_chunk(root, "/workspace/abs/f", 0, 10, None)
    assert (refused.value.code, refused.value.details["errno"]) == ("fs.error", "ENOSYS")


def test_the_process_runtime_keeps_host_paths(tmp_path: Path) -> None:
    """Without a jail the root is the host's /: absolute paths are host paths, /workspace maps
    to the workspace directory."""
    (tmp_path / "f").write_text("here")
    paths = Paths(tmp_path)
    assert paths.resolve("/workspace/f") == str(tmp_path / "f")
    assert ops.read_chunk(paths.root, str(tmp_path / "f"), 0, 10, None).data == b"here"
    assert not paths.root.jailed and paths.display(str(tmp_path / "f")) == "/workspace/f"


async def test_a_watch_resolves_in_the_root_and_never_descends_links(
    root: Root, world: tuple[Path, Path]
) -> None:
    """A watch through a link watches the root's twin (its sub-directory too, not the link to
    / below it); changes to the outside directory are not reported."""
    top, outside = world
    w = Watcher(
        "w",
        "/workspace/abs",
        recursive=True,
        include=GlobSet([]),
        exclude=GlobSet([]),
        types=frozenset(),
        window=0.0,
        queue=64,
        max_dirs=100,
        fs_root=root,
    )
    await w.start()
    try:
        assert w.dirs == 2  # /outside and /outside/sub in the root; sub/up is a link
        (outside / "host-made").write_text("x")
        (outside / "host-made").unlink()
        (top / "outside" / "sub" / "made").write_text("x")
        w._on_readable()  # the events are queued already: read them now
        w._co.flush(force=True)
        assert {e.rel for e in w.log.read(0, 100).events} == {"sub/made"}
    finally:
        w.close()
    untouched(outside)


async def test_disk_usage_never_walks_a_directory_swapped_for_a_host_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory swapped mid-walk for a link to a host directory is not followed: the walk
    goes by descriptor, so the host's files are never counted."""
    ws, host = tmp_path / "ws", tmp_path / "host"
    (ws / "d/sub").mkdir(parents=True)
    (host / "sub").mkdir(parents=True)
    (host / "sub/big").write_bytes(os.urandom(4 * 1024 * 1024))
    pauses = 0

    async def pause(_: float) -> None:
        """The walk yields to the loop after each entry; on the second (``d/sub`` is next),
        the sandbox swaps ``d`` for a link to the host directory."""
        nonlocal pauses
        pauses += 1
        if pauses == 2:
            os.rename(ws / "d", ws / "d.old")
            (ws / "d").symlink_to(host)

    monkeypatch.setattr(sysmetrics, "YIELD_EVERY", 1)
    monkeypatch.setattr(sysmetrics, "asyncio", types.SimpleNamespace(sleep=pause))
    usage = await sysmetrics.disk_usage(str(ws))
    assert pauses >= 2
    assert usage.complete and usage.used < 1024 * 1024, usage


async def test_disk_usage_cut_by_the_depth_bound_is_incomplete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tree deeper than the walk's depth bound is reported incomplete; one exactly as deep
    as the bound (nothing left unread) stays complete."""
    monkeypatch.setattr(rooted, "MAX_DEPTH", 3)
    ws = tmp_path / "ws"
    (ws / "a/b").mkdir(parents=True)
    (ws / "a/b/f").write_text("x")  # level 3: the deepest the walk reads
    usage = await sysmetrics.disk_usage(str(ws))
    assert usage.complete and usage.entries == 3, usage
    (ws / "a/b/c").mkdir()
    (ws / "a/b/c/deep").write_text("x")  # level 4: below the bound
    usage = await sysmetrics.disk_usage(str(ws))
    assert not usage.complete and usage.entries == 4, usage


async def test_disk_usage_does_not_follow_links(tmp_path: Path) -> None:
    """Links in the workspace (to / included) count as links, whatever they point at."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f").write_bytes(b"x" * 10_000)
    (ws / "top").symlink_to("/")
    usage = await sysmetrics.disk_usage(str(ws))
    assert usage.complete and usage.entries == 2 and usage.used < 1024 * 1024


class _Racing:
    """A syscall that first fails ``eagain`` times with EAGAIN (what openat2 says when a rename
    elsewhere on the host raced a scoped ".."), then is the real one."""

    real = openat2_mod._syscall()  # before any test replaces it

    def __init__(self, eagain: int) -> None:
        self.eagain = eagain
        self.calls = 0

    def __call__(self, *args: object) -> int:
        self.calls += 1
        if self.calls <= self.eagain:
            ctypes.set_errno(errno.EAGAIN)
            return -1
        assert self.real is not None
        return int(self.real(*args))


def test_openat2_retries_the_eagain_of_a_racing_rename(
    monkeypatch: pytest.MonkeyPatch, world: tuple[Path, Path]
) -> None:
    """A scoped resolution that a rename elsewhere raced (EAGAIN) is retried, up to a bound;
    other errors are raised at once."""
    top = os.open(world[0], os.O_RDONLY | os.O_DIRECTORY)

    def open_in_root(racing: _Racing, path: str) -> int:
        monkeypatch.setattr(openat2_mod, "_syscall", lambda: racing)
        return rooted.openat2(top, path, os.O_RDONLY, resolve=RESOLVE_IN_ROOT)

    try:
        racing = _Racing(eagain=3)
        os.close(open_in_root(racing, "workspace/.."))
        assert racing.calls == 4
        always = _Racing(eagain=10**6)
        with pytest.raises(BlockingIOError):  # EAGAIN
            open_in_root(always, "workspace/..")
        assert always.calls == openat2_mod.EAGAIN_RETRIES
        missing = _Racing(eagain=0)
        with pytest.raises(FileNotFoundError):
            open_in_root(missing, "workspace/missing")
        assert missing.calls == 1
    finally:
        os.close(top)
