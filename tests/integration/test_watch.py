"""File watching end to end: inotify events through execd to the SDK, by cursor."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sysconfig
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import yaml

from conftest import Execd, NatsServer
from sandpod import AsyncSandbox, Sandbox
from sandpod.errors import (
    BadRequest,
    FsInvalidPath,
    FsNotFound,
    WatchError,
    WatchLimit,
    WatchNotFound,
)
from sandpod.watch import AsyncWatch, WatchEvent
from sandpod_contract.codec import decode_reply, pack
from sandpod_contract.messages.watch import WatchInfo

SANDPOD = str(Path(sysconfig.get_path("scripts")) / "sandpod")


@pytest.fixture
def area(state_dir: Path) -> tuple[Path, str]:
    """A fresh directory in the shared sandbox's workspace: (host path, client path)."""
    name = f"w-{uuid.uuid4().hex[:10]}"
    host = state_dir / "workspaces" / "shared" / name
    host.mkdir(parents=True)
    return host, f"/workspace/{name}"


@pytest.fixture
async def watches(sbx: AsyncSandbox) -> AsyncIterator[list[AsyncWatch]]:
    """Watches a test started; stopped afterwards whatever happened."""
    started: list[AsyncWatch] = []
    yield started
    for w in started:
        await w.stop()


async def start(
    sbx: AsyncSandbox, started: list[AsyncWatch], path: str, **opts: object
) -> AsyncWatch:
    w = await sbx.watch.start(path, **opts)
    started.append(w)
    return w


async def until(
    w: AsyncWatch, done: Callable[[list[WatchEvent]], bool], timeout: float = 10.0
) -> list[WatchEvent]:
    """Poll ``w`` until ``done(events so far)``; fail after ``timeout`` seconds."""
    seen: list[WatchEvent] = []
    deadline = time.monotonic() + timeout
    while not done(seen):
        left = deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"timed out waiting for events; got {seen}")
        batch = await w.poll(wait=min(left, 2.0))
        seen.extend(batch.events)
    return seen


def has(kind: str, path: str, **fields: object) -> Callable[[list[WatchEvent]], bool]:
    def check(events: list[WatchEvent]) -> bool:
        return any(
            e.type == kind and e.path == path and all(getattr(e, k) == v for k, v in fields.items())
            for e in events
        )

    return check


async def test_create_modify_delete_arrive_with_paths(
    sbx: AsyncSandbox, area: tuple[Path, str], watches: list[AsyncWatch]
) -> None:
    """A file's creation, modification and deletion come as three events with its path."""
    host, path = area
    w = await start(sbx, watches, path)
    (host / "f.txt").write_text("one")
    await until(w, has("create", f"{path}/f.txt", is_dir=False))
    with (host / "f.txt").open("a") as f:
        f.write("two")
    await until(w, has("modify", f"{path}/f.txt"))
    (host / "f.txt").unlink()
    await until(w, has("delete", f"{path}/f.txt"))


async def test_events_caused_through_exec_are_seen(
    sbx: AsyncSandbox, area: tuple[Path, str], watches: list[AsyncWatch]
) -> None:
    """Changes made by commands in the sandbox (including in a brand-new directory) are reported."""
    _, path = area
    w = await start(sbx, watches, path)
    r = await sbx.exec(path, "mkdir d && echo x > d/a && chmod +x d/a")
    assert r.exit_code == 0
    events = await until(w, has("create", f"{path}/d/a"))
    assert has("create", f"{path}/d", is_dir=True)(events)
    assert (await sbx.exec(path, "chmod -x d/a")).exit_code == 0
    await until(w, has("attrib", f"{path}/d/a"))


async def test_rename_is_one_move_event_with_both_paths(
    sbx: AsyncSandbox, area: tuple[Path, str], watches: list[AsyncWatch], tmp_path: Path
) -> None:
    """Renaming inside the watch gives one move (old -> new); out is delete; in is create."""
    host, path = area
    (host / "a.txt").write_text("x")
    w = await start(sbx, watches, path)
    os.rename(host / "a.txt", host / "b.txt")
    events = await until(w, has("move", f"{path}/b.txt", old_path=f"{path}/a.txt"))
    assert [e.type for e in events] == ["move"]
    os.rename(host / "b.txt", tmp_path / "out.txt")
    await until(w, has("delete", f"{path}/b.txt"))
    os.rename(tmp_path / "out.txt", host / "back.txt")
    await until(w, has("create", f"{path}/back.txt"))


