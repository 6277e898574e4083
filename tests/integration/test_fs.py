"""Files API end to end: read, write, stat, list, glob, search, replace, mkdir, remove, move, copy,
chmod, chown and exists through the async SDK and a real execd."""

from __future__ import annotations

import asyncio
import grp
import os
import pwd
import stat
import time
import uuid
from pathlib import Path

import pytest

from conftest import Execd, NatsServer
from sandpod import AsyncSandbox, Sandbox
from sandpod.fs import AsyncFileReader, FileList
from sandpod_contract.errors import (
    BadRequest,
    FsAlreadyExists,
    FsInvalidPath,
    FsIsADirectory,
    FsNotADirectory,
    FsNotEmpty,
    FsNotFound,
    FsTooLarge,
)
from sandpod_contract.messages.fs import FsChunk, FsList, FsListing, FsRead


@pytest.fixture
def where(state_dir: Path) -> tuple[str, Path]:
    """A fresh directory of the shared sandbox: (sandbox path, host path)."""
    name = f"fs-{uuid.uuid4().hex[:10]}"
    host = state_dir / "workspaces" / "shared" / name
    host.mkdir(parents=True)
    return f"/workspace/{name}", host


async def test_write_then_read_round_trips_every_byte(
    sbx: AsyncSandbox, where: tuple[str, Path]
) -> None:
    """Binary and text content come back byte for byte, and land on disk as written."""
    d, host = where
    data = bytes(range(256)) * 3 + b"\x00\r\n\xff"
    info = await sbx.fs.write(f"{d}/bin/data.bin", data)
    assert (info.path, info.type, info.size, info.mode) == (f"{d}/bin/data.bin", "file", 772, 0o644)
    assert await sbx.fs.read(f"{d}/bin/data.bin") == data
    assert (host / "bin" / "data.bin").read_bytes() == data
    await sbx.fs.write(f"{d}/t.txt", "héllo ✓\n")
    assert await sbx.fs.read_text(f"{d}/t.txt") == "héllo ✓\n"
    relative = d.removeprefix("/workspace/") + "/t.txt"
    assert await sbx.fs.read(relative) == "héllo ✓\n".encode()
    await sbx.fs.write(f"{d}/empty", b"")
    assert await sbx.fs.read(f"{d}/empty") == b""


async def test_write_is_atomic_and_keeps_an_existing_files_mode(
    sbx: AsyncSandbox, where: tuple[str, Path]
) -> None:
    """Rewriting an executable keeps +x, replaces the inode (atomic rename), leaves no temp file."""
    d, host = where
    script = host / "run.sh"
    script.write_text("#!/bin/sh\necho old\n")
    script.chmod(0o750)
    inode = script.stat().st_ino
    info = await sbx.fs.write(f"{d}/run.sh", "#!/bin/sh\necho new\n")
    assert info.mode == 0o750 and script.stat().st_mode & 0o777 == 0o750
    assert script.stat().st_ino != inode and script.read_text().endswith("new\n")
    assert sorted(p.name for p in host.iterdir()) == ["run.sh"]
    info = await sbx.fs.write(f"{d}/run.sh", "x", mode=0o600)
    assert info.mode == 0o600 and info.permissions == "-rw-------"


async def test_write_options_exclusive_parents_directories_and_symlinks(
    sbx: AsyncSandbox, where: tuple[str, Path]
) -> None:
    """exclusive refuses an existing file, make_parents=False a missing parent, a directory is
    refused, and a symlink is written through (the link stays)."""
    d, host = where
    await sbx.fs.write(f"{d}/a", "1", exclusive=True)
    with pytest.raises(FsAlreadyExists) as caught:
        await sbx.fs.write(f"{d}/a", "2", exclusive=True)
    assert caught.value.details["path"] == f"{d}/a"
    with pytest.raises(FsNotFound):
        await sbx.fs.write(f"{d}/no/such/dir/f", "x", make_parents=False)
    (host / "sub").mkdir()
    with pytest.raises(FsIsADirectory):
        await sbx.fs.write(f"{d}/sub", "x")
    with pytest.raises(FsNotADirectory):
        await sbx.fs.write(f"{d}/a/under-a-file", "x")
    (host / "link").symlink_to("a")
    await sbx.fs.write(f"{d}/link", "through")
    assert (host / "link").is_symlink() and (host / "a").read_text() == "through"
    assert sorted(p.name for p in host.iterdir()) == ["a", "link", "sub"]


