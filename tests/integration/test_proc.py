"""Background processes: start, list, logs by cursor, re-attach, waits, tree kill, bounds."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import Execd, NatsServer, free_port, marker, pids_with, wait_until
from sandpod import AsyncSandbox, Sandbox
from sandpod.errors import BadRequest, CommandNotFound, InvalidCwd
from sandpod.proc import AsyncProc, ProcessInfo, ProcExited, ProcWaitTimeout
from sandpod_bus import Bus, BusSettings
from sandpod_contract.codec import decode_reply, pack
from sandpod_contract.errors import ProcIdInUse, ProcNotFound
from sandpod_contract.messages.proc import ProcInfo
from sandpod_contract.subjects import Subjects

MiB = 1024 * 1024


def pid_() -> str:
    return f"p-{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def procs(sbx: AsyncSandbox) -> AsyncIterator[list[AsyncProc]]:
    """Processes a test started; removed (trees killed) at the end even if the test failed."""
    started: list[AsyncProc] = []
    yield started
    for p in started:
        with contextlib.suppress(ProcNotFound):
            await p.remove()


async def start(
    sbx: AsyncSandbox, procs: list[AsyncProc], *args: str | list[str], **kw: Any
) -> AsyncProc:
    p = await sbx.proc.start(*args, proc_id=pid_(), **kw)
    procs.append(p)
    return p


async def until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.02)

    try:
        await asyncio.wait_for(poll(), timeout)
    except TimeoutError:
        pytest.fail(f"timed out waiting for {what}")


def workspace(state_dir: Path, sandbox: str = "shared") -> Path:
    return state_dir / "workspaces" / sandbox


async def test_exit_code_signal_and_status_fields(
    sbx: AsyncSandbox, procs: list[AsyncProc]
) -> None:
    """A finished process reports its exit code (or signal), sizes and times."""
    p = await start(sbx, procs, "echo out; echo err >&2; exit 3")
    info = await p.wait(10)
    assert (info.state, info.exit_code, info.signal, info.killed) == ("exited", 3, None, False)
    assert (info.stdout_size, info.stderr_size, info.log_end) == (4, 4, 8)
    assert info.ended_at is not None and info.ended_at >= info.started_at
    q = await start(sbx, procs, ["sh", "-c", "kill -9 $$"])
    info = await q.wait(10)
    assert (info.exit_code, info.signal) == (None, 9)


async def test_argv_env_cwd_stdin_and_proc_id(
    sbx: AsyncSandbox, procs: list[AsyncProc], state_dir: Path
) -> None:
    """argv runs without a shell; env, cwd (/workspace alias), stdin and SANDPOD_PROC_ID apply."""
    (workspace(state_dir) / "proc-sub").mkdir(parents=True, exist_ok=True)
    p = await start(
        sbx,
        procs,
        "/workspace/proc-sub",
        ["sh", "-c", 'pwd; echo "$GREETING $SANDPOD_PROC_ID"; cat', "$notexpanded"],
        env={"GREETING": "hi"},
        stdin=b"from stdin",
    )
    await p.wait(10)
    out = (await p.output()).stdout
    lines = out.split("\n")
    assert lines[0].endswith("/proc-sub")
    assert lines[1] == f"hi {p.id}"
    assert lines[2] == "from stdin"


async def test_list_filters_by_tags_and_state(sbx: AsyncSandbox, procs: list[AsyncProc]) -> None:
    """list() returns every kept record; tags must all match; state filters running/exited."""
    run = uuid.uuid4().hex
    a = await start(sbx, procs, "sleep 300", tags={"run": run, "role": "server"})
    b = await start(sbx, procs, "sleep 300", tags={"run": run, "role": "worker"})
    c = await start(sbx, procs, "true", tags={"run": run, "role": "server"})
    await c.wait(10)

    def ids(infos: list[ProcessInfo]) -> set[str]:
        return {i.proc_id for i in infos}

    assert ids(await sbx.proc.list(tags={"run": run})) == {a.id, b.id, c.id}
    assert ids(await sbx.proc.list(tags={"run": run, "role": "server"})) == {a.id, c.id}
    assert ids(await sbx.proc.list(tags={"run": run}, state="running")) == {a.id, b.id}
    assert ids(await sbx.proc.list(tags={"run": run}, state="exited")) == {c.id}
    listed = {i.proc_id: i for i in await sbx.proc.list(tags={"run": run})}
    assert listed[a.id].tags == {"run": run, "role": "server"}
    assert listed[a.id].command == "sleep 300"


async def test_ids_are_unique_and_unknown_ids_are_typed_errors(
    sbx: AsyncSandbox, procs: list[AsyncProc]
) -> None:
    """A kept id cannot be reused until removed; unknown ids give proc.not_found."""
    p = await start(sbx, procs, "true")
    await p.wait(10)
    with pytest.raises(ProcIdInUse):
        await sbx.proc.start("true", proc_id=p.id)
    await p.remove()
    with pytest.raises(ProcNotFound):
        await sbx.proc.status(p.id)
    again = await sbx.proc.start("true", proc_id=p.id)
    procs.append(again)
    with pytest.raises(ProcNotFound):
        await sbx.proc.kill("never-started")


async def test_spawn_failures_are_typed(sbx: AsyncSandbox) -> None:
    """A missing program or cwd fails the start with the exec family's typed errors."""
    with pytest.raises(CommandNotFound):
        await sbx.proc.start(["definitely-not-a-program-xyz"], proc_id=pid_())
    with pytest.raises(InvalidCwd):
        await sbx.proc.start("/no/such/dir", "true", proc_id=pid_())


