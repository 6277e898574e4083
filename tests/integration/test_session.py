"""Shell sessions: persistent state, framing, ordering, parallelism, timeouts, dead shells."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import psutil
import pytest

from conftest import Execd, NatsServer, marker, pids_with, wait_until
from sandpod import AsyncSandbox, Sandbox
from sandpod.errors import BadRequest, CommandFailed, InvalidCwd
from sandpod.session import AsyncSession
from sandpod_bus import Bus, BusSettings
from sandpod_contract.codec import decode_reply, pack
from sandpod_contract.errors import SessionAlreadyExists, SessionDead, SessionNotFound
from sandpod_contract.messages.session import SessionResult as WireResult
from sandpod_contract.subjects import Subjects


def sid() -> str:
    return f"s-{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def sessions(sbx: AsyncSandbox) -> AsyncIterator[Callable[..., object]]:
    """A factory for sessions that are deleted at the end of the test, whatever happened."""
    made: list[AsyncSession] = []

    async def make(**kw: object) -> AsyncSession:
        session = await sbx.sessions.create(sid(), **kw)  # type: ignore[arg-type]
        made.append(session)
        return session

    yield make
    for session in made:
        with contextlib.suppress(SessionNotFound):
            await session.delete()


async def until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.02)

    try:
        await asyncio.wait_for(poll(), timeout)
    except TimeoutError:
        pytest.fail(f"timed out waiting for {what}")


async def test_state_persists_across_a_hundred_commands(sessions) -> None:  # type: ignore[no-untyped-def]
    """cd, exported and plain variables, functions and aliases carry from command to command."""
    sh = await sessions()
    setup = (
        "mkdir -p state-dir && cd state-dir\n"
        "export EXPORTED=yes; plain=1; n=0\n"
        "bump() { n=$((n + 1)); echo $n; }\n"
        "alias hello='echo hello from alias'"
    )
    assert (await sh.run(setup)).exit_code == 0
    for i in range(1, 101):
        r = await sh.run("bump")
        assert (r.stdout, r.exit_code) == (f"{i}\n", 0)
    r = await sh.run('echo "$EXPORTED $plain $(basename "$PWD")"; hello; sh -c \'echo $EXPORTED\'')
    assert r.stdout == "yes 1 state-dir\nhello from alias\nyes\n"
    assert r.cwd is not None and r.cwd.endswith("/state-dir")
    assert (await sh.status()).commands == 102


async def test_stdout_stderr_exit_code_and_stdin(sessions) -> None:  # type: ignore[no-untyped-def]
    """Each command gets its own stdout, stderr and status; stdin is fed then EOF."""
    sh = await sessions()
    r = await sh.run("echo out; echo err >&2; (exit 7)")
    assert (r.stdout, r.stderr, r.exit_code, r.ok) == ("out\n", "err\n", 7, False)
    r = await sh.run("tr a-z A-Z", stdin="shout")
    assert r.stdout == "SHOUT"
    r = await sh.run("cat")  # no stdin: /dev/null, never the shell's own input
    assert (r.stdout, r.exit_code) == ("", 0)
    with pytest.raises(CommandFailed):
        await sh.run("false", check=True)


async def test_framing_survives_hostile_output(sessions) -> None:  # type: ignore[no-untyped-def]
    """Output without a newline, binary bytes, NULs, marker-like text, syntax errors and
    unclosed quotes cannot confuse the protocol."""
    sh = await sessions()
    r = await sh.run("printf 'no newline'")
    assert r.stdout_bytes == b"no newline"
    every_byte = bytes(range(256))
    r = await sh.run("cat", stdin=every_byte)
    assert r.stdout_bytes == every_byte
    fake = "\\036" + "0" * 32 + " 0 /fake\\0"
    r = await sh.run(f"printf '{fake}'; printf '{fake}' >&2; echo after")
    assert r.stdout_bytes == b"\x1e" + b"0" * 32 + b" 0 /fake\x00after\n" and r.cwd != "/fake"
    r = await sh.run('echo "unclosed')
    assert r.exit_code == 2 and "unexpected EOF" in r.stderr
    r = await sh.run("if then fi")
    assert r.exit_code == 2
    r = await sh.run("echo still fine\necho two lines")
    assert r.stdout == "still fine\ntwo lines\n"
    r = await sh.run("mkdir -p $'bad\\xffdir' && cd $'bad\\xffdir'")  # a cwd that is not UTF-8
    assert r.exit_code == 0 and r.cwd is not None and r.cwd.endswith("/bad\ufffddir")


async def test_large_output_is_fetched_transparently(sessions) -> None:  # type: ignore[no-untyped-def]
    """Output beyond one NATS message comes back whole (the SDK fetches the rest)."""
    sh = await sessions()
    r = await sh.run("head -c 3000000 /dev/urandom | tee /dev/stderr | sha256sum")
    assert len(r.stderr_bytes) == 3_000_000
    assert r.stdout.split()[0] == hashlib.sha256(r.stderr_bytes).hexdigest()
    r = await sh.run("head -c 5000 /dev/zero", max_output=1000)
    assert len(r.stdout_bytes) == 1000 and r.stdout_truncated


async def test_max_output_is_clamped_to_execd_limit(nats: NatsServer, start_execd) -> None:  # type: ignore[no-untyped-def]
    """A session command's huge max_output is clamped to SANDPOD_EXECD_MAX_OUTPUT_LIMIT, as
    exec's is (flagged truncated), and the session keeps working."""
    limit = 256 * 1024
    execd: Execd = start_execd(SANDPOD_EXECD_MAX_OUTPUT_LIMIT=str(limit))
    async with await AsyncSandbox.connect(execd.ids[0], nats_url=nats.url) as sbx:
        sh = await sbx.sessions.create(sid())
        r = await sh.run("head -c 3000000 /dev/zero; echo done >&2", max_output=2**40)
        assert r.exit_code == 0
        assert len(r.stdout_bytes) == limit and r.stdout_truncated
        assert r.stderr == "done\n" and not r.stderr_truncated
        assert (await sh.run("echo still")).stdout == "still\n"
        await sh.delete()