async def _reads_cancelled(reader: AsyncFileReader, timeout: float = 10.0) -> None:
    """Wait until ``reader`` holds no read in flight; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while reader._pending:
        if time.monotonic() > deadline:
            pytest.fail(f"{len(reader._pending)} reads still in flight after the loop was left")
        await asyncio.sleep(0.02)


async def test_breaking_out_of_a_bare_read_stream_cancels_its_reads(
    sbx: AsyncSandbox, where: tuple[str, Path]
) -> None:
    """`async for chunk in fs.read_stream(p): break` (no `async with`) cancels the reads still
    in flight instead of leaving them to the garbage collector."""
    d, host = where
    (host / "r.bin").write_bytes(os.urandom(64_000))
    reader = sbx.fs.read_stream(f"{d}/r.bin", chunk_size=4096, in_flight=4)
    async for chunk in reader:  # the first reply tells the size: reads after it are pipelined
        assert len(chunk) == 4096
        if reader._pending:
            break
    await _reads_cancelled(reader)


async def test_breaking_out_inside_async_with_keeps_the_read_stream(
    sbx: AsyncSandbox, where: tuple[str, Path]
) -> None:
    """Inside `async with` a break leaves the reader usable: iterating again continues."""
    d, host = where
    data = os.urandom(64_000)
    (host / "r.bin").write_bytes(data)
    async with sbx.fs.read_stream(f"{d}/r.bin", chunk_size=4096, in_flight=4) as reader:
        head = []
        async for chunk in reader:
            head.append(chunk)
            break
        assert b"".join(head + [c async for c in reader]) == data


async def test_reads_by_range_and_stream_and_refuses_big_files(
    sbx: AsyncSandbox, where: tuple[str, Path]
) -> None:
    """read_range and read_stream (several reads in flight) give ordered exact bytes; read()
    refuses a file over max_size with fs.too_large carrying size and limit."""
    d, host = where
    data = os.urandom(100_003)
    (host / "r.bin").write_bytes(data)
    assert await sbx.fs.read_range(f"{d}/r.bin", 99_990, 100) == data[99_990:]
    assert await sbx.fs.read_range(f"{d}/r.bin", 200_000, 10) == b""
    past = await sbx.channel.call(
        "fs", "read", FsRead(path=f"{d}/r.bin", offset=200_000), FsChunk, 5
    )
    assert (past.data, past.size, past.eof) == (b"", len(data), True)
    chunks = []
    async with sbx.fs.read_stream(f"{d}/r.bin", chunk_size=7_000, in_flight=3) as reader:
        async for chunk in reader:
            chunks.append(chunk)
        assert reader.size == len(data)
    assert len(chunks) == 15 and b"".join(chunks) == data
    async with sbx.fs.read_stream(f"{d}/r.bin", offset=10, length=20_000, chunk_size=4096) as r:
        assert b"".join([c async for c in r]) == data[10:20_010]
    with pytest.raises(FsTooLarge) as caught:
        await sbx.fs.read(f"{d}/r.bin", max_size=1000)
    assert caught.value.details["size"] == len(data) and caught.value.details["limit"] == 1000
    assert await sbx.fs.read(f"{d}/r.bin", max_size=None) == data


async def test_read_lines_windows_into_a_large_file(
    sbx: AsyncSandbox, where: tuple[str, Path]
) -> None:
    """read_lines returns just the asked-for lines of a multi-chunk file, across chunk
    boundaries and CRLF endings."""
    d, host = where
    lines = [f"line {i} " + "x" * (i % 7) for i in range(1, 200_001)]
    (host / "log.txt").write_text("\r\n".join(lines))  # 3 MB; no newline after the last line
    assert await sbx.fs.read_lines(f"{d}/log.txt", 1, 2) == lines[:2]
    assert await sbx.fs.read_lines(f"{d}/log.txt", 60_000, 50_000) == lines[59_999:109_999]
    assert await sbx.fs.read_lines(f"{d}/log.txt", 199_999) == lines[199_998:]
    assert await sbx.fs.read_lines(f"{d}/log.txt", 500_000) == []


async def test_reads_unsized_proc_files_and_refuses_fifos(
    sbx: AsyncSandbox, where: tuple[str, Path]
) -> None:
    """A /proc file (size 0) is read to its end; a FIFO is refused instead of blocking."""
    version = await sbx.fs.read("/proc/version")
    assert version.startswith(b"Linux") and version.endswith(b"\n")
    d, host = where
    os.mkfifo(host / "pipe")
    with pytest.raises(FsInvalidPath):
        await sbx.fs.read(f"{d}/pipe")
    with pytest.raises(FsIsADirectory):
        await sbx.fs.read(d)


async def test_stat_list_and_exists_report_metadata(
    sbx: AsyncSandbox, where: tuple[str, Path]
) -> None:
    """Entries carry type, size, mode (int and rwx), owner names, mtime and symlink targets;
    list honours depth and hidden; exists tells files, dirs, missing and dangling links apart."""
    d, host = where
    (host / "src" / "pkg").mkdir(parents=True)
    (host / "src" / "pkg" / "deep.py").write_text("x")
    (host / "src" / "main.py").write_text("print(1)\n")
    (host / ".env").write_text("A=1")
    (host / "latest").symlink_to("src")
    (host / "gone").symlink_to("nowhere")
    st = (host / "src" / "main.py").stat()
    info = await sbx.fs.stat(f"{d}/src/main.py")
    assert (info.name, info.size, info.uid, info.gid) == ("main.py", 9, st.st_uid, st.st_gid)
    assert info.owner == "root" and info.group == "root" and info.mtime == st.st_mtime
    link = await sbx.fs.stat(f"{d}/latest")
    assert link.is_symlink and link.target == "src" and link.permissions.startswith("l")
    assert (await sbx.fs.stat(f"{d}/latest", follow_symlinks=True)).is_dir
    top = await sbx.fs.list(d)
    assert [e.name for e in top] == [".env", "gone", "latest", "src"] and not top.truncated
    assert [e.name for e in await sbx.fs.list(d, hidden=False)] == ["gone", "latest", "src"]
    deep = await sbx.fs.list(d, depth=3, hidden=False)
    assert deep.paths == [
        f"{d}/{p}" for p in ("gone", "latest", "src", "src/main.py", "src/pkg", "src/pkg/deep.py")
    ]
    assert (await sbx.fs.list(f"{d}/latest")).paths == [f"{d}/latest/main.py", f"{d}/latest/pkg"]
    with pytest.raises(FsNotADirectory):
        await sbx.fs.list(f"{d}/src/main.py")
    assert await sbx.fs.exists(f"{d}/src") and await sbx.fs.exists(f"{d}/gone")
    assert not await sbx.fs.exists(f"{d}/gone", follow_symlinks=True)
    assert not await sbx.fs.exists(f"{d}/nope") and not await sbx.fs.exists(f"{d}/src/main.py/x")
    root = await sbx.fs.stat("/workspace")
    assert (root.name, root.path, root.type) == ("workspace", "/workspace", "dir")


async def test_list_pages_through_a_big_directory_with_a_cursor(
    sbx: AsyncSandbox, where: tuple[str, Path]
) -> None:
    """Pages of `limit` entries, continued by cursor, cover every entry exactly once in order;
    the SDK's limit caps the total and says truncated."""
    d, host = where
    for i in range(5):
        (host / f"d{i}").mkdir()
        for j in range(4):
            (host / f"d{i}" / f"f{j}").write_text("")
    seen: list[str] = []
    cursor = None
    while True:
        page = await sbx.channel.call(
            "fs", "list", FsList(path=d, depth=2, limit=7, cursor=cursor), FsListing, 5
        )
        seen += [e.path for e in page.entries]
        if not page.truncated:
            break
        assert len(page.entries) == 7
        cursor = page.cursor
    assert len(seen) == 25 and seen == sorted(set(seen), key=lambda p: p.split("/"))
    capped = await sbx.fs.list(d, depth=2, limit=10)
    assert capped.truncated and capped.paths == seen[:10]
    assert (await sbx.fs.list(d, depth=2)).paths == seen