@pytest.fixture
async def bus(nats: NatsServer) -> AsyncIterator[Bus]:
    b = await Bus.connect(BusSettings(url=nats.url))
    yield b
    await b.close()


@pytest.mark.parametrize(
    ("verb", "payload"),
    [
        ("start", {"v": 1, "proc_id": "../etc", "shell": "true"}),
        ("start", {"v": 1, "proc_id": "x" * 129, "shell": "true"}),
        ("start", {"v": 1, "shell": "true", "tags": {f"k{i}": "v" for i in range(17)}}),
        ("start", {"v": 1, "shell": "true", "tags": {"ok": "a\x00b"}}),
        ("start", {"v": 1, "shell": "true", "log_limit": 0}),
        ("status", {"v": 1, "proc_id": "a\x00b"}),
        ("logs", {"v": 1, "proc_id": "p", "cursor": "0"}),
        ("logs", {"v": 1, "proc_id": "p", "wait": 3600.0}),
        ("kill", {"v": 1, "proc_id": "p", "signal": 99}),
        ("wait_port", {"v": 1, "port": 70000}),
    ],
)
async def test_hostile_requests_get_bad_request(bus: Bus, verb: str, payload: dict) -> None:  # type: ignore[type-arg]
    """Path-like, oversized, NUL-bearing or mistyped fields are refused before anything runs."""
    reply = await bus.request(Subjects().sandbox("shared", "proc", verb), pack(payload), 5)
    with pytest.raises(BadRequest):
        decode_reply(ProcInfo, reply)


async def test_killing_a_tree_leaves_no_survivors(
    sbx: AsyncSandbox, procs: list[AsyncProc]
) -> None:
    """SIGTERM then SIGKILL reaches children, setsid'd and orphaned grandchildren that ignore
    SIGTERM; nothing with the tree's marker is left."""
    m = marker()
    script = f"""
        sh -c 'sleep 300; :' {m}-child &
        setsid sh -c 'trap "" TERM; echo ready-setsid; sleep 300; :' {m}-setsid &
        (setsid sh -c 'trap "" TERM; echo ready-orphan; sleep 300; :' {m}-orphan &)
        trap "" TERM
        echo ready-top
        wait
    """
    p = await start(sbx, procs, script)
    # Each shell that ignores SIGTERM (the top one too: it sets its trap after starting the
    # others) says so once its trap is set, so SIGTERM cannot win a race against a trap.
    for ready in ("ready-setsid", "ready-orphan", "ready-top"):
        await p.wait_for_log(ready, timeout=10)
    await until(lambda: len(pids_with(m)) >= 3, 10, "the tree to be up")
    info = await p.kill(grace=0.5)
    assert info.state == "exited" and info.killed and info.signal == signal.SIGKILL
    assert pids_with(m) == []