async def test_renamed_directory_keeps_being_watched_under_its_new_name(
    sbx: AsyncSandbox, area: tuple[Path, str], watches: list[AsyncWatch]
) -> None:
    """After a directory is renamed, changes inside it carry the new path."""
    host, path = area
    (host / "old").mkdir()
    w = await start(sbx, watches, path)
    os.rename(host / "old", host / "new")
    await until(w, has("move", f"{path}/new", old_path=f"{path}/old", is_dir=True))
    (host / "new" / "f").write_text("x")
    await until(w, has("create", f"{path}/new/f"))


async def test_attrib_event_on_chmod(
    sbx: AsyncSandbox, area: tuple[Path, str], watches: list[AsyncWatch]
) -> None:
    """chmod of a file is an attrib event."""
    host, path = area
    (host / "run.sh").write_text("#!/bin/sh\n")
    w = await start(sbx, watches, path)
    os.chmod(host / "run.sh", 0o755)
    await until(w, has("attrib", f"{path}/run.sh"))


async def test_new_directories_are_watched_and_scanned(
    sbx: AsyncSandbox, area: tuple[Path, str], watches: list[AsyncWatch]
) -> None:
    """A tree made faster than the watch could follow is reported by scanning, then watched."""
    host, path = area
    w = await start(sbx, watches, path)
    deep = host / "a" / "b" / "c"
    deep.mkdir(parents=True)
    (deep / "early.txt").write_text("made before execd could watch c")
    events = await until(w, has("create", f"{path}/a/b/c/early.txt"))
    for d in ("a", "a/b", "a/b/c"):
        assert has("create", f"{path}/{d}", is_dir=True)(events), d
    (deep / "late.txt").write_text("now c is watched")
    await until(w, has("create", f"{path}/a/b/c/late.txt"))


async def test_include_and_exclude_globs(
    sbx: AsyncSandbox, area: tuple[Path, str], watches: list[AsyncWatch]
) -> None:
    """Only included paths are reported; excluded directories are neither reported nor watched."""
    host, path = area
    (host / "node_modules" / "pkg").mkdir(parents=True)
    w = await start(sbx, watches, path, include=["**/*.py"], exclude=["node_modules", "*.tmp.py"])
    assert w.info is not None and w.info.dirs == 1  # node_modules and below are not watched
    (host / "src").mkdir()
    for name in ("src/app.py", "notes.txt", "node_modules/pkg/x.py", "src/scratch.tmp.py"):
        (host / name).write_text("x")
    (host / "last.py").write_text("marker")
    events = await until(w, has("create", f"{path}/last.py"))
    assert {e.path for e in events} == {f"{path}/src/app.py", f"{path}/last.py"}


def interleaved_writes(a: Path, b: Path, n: int) -> None:
    """n writes to each of two files, alternating: the kernel merges only identical neighbours."""
    with a.open("a") as fa, b.open("a") as fb:
        for i in range(n):
            for f in (fa, fb):
                f.write(f"{i}\n")
                f.flush()


async def test_modifies_inside_the_window_coalesce(
    sbx: AsyncSandbox, area: tuple[Path, str], watches: list[AsyncWatch]
) -> None:
    """Twenty writes to one file inside the window become one modify with count 20."""
    host, path = area
    (host / "log.txt").write_text("")
    (host / "other.txt").write_text("")
    w = await start(sbx, watches, path, coalesce=1.0)
    interleaved_writes(host / "log.txt", host / "other.txt", 20)
    events = await until(w, has("modify", f"{path}/log.txt"))
    modifies = [e for e in events if e.path == f"{path}/log.txt"]
    assert len(modifies) == 1 and modifies[0].count == 20


async def test_no_coalescing_with_window_zero(
    sbx: AsyncSandbox, area: tuple[Path, str], watches: list[AsyncWatch]
) -> None:
    """With coalesce=0 each write is its own event."""
    host, path = area
    (host / "log.txt").write_text("")
    (host / "other.txt").write_text("")
    w = await start(sbx, watches, path, coalesce=0)
    interleaved_writes(host / "log.txt", host / "other.txt", 5)
    events = await until(w, lambda ev: sum(e.path.endswith("log.txt") for e in ev) >= 5)
    assert all(e.count == 1 and e.type == "modify" for e in events)