async def test_glob_matches_across_directories_and_skips_hidden(
    sbx: AsyncSandbox, where: tuple[str, Path]
) -> None:
    """`**` spans directories, `*` does not, dot files need hidden=True, absolute patterns work."""
    d, host = where
    for rel in ("a.py", "b.txt", "src/c.py", "src/x/d.py", ".hid/e.py", "src/.f.py"):
        (host / rel).parent.mkdir(parents=True, exist_ok=True)
        (host / rel).write_text("")

    def names(found: FileList) -> list[str]:
        return sorted(e.path.removeprefix(d + "/") for e in found)

    assert names(await sbx.fs.glob("*.py", path=d)) == ["a.py"]
    assert names(await sbx.fs.glob("**/*.py", path=d)) == ["a.py", "src/c.py", "src/x/d.py"]
    assert names(await sbx.fs.glob("**/*.py", path=d, hidden=True)) == [
        ".hid/e.py",
        "a.py",
        "src/.f.py",
        "src/c.py",
        "src/x/d.py",
    ]
    assert names(await sbx.fs.glob(f"{d}/src/*")) == ["src/c.py", "src/x"]
    assert names(await sbx.fs.glob("src/**", path=d, type="file")) == ["src/c.py", "src/x/d.py"]
    assert names(await sbx.fs.glob("s?c/[cd].py", path=d)) == ["src/c.py"]
    assert len(await sbx.fs.glob("nothing/*", path=d)) == 0
    few = await sbx.fs.glob("**", path=d, limit=2)
    assert len(few) == 2 and few.truncated