async def test_kill_reaches_a_child_forked_by_the_sigterm_handler(
    sbx: AsyncSandbox, procs: list[AsyncProc]
) -> None:
    """A process whose SIGTERM trap starts a setsid'd daemon and exits within the grace period:
    the tree is scanned again after the grace, so the daemon dies too."""
    m = marker()
    trap = f"setsid sh -c 'sleep 300; :' {m} >/dev/null 2>&1 </dev/null & exit 0"
    p = await start(sbx, procs, f'trap "{trap}" TERM; echo up; while :; do sleep 0.05; done')
    await p.wait_for_log("up", timeout=10)
    try:
        info = await p.kill(grace=5)
        assert info.state == "exited" and info.exit_code == 0  # it left by itself, in the trap
        assert pids_with(m) == []
    finally:
        for pid in pids_with(m):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def test_kill_sends_the_signal_asked_for(sbx: AsyncSandbox, procs: list[AsyncProc]) -> None:
    """kill(SIGINT) delivers SIGINT: a process that exits cleanly on it reports its own code."""
    p = await start(
        sbx, procs, "trap 'echo bye; exit 42' INT; echo up; while :; do sleep 0.05; done"
    )
    await p.wait_for_log("up", timeout=10)
    info = await p.kill(signal.SIGINT, grace=5)
    assert (info.exit_code, info.killed) == (42, True)
    assert "bye" in (await p.output()).stdout


async def test_signal_does_not_end_the_process(sbx: AsyncSandbox, procs: list[AsyncProc]) -> None:
    """signal(SIGHUP) reaches the process group; the process keeps running."""
    p = await start(sbx, procs, "trap 'echo got-hup' HUP; echo up; while :; do sleep 0.05; done")
    await p.wait_for_log("up", timeout=10)
    await p.signal(signal.SIGHUP)
    await p.wait_for_log("got-hup", timeout=10)
    assert (await p.status()).running


async def test_timeout_kills_the_tree(sbx: AsyncSandbox, procs: list[AsyncProc]) -> None:
    """A process past its timeout is killed with its tree and says timed_out."""
    m = marker()
    p = await start(sbx, procs, f"setsid sh -c 'sleep 300; :' {m} & sleep 300", timeout=0.5)
    info = await p.wait(20)
    assert info.timed_out and info.signal == signal.SIGKILL
    await until(lambda: not pids_with(m), 10, "the setsid'd child to die")


async def test_output_does_not_block_when_nobody_reads(
    sbx: AsyncSandbox, procs: list[AsyncProc]
) -> None:
    """64 MiB of output with no reader: the process runs to its end (execd drains the pipes)."""
    p = await start(sbx, procs, "head -c 67108864 /dev/zero; echo done >&2")
    info = await p.wait(60)
    assert info.exit_code == 0 and info.stdout_size == 64 * MiB


async def test_the_log_is_bounded_and_reports_what_was_dropped(
    sbx: AsyncSandbox, procs: list[AsyncProc]
) -> None:
    """With a small log_limit only the tail is kept; reading from 0 says how much was skipped."""
    writer = "import sys; sys.stdout.write(''.join(f'{i:07d}\\n' for i in range(131072)))"
    p = await start(sbx, procs, ["python3", "-c", writer], log_limit=8192)
    info = await p.wait(30)
    assert info.stdout_size == MiB and info.log_limit == 8192
    read = await p.logs(0)
    assert read.skipped == read.cursor == info.log_start > 0
    data = b"".join(c.data for c in read.chunks)
    assert len(data) <= 8192 and data.endswith(b"0131071\n")
    assert read.chunks[0].skipped == read.skipped and read.eof
    assert info.log_end - info.log_start == len(data)


async def test_logs_long_poll_answers_when_output_arrives(
    sbx: AsyncSandbox, procs: list[AsyncProc], state_dir: Path
) -> None:
    """A logs() call with wait returns as soon as new output exists (not after the wait)."""
    go = workspace(state_dir) / f"go-{uuid.uuid4().hex}"
    p = await start(
        sbx, procs, f"echo first; while [ ! -e {go} ]; do sleep 0.02; done; echo second"
    )
    first = await p.wait_for_log("first", timeout=10)
    poll = asyncio.ensure_future(p.logs(first.cursor, wait=50))
    done, _ = await asyncio.wait({poll}, timeout=0.3)
    assert not done  # nothing new yet: execd holds the request
    go.touch()
    read = await asyncio.wait_for(poll, 20)
    assert b"".join(c.data for c in read.chunks) == b"second\n"