async def test_overflow_is_reported_not_silent(
    sbx: AsyncSandbox, area: tuple[Path, str], watches: list[AsyncWatch]
) -> None:
    """Past the queue bound, a poll from an old cursor starts with an overflow event."""
    host, path = area
    w = await start(sbx, watches, path, queue=4, coalesce=0)
    for i in range(20):
        (host / f"f{i:02}").touch()

    async def next_cursor() -> int:
        return next(i.next_cursor for i in await sbx.watch.list() if i.watch_id == w.watch_id)

    deadline = time.monotonic() + 10
    while await next_cursor() < 20:
        assert time.monotonic() < deadline, "events never reached execd's queue"
        await asyncio.sleep(0.05)
    batch = await w.poll()
    assert batch.skipped == 16 and batch.cursor == 16
    first, *rest = batch.events
    assert first.type == "overflow" and first.reason == "queue" and first.count == 16
    assert [e.path for e in rest] == [f"{path}/f{i}" for i in range(16, 20)]


async def test_cursor_query_after_being_away(
    sbx: AsyncSandbox, nats: NatsServer, area: tuple[Path, str], watches: list[AsyncWatch]
) -> None:
    """A client that comes back (on another connection) gets what changed since its cursor."""
    host, path = area
    w = await start(sbx, watches, path)
    (host / "seen").touch()
    await until(w, has("create", f"{path}/seen"))
    cursor = w.cursor
    (host / "missed-1").touch()
    (host / "missed-2").touch()
    async with await AsyncSandbox.connect("shared", nats_url=nats.url) as other:
        assert w.watch_id is not None
        back = other.watch.attach(w.watch_id, cursor)
        events = await until(back, lambda ev: len(ev) >= 2)
    assert [e.path for e in events] == [f"{path}/missed-1", f"{path}/missed-2"]
    assert events[0].seq == cursor
    empty = await sbx.watch.poll(w.watch_id, cursor + 2)
    assert empty.events == () and empty.next_cursor == cursor + 2


async def test_stop_list_and_unknown_ids(
    sbx: AsyncSandbox, area: tuple[Path, str], watches: list[AsyncWatch]
) -> None:
    """list shows a watch until stop; then poll and stop say watch.not_found."""
    _, path = area
    w = await start(sbx, watches, path)
    assert w.watch_id in {i.watch_id for i in await sbx.watch.list()}
    info = await sbx.watch.stop(w.watch_id)
    assert info.state == "closed" and info.path == path
    assert w.watch_id not in {i.watch_id for i in await sbx.watch.list()}
    with pytest.raises(WatchNotFound):
        await sbx.watch.poll(w.watch_id, 0)
    with pytest.raises(WatchNotFound):
        await sbx.watch.stop("no-such-watch")