async def test_search_finds_lines_and_skips_binary_files(
    sbx: AsyncSandbox, where: tuple[str, Path]
) -> None:
    """Substring, case-insensitive and regex searches give path, line and column; binary files
    are skipped unless asked for; a limit truncates; a bad regex is bad_request."""
    d, host = where
    (host / "a.py").write_text("import os\n# TODO: one\nx = 1  # todo two\n")
    (host / "b.txt").write_text("nothing\nTODO three\n")
    (host / "blob.bin").write_bytes(b"\x00\x01TODO binary\n")
    r = await sbx.fs.search("TODO", path=d)
    assert [(m.path, m.line, m.column) for m in r] == [(f"{d}/a.py", 2, 3), (f"{d}/b.txt", 2, 1)]
    assert r.matches[0].text == "# TODO: one" and r.files_scanned == 3 and not r.truncated
    r = await sbx.fs.search("todo", path=d, case_sensitive=False, glob="*.py")
    assert [m.line for m in r] == [2, 3]
    r = await sbx.fs.search(r"x\s*=\s*\d", path=f"{d}/a.py", regex=True)
    assert [(m.line, m.column) for m in r] == [(3, 1)]
    assert len(await sbx.fs.search("TODO", path=d, binary=True)) == 3
    r = await sbx.fs.search("o", path=d, limit=2)
    assert len(r) == 2 and r.truncated
    with pytest.raises(BadRequest):
        await sbx.fs.search("(unclosed", path=d, regex=True)


async def test_replace_rewrites_files_atomically_and_reports_counts(
    sbx: AsyncSandbox, where: tuple[str, Path]
) -> None:
    """Replace counts per file, keeps modes, supports dry runs, counts and regex groups, and
    skips binary files unless forced."""
    d, host = where
    (host / "a.py").write_text("colour = 'colour'\n")
    (host / "a.py").chmod(0o755)
    (host / "b.md").write_text("the colour\n")
    (host / "c.bin").write_bytes(b"\x00colour")
    dry = await sbx.fs.replace(d, "colour", "color", dry_run=True)
    assert dry.total == 3 and (host / "a.py").read_text() == "colour = 'colour'\n"
    r = await sbx.fs.replace(d, "colour", "color", glob="*.py")
    assert [(f.path, f.count) for f in r.files] == [(f"{d}/a.py", 2)] and r.total == 2
    assert (host / "a.py").read_text() == "color = 'color'\n"
    assert (host / "a.py").stat().st_mode & 0o777 == 0o755
    r = await sbx.fs.replace(d, "colour", "color")
    assert r.total == 1 and [(s.path, s.reason) for s in r.skipped] == [(f"{d}/c.bin", "binary")]
    r = await sbx.fs.replace(f"{d}/c.bin", "colour", "color", binary=True)
    assert r.total == 1 and (host / "c.bin").read_bytes() == b"\x00color"
    (host / "n.txt").write_text("a1 a2 a3\n")
    r = await sbx.fs.replace(f"{d}/n.txt", r"a(\d)", r"b\1", regex=True, count=2)
    assert r.total == 2 and (host / "n.txt").read_text() == "b1 b2 a3\n"
    with pytest.raises(BadRequest):
        await sbx.fs.replace(f"{d}/n.txt", "a", r"\9", regex=True)