async def test_a_timeout_kills_the_command_not_the_session(sessions) -> None:  # type: ignore[no-untyped-def]
    """State set before a timed-out command survives it; the command's processes are gone."""
    sh = await sessions()
    m = marker()
    r = await sh.run(f"export KEPT=before; cd /; sh -c 'sleep 300; :' {m}", timeout=0.5)
    assert r.timed_out and r.exit_code == 124 and not r.shell_exited
    assert pids_with(m) == []
    r = await sh.run('echo "$KEPT $PWD"')
    assert r.stdout == "before /\n"
    r = await sh.run("SPIN=1; while :; do :; done", timeout=0.5)  # a loop inside the shell itself
    assert r.timed_out
    r = await sh.run("spin() { while :; do :; done; }; spin; echo after-spin", timeout=0.5)
    assert r.timed_out and (await sh.status()).state == "idle"
    assert (await sh.run('echo "$KEPT $SPIN"')).stdout == "before 1\n"


async def test_a_timeout_spares_background_jobs_of_earlier_commands(sessions) -> None:  # type: ignore[no-untyped-def]
    """Killing a timed-out command does not kill what earlier commands left running."""
    sh = await sessions()
    m = marker()
    await sh.run(f"sh -c 'sleep 300; :' {m}-bg > /dev/null 2>&1 &")
    await until(lambda: bool(pids_with(f"{m}-bg")), 10, "the background job")
    r = await sh.run(f"sh -c 'sleep 300; :' {m}-fg", timeout=0.5)
    assert r.timed_out and pids_with(f"{m}-fg") == []
    assert pids_with(f"{m}-bg")


