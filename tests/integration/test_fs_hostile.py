"""Hostile paths and malformed fs requests get typed errors, never ``internal``, and execd keeps
serving."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from conftest import NatsServer
from sandpod import AsyncSandbox
from sandpod_bus import Bus, BusSettings
from sandpod_contract.codec import decode_reply, pack
from sandpod_contract.errors import BadRequest, FsError, SandpodError
from sandpod_contract.messages.fs import FsEntry
from sandpod_contract.subjects import Subjects
from sandpod_execd.files.ops import read_chunk, write_file
from sandpod_execd.files.paths import Paths, guard
from sandpod_execd.files.rooted import Root

SUBJECTS = Subjects()


@pytest.fixture
def where(state_dir: Path) -> tuple[str, Path]:
    """A fresh directory of the shared sandbox with a symlink loop and a dangling link."""
    name = f"fsh-{uuid.uuid4().hex[:10]}"
    host = state_dir / "workspaces" / "shared" / name
    host.mkdir(parents=True)
    (host / "loop-a").symlink_to("loop-b")
    (host / "loop-b").symlink_to("loop-a")
    (host / "file.txt").write_text("x")
    return f"/workspace/{name}", host


OPS: dict[str, Callable[[AsyncSandbox, str], Awaitable[object]]] = {
    "read": lambda s, p: s.fs.read(p),
    "write": lambda s, p: s.fs.write(p, b"x"),
    "upload": lambda s, p: s.fs.write(p, b"x" * (600 * 1024)),
    "stat": lambda s, p: s.fs.stat(p, follow_symlinks=True),
    "list": lambda s, p: s.fs.list(p),
    "mkdir": lambda s, p: s.fs.mkdir(p),
    "remove": lambda s, p: s.fs.remove(p, recursive=True),
    "move": lambda s, p: s.fs.move(p, p + ".moved"),
    "copy": lambda s, p: s.fs.copy(p, p + ".copy"),
    "chmod": lambda s, p: s.fs.chmod(p, 0o644),
    "search": lambda s, p: s.fs.search("x", path=p),
    "replace": lambda s, p: s.fs.replace(p, "x", "y"),
}

HOSTILE = {
    "nul-byte": ("{d}/a\x00b", "fs.invalid_path"),
    "long-name": ("{d}/" + "n" * 300, "fs.invalid_path"),
    "long-path": ("{d}/" + "/".join(["abcdefghij"] * 420), "fs.invalid_path"),
    "dotdot-escape": ("/workspace/../../etc/passwd", "fs.invalid_path"),
    "relative-escape": ("../" * 8 + "etc/passwd", "fs.invalid_path"),
    "symlink-loop": ("{d}/loop-a/x", "fs.invalid_path"),
    "empty": ("", "fs.invalid_path"),
    "through-a-file": ("{d}/file.txt/x", "fs.not_a_directory"),
}


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("case", sorted(HOSTILE))
async def test_hostile_paths_give_typed_fs_errors(
    sbx: AsyncSandbox, where: tuple[str, Path], op: str, case: str
) -> None:
    """NUL bytes, over-long names and paths, `..` escapes, symlink loops, empty paths and paths
    through a file each give their typed fs error for every operation."""
    d, host = where
    template, code = HOSTILE[case]
    path = template.format(d=d)
    with pytest.raises(FsError) as caught:
        await OPS[op](sbx, path)
    assert caught.value.code == code, (caught.value.code, caught.value.message)
    assert sorted(p.name for p in host.iterdir()) == ["file.txt", "loop-a", "loop-b"]


async def test_loop_and_permission_errors_are_typed(
    sbx: AsyncSandbox, where: tuple[str, Path]
) -> None:
    """A symlink loop itself, a glob with '..', and a write where the kernel says no are typed."""
    d, _ = where
    with pytest.raises(FsError) as caught:
        await sbx.fs.read(f"{d}/loop-a")
    assert caught.value.code == "fs.invalid_path" and caught.value.details["errno"] == "ELOOP"
    assert (await sbx.fs.stat(f"{d}/loop-a")).target == "loop-b"  # lstat is fine
    assert await sbx.fs.remove(f"{d}/loop-a")
    with pytest.raises(FsError) as caught:
        await sbx.fs.glob("../*", path=d)
    assert caught.value.code == "fs.invalid_path"
    with pytest.raises(FsError) as caught:
        await sbx.fs.write(f"/sys/sandpod-{uuid.uuid4().hex[:6]}", b"x")
    assert caught.value.code == "fs.permission_denied"


@pytest.fixture
async def bus(nats: NatsServer) -> AsyncIterator[Bus]:
    b = await Bus.connect(BusSettings(url=nats.url))
    yield b
    await b.close()


@pytest.mark.parametrize(
    ("verb", "payload", "fragment"),
    [
        ("write", pack({"v": 1, "path": 42}), "expected str"),
        ("write", pack({"v": 1, "path": "a", "data": "text"}), "expected bytes"),
        ("write", pack({"v": 1, "path": "a", "mode": 0o10000}), "mode must be"),
        ("read", pack({"v": 1, "path": "a", "offset": -1}), "offset must be"),
        ("chown", pack({"v": 1, "path": "a", "owner": {"v": 1}}), "at least one"),
        ("list", pack({"v": 1, "path": "a", "depth": 0}), "depth must be"),
        ("write_commit", pack({"v": 1, "upload_id": "x", "sha256": "zz"}), "sha256"),
        ("replace", pack({"v": 1, "path": "a", "old": "", "new": "b"}), "old must not"),
        ("stat", pack({"v": 1}), "missing required field 'path'"),
    ],
)
async def test_malformed_fs_requests_get_bad_request(
    bus: Bus, verb: str, payload: bytes, fragment: str
) -> None:
    """Wrong types and out-of-range values are bad_request, naming the problem."""
    reply = await bus.request(SUBJECTS.sandbox("shared", "fs", verb), payload, 5)
    with pytest.raises(SandpodError) as caught:
        decode_reply(FsEntry, reply)
    assert isinstance(caught.value, BadRequest), caught.value
    assert fragment in caught.value.message


def test_a_jailed_sandbox_resolves_every_path_in_its_own_root(tmp_path: Path) -> None:
    """With a jail (execd is root on the host), fs resolves every path in the sandbox's root:
    host paths and symlinks leading out land inside it; new files belong to the jail's user."""
    top = tmp_path / "root"
    ws = top / "workspace"
    (ws / "in").mkdir(parents=True)
    (top / "etc").mkdir()
    (top / "etc" / "passwd").write_text("the sandbox's")
    (ws / "out").symlink_to("/etc")
    (ws / "up").symlink_to("../../../../..")
    (ws / "ok").symlink_to("in")
    root = Root(str(top), jailed=True)
    try:
        jailed = Paths("/unused", root=root, new_owner=(4321, 4321))
        assert jailed.resolve("/workspace/in/x") == "/workspace/in/x"
        assert jailed.resolve("ok/new-file") == "/workspace/ok/new-file"
        for path in ("/etc/passwd", "/workspace/out/passwd", "up/etc/passwd", "/etc/../etc/passwd"):
            chunk = read_chunk(root, jailed.resolve(path), 0, 100, None)
            assert chunk.data == b"the sandbox's", path
        with pytest.raises(FsError) as caught, guard(jailed):
            read_chunk(root, jailed.resolve("/workspace/out/shadow"), 0, 100, None)
        assert caught.value.code == "fs.not_found"  # the host's /etc/shadow exists
        if os.geteuid() == 0:
            written = write_file(
                root,
                "/workspace/ok/f",
                b"x",
                mode=None,
                owner=None,
                make_parents=False,
                exclusive=True,
                new_owner=(4321, 4321),
            )
            assert written == "/workspace/ok/f"
            assert (ws / "in" / "f").stat().st_uid == 4321
    finally:
        root.close()
    assert Paths(ws).resolve("/etc/passwd") == "/etc/passwd"  # process runtime: host paths