async def test_mkdir_remove_and_their_errors(sbx: AsyncSandbox, where: tuple[str, Path]) -> None:
    """mkdir -p is idempotent and sets the mode; remove needs recursive for a non-empty
    directory, removes a symlink not its target, and refuses the workspace itself."""
    d, host = where
    info = await sbx.fs.mkdir(f"{d}/a/b/c", mode=0o700)
    assert info.is_dir and info.mode == 0o700
    assert (await sbx.fs.mkdir(f"{d}/a/b/c")).is_dir
    with pytest.raises(FsAlreadyExists):
        await sbx.fs.mkdir(f"{d}/a", parents=False)
    (host / "f").write_text("")
    with pytest.raises(FsAlreadyExists):
        await sbx.fs.mkdir(f"{d}/f")
    with pytest.raises(FsNotEmpty):
        await sbx.fs.remove(f"{d}/a")
    (host / "link").symlink_to("a")
    assert await sbx.fs.remove(f"{d}/link/") and (host / "a" / "b").is_dir()
    assert await sbx.fs.remove(f"{d}/a", recursive=True) and not (host / "a").exists()
    with pytest.raises(FsNotFound):
        await sbx.fs.remove(f"{d}/a")
    assert await sbx.fs.remove(f"{d}/a", missing_ok=True) is False
    for protected in ("/workspace", "/workspace/", "/", "."):
        with pytest.raises(FsInvalidPath):
            await sbx.fs.remove(protected, recursive=True)


async def test_move_and_copy(sbx: AsyncSandbox, where: tuple[str, Path]) -> None:
    """move and copy refuse to clobber unless overwrite, create parents on request, copy trees
    with their links, and refuse to put a directory inside itself."""
    d, host = where
    (host / "a.txt").write_text("A")
    (host / "b.txt").write_text("B")
    (host / "a.txt").chmod(0o640)
    with pytest.raises(FsAlreadyExists):
        await sbx.fs.move(f"{d}/a.txt", f"{d}/b.txt")
    with pytest.raises(FsNotFound):
        await sbx.fs.move(f"{d}/a.txt", f"{d}/x/y/a.txt")
    moved = await sbx.fs.move(f"{d}/a.txt", f"{d}/x/y/a.txt", make_parents=True)
    assert moved.path == f"{d}/x/y/a.txt" and moved.mode == 0o640
    copied = await sbx.fs.copy(f"{d}/x/y/a.txt", f"{d}/b.txt", overwrite=True)
    assert copied.mode == 0o640 and (host / "b.txt").read_text() == "A"
    (host / "x" / "ln").symlink_to("y/a.txt")
    with pytest.raises(FsIsADirectory):
        await sbx.fs.copy(f"{d}/x", f"{d}/x2")
    await sbx.fs.copy(f"{d}/x", f"{d}/x2", recursive=True)
    assert (host / "x2" / "ln").is_symlink() and (host / "x2" / "y" / "a.txt").read_text() == "A"
    with pytest.raises(FsInvalidPath):
        await sbx.fs.move(f"{d}/x", f"{d}/x/inside")
    with pytest.raises(FsInvalidPath):
        await sbx.fs.copy(f"{d}/x", f"{d}/x/y/inside", recursive=True)
    await sbx.fs.move(f"{d}/b.txt", f"{d}/x2/y/a.txt", overwrite=True)
    assert not (host / "b.txt").exists()
    with pytest.raises(FsNotFound):
        await sbx.fs.copy(f"{d}/missing", f"{d}/z")