def carrying(variable: str, value: str) -> list[int]:
    """Live processes whose environment holds ``variable=value`` (zombies have none)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(variable) == value:
                found.append(proc.pid)
    return found


async def test_a_timeout_kills_what_the_command_started_outside_the_shells_tree(sessions) -> None:  # type: ignore[no-untyped-def]
    """A daemon the timed-out command started with setsid from a subshell that exited (so it is
    re-parented, out of the shell's tree) dies too: it carries the command's own tree token."""
    sh = await sessions()
    m = marker()
    try:
        r = await sh.run(f"(SANDPOD_TEST_MARK={m} setsid sleep 300 &); sleep 30", timeout=1)
        assert r.timed_out and not r.shell_exited
        await until(lambda: not carrying("SANDPOD_TEST_MARK", m), 10, "the daemon to die")
        assert (await sh.run("echo still here")).stdout == "still here\n"
    finally:
        for pid in carrying("SANDPOD_TEST_MARK", m):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def test_sessions_run_in_parallel(sessions, sbx: AsyncSandbox) -> None:  # type: ignore[no-untyped-def]
    """Two sessions' commands overlap: each waits for a file only the other one creates."""
    a, b = await sessions(), await sessions()
    tag = uuid.uuid4().hex

    def meet(me: str, other: str) -> str:
        return f"touch {tag}-{me}; while [ ! -e {tag}-{other} ]; do sleep 0.01; done; echo met"

    try:
        ra, rb = await asyncio.gather(
            a.run(meet("a", "b"), timeout=30), b.run(meet("b", "a"), timeout=30)
        )
    finally:
        await sbx.exec(f"rm -f {tag}-a {tag}-b")
    assert (ra.stdout, rb.stdout) == ("met\n", "met\n")


async def test_commands_of_one_session_run_one_at_a_time_in_order(sessions) -> None:  # type: ignore[no-untyped-def]
    """Commands sent at once to one session never overlap and run in the order sent."""
    sh = await sessions()
    await sh.run("rm -f order.log")
    step = "if [ -e busy ]; then echo overlap; fi; touch busy; echo {i} >> order.log; rm busy"
    results = await asyncio.gather(*(sh.run(step.format(i=i)) for i in range(20)))
    assert all(r.stdout == "" and r.exit_code == 0 for r in results)
    numbers = (await sh.run("cat order.log")).stdout.split()
    assert numbers == [str(i) for i in range(20)]  # requests published in this order


async def test_cancel_ends_the_running_command_and_queued_ones(sessions, sbx: AsyncSandbox) -> None:  # type: ignore[no-untyped-def]
    """cancel() ends a running command (130) or drops a queued one; the session stays."""
    sh = await sessions()
    running = asyncio.ensure_future(
        sh.run("export X=1; sleep 300", command_id="long", timeout=None)
    )
    queued = asyncio.ensure_future(sh.run("echo never", command_id="waiting"))
    deadline = asyncio.get_running_loop().time() + 10
    while (info := await sh.status()).running != "long" or info.queued != 1:
        assert asyncio.get_running_loop().time() < deadline, f"never queued: {info}"
        await asyncio.sleep(0.02)
    await sh.cancel("waiting")
    await sh.cancel("long")
    r_run, r_queued = await asyncio.gather(running, queued)
    assert (r_run.cancelled, r_run.exit_code, r_run.timed_out) == (True, 130, False)
    assert (r_queued.cancelled, r_queued.exit_code, r_queued.stdout) == (True, None, "")
    assert (await sh.run("echo $X")).stdout == "1\n"


async def test_a_dead_shell_is_reported_and_can_be_recreated(sbx: AsyncSandbox) -> None:
    """`exit` ends the shell: its result says so, later runs get session.dead, create revives."""
    session_id = sid()
    sh = await sbx.sessions.create(session_id)
    try:
        await sh.run("export GONE=1")
        r = await sh.run("echo bye; exit 3")
        assert (r.shell_exited, r.exit_code, r.stdout) == (True, 3, "bye\n")
        with pytest.raises(SessionDead):
            await sh.run("echo hello")
        info = await sh.status()
        assert (info.state, info.exit_code) == ("dead", 3)
        again = await sbx.sessions.create(session_id)
        assert (await again.run("echo ${GONE:-fresh}")).stdout == "fresh\n"
        with pytest.raises(SessionAlreadyExists):
            await sbx.sessions.create(session_id)
    finally:
        await sbx.sessions.delete(session_id)


async def test_create_list_delete_and_errors(sbx: AsyncSandbox, state_dir: Path) -> None:
    """create honours cwd and env; list shows sessions; delete kills what the shell started."""
    (state_dir / "workspaces" / "shared" / "sess-cwd").mkdir(parents=True, exist_ok=True)
    m = marker()
    sh = await sbx.sessions.create(sid(), cwd="/workspace/sess-cwd", env={"GREETING": "hey"})
    r = await sh.run('echo "$GREETING $SANDPOD_SESSION_ID"; basename "$PWD"')
    assert r.stdout == f"hey {sh.id}\nsess-cwd\n"
    await sh.run(f"setsid sh -c 'sleep 300; :' {m} > /dev/null 2>&1 &")
    await until(lambda: bool(pids_with(m)), 10, "the session's background job")
    assert sh.id in {s.session_id for s in await sbx.sessions.list()}
    assert (await sh.delete()).state == "dead"
    wait_until(lambda: not pids_with(m), 10, "delete to kill the session's processes")
    with pytest.raises(SessionNotFound):
        await sbx.sessions.run(sh.id, "true")
    with pytest.raises(InvalidCwd):
        await sbx.sessions.create(sid(), cwd="/no/such/dir")


@pytest.fixture
async def bus(nats: NatsServer) -> AsyncIterator[Bus]:
    b = await Bus.connect(BusSettings(url=nats.url))
    yield b
    await b.close()


@pytest.mark.parametrize(
    "payload",
    [
        {"v": 1, "session_id": "../x", "command": "true"},
        {"v": 1, "session_id": "s" * 200, "command": "true"},
        {"v": 1, "session_id": "ok", "command": "echo \x00"},
        {"v": 1, "session_id": "ok", "command": ["echo", "argv"]},
        {"v": 1, "session_id": "ok", "command": "true", "timeout": -1.0},
        {"v": 1, "session_id": "ok", "command": "true", "command_id": "a b"},
    ],
)
async def test_hostile_run_requests_get_bad_request(bus: Bus, payload: dict) -> None:  # type: ignore[type-arg]
    """Path-like or oversized ids, NUL bytes and wrong types are refused before anything runs."""
    reply = await bus.request(Subjects().sandbox("shared", "session", "run"), pack(payload), 5)
    with pytest.raises(BadRequest):
        decode_reply(WireResult, reply)


async def test_execd_shutdown_kills_every_shell(nats: NatsServer, start_execd) -> None:  # type: ignore[no-untyped-def]
    """Stopping execd kills session shells, their running commands and background jobs."""
    execd: Execd = start_execd()
    m = marker()
    async with await AsyncSandbox.connect(execd.ids[0], nats_url=nats.url) as sbx:
        sh = await sbx.sessions.create("doomed")
        await sh.run(f"setsid sh -c 'sleep 300; :' {m}-bg > /dev/null 2>&1 &")
        running = asyncio.ensure_future(sh.run(f"sh -c 'sleep 300; :' {m}-fg", timeout=None))
        await until(lambda: len(pids_with(m)) >= 2, 10, "the session's processes")
        assert execd.stop() == 0
        with contextlib.suppress(Exception):
            await asyncio.wait_for(running, 10)
    wait_until(lambda: not pids_with(m), 10, "every shell process to be gone")


def test_the_sync_sdk_has_the_same_surface(nats: NatsServer, shared_execd: Execd) -> None:
    """Blocking create, run, status, list and delete work like the async ones."""
    with Sandbox.connect("shared", nats_url=nats.url) as sbx, sbx.sessions.create(sid()) as sh:
        sh.run("cd /tmp && export V=7")
        r = sh.run("echo $V; pwd")
        assert (r.stdout, r.cwd) == ("7\n/tmp\n", "/tmp")
        assert sh.run("sleep 30", timeout=0.3).timed_out
        assert sbx.sessions.run(sh.id, "echo $V").stdout == "7\n"
        assert sh.id in {s.session_id for s in sbx.sessions.list()}
        assert sh.status().state == "idle"