async def _watch_gone(sbx: AsyncSandbox, watch_id: str | None, timeout: float = 10.0) -> None:
    """Wait until execd no longer lists ``watch_id``; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while watch_id in {i.watch_id for i in await sbx.watch.list()}:
        if time.monotonic() > deadline:
            pytest.fail(f"watch {watch_id} still runs after its iteration was left")
        await asyncio.sleep(0.02)


async def test_breaking_out_of_a_bare_iteration_stops_the_watch(
    sbx: AsyncSandbox, area: tuple[Path, str], watches: list[AsyncWatch]
) -> None:
    """`async for ev in sbx.watch(p): break` (no `async with`) stops the watch in execd instead
    of leaving it to collect events until its idle timeout."""
    host, path = area
    w = await sbx.watch(path).start()
    watches.append(w)
    (host / "f.txt").write_text("x")
    async for ev in w:
        assert ev.path == f"{path}/f.txt"
        break
    await _watch_gone(sbx, w.watch_id)


async def test_an_exception_in_a_bare_iteration_stops_the_watch(
    sbx: AsyncSandbox, area: tuple[Path, str], watches: list[AsyncWatch]
) -> None:
    """An exception raised in the loop body also stops the watch of a bare iteration."""
    host, path = area
    w = await sbx.watch(path).start()
    watches.append(w)
    (host / "f.txt").write_text("x")

    async def fail_in_the_loop() -> None:
        async for _ in w:
            raise LookupError

    with pytest.raises(LookupError):
        await fail_in_the_loop()
    await _watch_gone(sbx, w.watch_id)


async def test_breaking_out_inside_async_with_keeps_the_watch(
    sbx: AsyncSandbox, area: tuple[Path, str]
) -> None:
    """Inside `async with` the block owns the watch: a break leaves it running (iterating
    again continues with the next event) until the block ends."""
    host, path = area
    async with sbx.watch(path) as w:
        (host / "a.txt").write_text("x")
        async for ev in w:
            assert ev.path == f"{path}/a.txt"
            break
        assert w.watch_id in {i.watch_id for i in await sbx.watch.list()}
        (host / "b.txt").write_text("x")
        async for ev in w:
            if ev.path == f"{path}/b.txt":
                break
    assert w.watch_id not in {i.watch_id for i in await sbx.watch.list()}


async def test_removing_the_watched_directory_ends_the_watch(
    sbx: AsyncSandbox, area: tuple[Path, str], watches: list[AsyncWatch]
) -> None:
    """Deleting the root reports its deletion, then the watch is closed."""
    host, path = area
    w = await start(sbx, watches, path)
    host.rmdir()
    events = await until(w, has("delete", path, is_dir=True))
    assert events[-1].type == "delete"
    last = await w.poll()
    assert last.closed and w.closed


async def test_single_file_watch(
    sbx: AsyncSandbox, area: tuple[Path, str], watches: list[AsyncWatch]
) -> None:
    """Watching one file reports its modification under its own path."""
    host, path = area
    (host / "one.txt").write_text("a")
    w = await start(sbx, watches, f"{path}/one.txt")
    (host / "one.txt").write_text("b")
    await until(w, has("modify", f"{path}/one.txt"))


async def test_symlinked_directories_are_not_followed(
    sbx: AsyncSandbox, area: tuple[Path, str], watches: list[AsyncWatch], tmp_path: Path
) -> None:
    """A symlink in the tree to a directory outside it does not leak outside events."""
    host, path = area
    os.symlink(tmp_path, host / "link")
    w = await start(sbx, watches, path)
    (tmp_path / "outside.txt").write_text("x")
    (host / "inside.txt").write_text("x")
    events = await until(w, has("create", f"{path}/inside.txt"))
    assert not any("outside" in e.path for e in events)


async def test_hostile_input_gets_typed_errors(sbx: AsyncSandbox, area: tuple[Path, str]) -> None:
    """Missing paths, NUL bytes, overlong names and bad globs are refused with typed errors."""
    _, path = area
    with pytest.raises(FsNotFound):
        await sbx.watch.start(f"{path}/missing")
    with pytest.raises(BadRequest):
        await sbx.watch.start(f"{path}/a\x00b")
    for raw in ({"v": 1, "path": 42}, {"v": 1, "path": path, "include": "*.py"}, {"v": 1}):
        reply = await sbx.bus.request(sbx.channel.subject("watch", "start"), pack(raw), 5)
        with pytest.raises(BadRequest):  # what a client in another language might send
            decode_reply(WatchInfo, reply)
    with pytest.raises(FsInvalidPath):
        await sbx.watch.start(f"{path}/" + "x" * 5000)
    with pytest.raises(WatchError):
        await sbx.watch.start(path, include=["[z-a]"])
    with pytest.raises(BadRequest):
        await sbx.watch.start(path, coalesce=-1)
    with pytest.raises(BadRequest):
        await sbx.watch.poll("w", -1)


async def test_watch_limit_per_sandbox(start_execd: Callable[..., Execd], nats: NatsServer) -> None:
    """Past the per-sandbox bound, watch.start fails with watch.limit (retryable)."""
    execd = start_execd()
    async with await AsyncSandbox.connect(execd.ids[0], nats_url=nats.url) as sbx:
        opened = []
        refused: WatchLimit | None = None
        for _ in range(100):
            try:
                opened.append(await sbx.watch.start("/workspace"))
            except WatchLimit as exc:
                refused = exc
                break
        assert refused is not None and refused.retryable
        assert refused.details["limit"] == len(opened)
        for w in opened:
            await w.stop()
        assert await sbx.watch.list() == []


async def test_execd_shutdown_stops_watches(
    start_execd: Callable[..., Execd], nats: NatsServer
) -> None:
    """Stopping execd ends a watch: a waiting poll answers closed and execd exits 0."""
    execd = start_execd()
    async with await AsyncSandbox.connect(execd.ids[0], nats_url=nats.url) as sbx:
        w = await sbx.watch.start("/workspace")
        poll = asyncio.create_task(w.poll(wait=30))
        await sbx.watch.list()  # answered after execd took the poll in (same connection, in order)
        assert await asyncio.to_thread(execd.stop) == 0
        batch = await poll
        assert batch.closed


def test_sync_sdk_watch(nats: NatsServer, shared_execd: Execd, area: tuple[Path, str]) -> None:
    """The blocking SDK iterates events and stops the watch on exit."""
    host, path = area
    with Sandbox.connect("shared", nats_url=nats.url) as sbx, sbx.watch(path) as w:
        (host / "sync.txt").write_text("x")
        event = next(iter(w))
        assert (event.type, event.path) == ("create", f"{path}/sync.txt")
        watch_id = w.watch_id
    with Sandbox.connect("shared", nats_url=nats.url) as sbx:
        assert watch_id not in {i.watch_id for i in sbx.watch.list()}


def test_breaking_out_of_a_bare_sync_iteration_stops_the_watch(
    nats: NatsServer, shared_execd: Execd, area: tuple[Path, str]
) -> None:
    """`for ev in sbx.watch(p): break` in the blocking SDK stops the watch it started."""
    host, path = area
    with Sandbox.connect("shared", nats_url=nats.url) as sbx:
        w = sbx.watch(path).start()
        try:
            (host / "f.txt").write_text("x")
            for ev in w:
                assert ev.path == f"{path}/f.txt"
                break
            assert w.watch_id not in {i.watch_id for i in sbx.watch.list()}
        finally:
            w.stop()


def test_cli_prints_events_and_stops_on_ctrl_c(
    nats: NatsServer, shared_execd: Execd, area: tuple[Path, str]
) -> None:
    """`sandpod watch` prints one line per event; SIGINT stops it (exit 0) and the watch."""
    host, path = area
    env = {**os.environ, "SANDPOD_NATS_URL": nats.url}
    cli = subprocess.Popen(
        [SANDPOD, "watch", "shared", path, "--exclude", "*.tmp"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert cli.stderr is not None and cli.stdout is not None
        assert cli.stderr.readline().startswith(f"watching {path} (1 directories)")
        (host / "skip.tmp").write_text("x")
        (host / "seen.txt").write_text("x")
        line = cli.stdout.readline()
        assert line.split()[1:3] == ["create", f"{path}/seen.txt"]
        cli.send_signal(signal.SIGINT)
        assert cli.wait(15) == 0
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    with Sandbox.connect("shared", nats_url=nats.url) as sbx:
        assert not any(i.path == path for i in sbx.watch.list())


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_cli_prints_events_as_json_or_yaml(
    nats: NatsServer, shared_execd: Execd, area: tuple[Path, str], fmt: str
) -> None:
    """`sandpod watch -o json` prints one JSON object per line, `-o yaml` one YAML document per
    event; each parses back to the event's fields. SIGTERM stops it (exit 0)."""
    host, path = area
    env = {**os.environ, "SANDPOD_NATS_URL": nats.url}
    cli = subprocess.Popen(
        [SANDPOD, "watch", "shared", path, "-o", fmt],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert cli.stderr is not None and cli.stdout is not None
        assert cli.stderr.readline().startswith(f"watching {path}")
        (host / "seen.txt").write_text("x")
        if fmt == "json":
            event = json.loads(cli.stdout.readline())
        else:
            assert cli.stdout.readline() == "---\n"
            event = yaml.safe_load("".join(cli.stdout.readline() for _ in range(8)))
        assert (event["type"], event["path"], event["is_dir"]) == (
            "create",
            f"{path}/seen.txt",
            False,
        )
        assert isinstance(event["time"], float) and event["old_path"] is None
        cli.terminate()
        assert cli.wait(15) == 0
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