async def test_chmod_and_chown_by_id_and_name(sbx: AsyncSandbox, where: tuple[str, Path]) -> None:
    """chmod sets bits (recursively too); chown takes ids or names; unknown names are refused."""
    d, host = where
    (host / "t" / "u").mkdir(parents=True)
    (host / "t" / "u" / "f").write_text("")
    info = await sbx.fs.chmod(f"{d}/t", 0o750, recursive=True)
    assert info.mode == 0o750 and stat.S_IMODE((host / "t" / "u" / "f").stat().st_mode) == 0o750
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    info = await sbx.fs.chown(f"{d}/t", 4321, 4321, recursive=True)
    assert (info.uid, info.gid, info.owner) == (4321, 4321, None)
    assert (host / "t" / "u" / "f").stat().st_uid == 4321
    info = await sbx.fs.chown(f"{d}/t", "root", group=0)
    assert (info.owner, info.gid) == ("root", 0)
    with pytest.raises(BadRequest):
        await sbx.fs.chown(f"{d}/t", "no-such-user-here")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving files to another user needs root")
async def test_write_and_mkdir_give_new_entries_the_owner_asked_for(
    sbx: AsyncSandbox, where: tuple[str, Path]
) -> None:
    """owner/group on fs.write (small and streamed) and fs.mkdir chown what they create: by
    id, and by name; the replies say so and so does stat."""
    d, host = where
    nobody = pwd.getpwnam("nobody")
    group = grp.getgrgid(nobody.pw_gid).gr_name
    small = await sbx.fs.write(f"{d}/small", b"x", owner=4321, group=4322)
    big = await sbx.fs.write(f"{d}/big", b"y" * (2 << 20), owner=4323, group=4324)
    made = await sbx.fs.mkdir(f"{d}/made", owner=4325, group=4326)
    named = await sbx.fs.mkdir(f"{d}/named", owner="nobody", group=group)
    for name, info, ids in (
        ("small", small, (4321, 4322)),
        ("big", big, (4323, 4324)),
        ("made", made, (4325, 4326)),
        ("named", named, (nobody.pw_uid, nobody.pw_gid)),
    ):
        st = (host / name).stat()
        assert (st.st_uid, st.st_gid) == ids, name
        assert (info.uid, info.gid) == ids, name
    assert (host / "big").stat().st_size == 2 << 20


def test_sync_sdk_has_the_same_files_surface(
    nats: NatsServer, shared_execd: Execd, where: tuple[str, Path]
) -> None:
    """The blocking Sandbox.fs writes, streams, lists, searches and raises the same typed errors."""
    d, host = where
    with Sandbox.connect("shared", nats_url=nats.url) as sbx:
        sbx.fs.write(f"{d}/s.txt", "one\ntwo\n", mode=0o600)
        assert sbx.fs.read(f"{d}/s.txt") == b"one\ntwo\n"
        with sbx.fs.open_writer(f"{d}/big.bin", chunk_size=1000) as w:
            for _ in range(10):
                w.write(b"z" * 777)
        with sbx.fs.read_stream(f"{d}/big.bin", chunk_size=2048) as r:
            assert b"".join(r) == b"z" * 7770
        bare = sbx.fs.read_stream(f"{d}/big.bin", chunk_size=1024, in_flight=4)
        for chunk in bare:  # a bare loop left early cancels its reads at once
            assert chunk == b"z" * 1024
            if bare._inner._pending:
                break
        assert not bare._inner._pending
        assert [e.name for e in sbx.fs.list(d)] == ["big.bin", "s.txt"]
        assert [m.line for m in sbx.fs.search("two", path=d)] == [2]
        assert sbx.fs.replace(f"{d}/s.txt", "two", "2").total == 1
        assert sbx.fs.exists(f"{d}/s.txt") and sbx.fs.stat(f"{d}/s.txt").mode == 0o600
        with pytest.raises(FsNotFound):
            sbx.fs.read(f"{d}/nope")
    assert (host / "s.txt").read_text() == "one\n2\n"