async def test_logs_survive_a_client_that_leaves_and_another_reattaches(
    nats: NatsServer, sbx: AsyncSandbox, procs: list[AsyncProc], state_dir: Path
) -> None:
    """Client A reads part of the output and disconnects; client B on a new connection resumes
    from A's cursor and gets exactly the rest: no gap, no duplicate."""
    go = workspace(state_dir) / f"go-{uuid.uuid4().hex}"
    script = (
        "for i in $(seq 1 50); do echo line$i; done; "
        f"while [ ! -e {go} ]; do sleep 0.02; done; "
        "for i in $(seq 51 100); do echo line$i; echo err$i >&2; done"
    )
    p = await start(sbx, procs, script)
    a = await AsyncSandbox.connect("shared", nats_url=nats.url)
    seen, cursor = b"", 0
    async for chunk in a.proc.follow(p.id, stream="stdout"):
        seen += chunk.data
        cursor = chunk.end
        if seen.endswith(b"line50\n"):
            break
    await a.close()
    go.touch()
    b = await AsyncSandbox.connect("shared", nats_url=nats.url)
    try:
        rest = b"".join([c.data async for c in b.proc.follow(p.id, cursor, stream="stdout")])
    finally:
        await b.close()
    assert seen + rest == b"".join(f"line{i}\n".encode() for i in range(1, 101))


async def test_stdout_and_stderr_keep_their_order_and_streams(
    sbx: AsyncSandbox, procs: list[AsyncProc], state_dir: Path
) -> None:
    """Chunks carry their stream, in the order execd read them; offsets are contiguous.

    Two pipes give no order between them by themselves: the process writes each line only
    once execd has logged the one before (the test lets it go on), so that order is the one
    execd read them in, whatever the scheduler does."""
    go = workspace(state_dir) / f"go-{uuid.uuid4().hex}"
    wait = "while [ ! -e {} ]; do sleep 0.02; done"
    script = f"echo a; {wait.format(f'{go}.1')}; echo b >&2; {wait.format(f'{go}.2')}; echo c"
    p = await start(sbx, procs, script)
    await p.wait_for_log("^a$", timeout=30, stream="stdout")
    Path(f"{go}.1").touch()
    await p.wait_for_log("^b$", timeout=30, stream="stderr")
    Path(f"{go}.2").touch()
    await p.wait(30)
    read = await p.logs(0)
    assert [(c.stream, c.data) for c in read.chunks] == [
        ("stdout", b"a\n"),
        ("stderr", b"b\n"),
        ("stdout", b"c\n"),
    ]
    assert [c.offset for c in read.chunks] == [0, 2, 4] and read.next_cursor == 6 and read.eof
    only_err = await p.logs(0, stream="stderr")
    assert [(c.stream, c.data, c.offset) for c in only_err.chunks] == [("stderr", b"b\n", 2)]


async def test_wait_for_log(sbx: AsyncSandbox, procs: list[AsyncProc]) -> None:
    """wait_for_log finds a line (even one without a newline yet), or says why it could not."""
    p = await start(
        sbx, procs, "sleep 0.2; echo 'listening on port 4711'; printf 'Password: '; sleep 300"
    )
    m = await p.wait_for_log(r"port (\d+)", timeout=10)
    assert (m.stream, m.line, m.match.group(1)) == ("stdout", "listening on port 4711", "4711")
    prompt = await p.wait_for_log(r"^Password: $", timeout=10, cursor=m.cursor)
    assert prompt.line == "Password: "
    q = await start(sbx, procs, "echo nothing here; exit 3")
    with pytest.raises(ProcExited) as exited:
        await q.wait_for_log("ready", timeout=10)
    assert exited.value.details["exit_code"] == 3
    with pytest.raises(ProcWaitTimeout):
        await p.wait_for_log("never printed", timeout=0.3)


async def test_wait_for_port_http_and_tcp(sbx: AsyncSandbox, procs: list[AsyncProc]) -> None:
    """wait_for_port sees a server inside the sandbox come up; a dying server fails fast."""
    port = free_port()
    web = await start(
        sbx, procs, ["python3", "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    )
    await web.wait_for_port(port, kind="http", timeout=20)
    await sbx.proc.wait_for_port(port, timeout=5)  # tcp, without naming the process
    fetch = f"import urllib.request as u; print(u.urlopen('http://127.0.0.1:{port}/').status)"
    r = await sbx.exec(["python3", "-c", fetch])
    assert r.stdout == "200\n"
    dying = await start(sbx, procs, "sleep 0.2; exit 1")
    with pytest.raises(ProcExited):
        await dying.wait_for_port(free_port(), timeout=20)
    with pytest.raises(ProcWaitTimeout):
        await sbx.proc.wait_for_port(free_port(), timeout=0.3)


async def test_remove_kills_a_running_process_and_forgets_it(
    sbx: AsyncSandbox, procs: list[AsyncProc]
) -> None:
    """remove() of a running process kills its tree, returns its final state, forgets it."""
    m = marker()
    p = await start(sbx, procs, f"sh -c 'sleep 300; :' {m} & wait")
    await until(lambda: bool(pids_with(m)), 10, "the child")
    info = await p.remove()
    assert info.state == "exited" and info.killed
    assert pids_with(m) == []
    with pytest.raises(ProcNotFound):
        await p.status()


async def test_record_count_is_bounded(nats: NatsServer, start_execd) -> None:  # type: ignore[no-untyped-def]
    """Past 256 kept records the oldest exited ones are forgotten to make room."""
    execd: Execd = start_execd()
    async with await AsyncSandbox.connect(execd.ids[0], nats_url=nats.url) as sbx:
        for i in range(260):
            await sbx.proc.start(["true"], proc_id=f"n{i}")
        await sbx.proc.wait("n259", timeout=10)
        kept = [i.proc_id for i in await sbx.proc.list()]
        assert len(kept) == 256 and kept[-1] == "n259"
        with pytest.raises(ProcNotFound):
            await sbx.proc.status("n0")


async def test_execd_shutdown_kills_every_tree(nats: NatsServer, start_execd) -> None:  # type: ignore[no-untyped-def]
    """Stopping execd ends all background processes, their setsid'd and orphaned children too."""
    execd: Execd = start_execd()
    m = marker()
    async with await AsyncSandbox.connect(execd.ids[0], nats_url=nats.url) as sbx:
        await sbx.proc.start(
            f"setsid sh -c 'sleep 300; :' {m}-a & (setsid sh -c 'sleep 300; :' {m}-b &); sleep 300"
        )
        await sbx.proc.start(["sh", "-c", "trap '' TERM; sleep 300; :", f"{m}-c"])
        await until(lambda: len(pids_with(m)) >= 3, 10, "the trees")
    assert execd.stop() == 0
    wait_until(lambda: not pids_with(m), 10, "every tree to be gone")


async def test_execd_shutdown_ends_what_exited_processes_left_running(
    nats: NatsServer, start_execd: Callable[..., Execd]
) -> None:
    """The trees of processes that already exited are swept at shutdown too: a setsid'd
    orphan one of them left behind (ignoring SIGTERM) dies with execd."""
    execd = start_execd()
    m = marker()
    async with await AsyncSandbox.connect(execd.ids[0], nats_url=nats.url) as sbx:
        script = f"setsid sh -c 'trap \"\" TERM; sleep 300; :' {m} >/dev/null 2>&1 </dev/null &"
        p = await sbx.proc.start(script)
        assert (await p.wait(10)).exit_code == 0
        await until(lambda: len(pids_with(m)) >= 1, 10, "the orphan")
    assert execd.stop() == 0
    wait_until(lambda: not pids_with(m), 10, "the orphan to be gone")


def test_the_sync_sdk_has_the_same_surface(nats: NatsServer, shared_execd: Execd) -> None:
    """Blocking start, follow, wait, output, list, kill and remove work like the async ones."""
    with Sandbox.connect("shared", nats_url=nats.url) as sbx:
        p = sbx.proc.start(
            "for i in 1 2 3; do echo $i; done; exit 5", proc_id=pid_(), tags={"s": "1"}
        )
        assert b"".join(c.data for c in p.follow()) == b"1\n2\n3\n"
        assert p.wait(10).exit_code == 5
        assert sbx.proc.output(p.id).stdout == "1\n2\n3\n"
        assert p.id in {i.proc_id for i in sbx.proc.list(tags={"s": "1"})}
        q = sbx.proc.start("echo ready; sleep 300", proc_id=pid_())
        assert q.wait_for_log("ready", timeout=10).line == "ready"
        assert sbx.proc.kill(q.id, grace=1).killed
        for proc_id in (p.id, q.id):
            sbx.proc.remove(proc_id)
