"""Pseudo-terminals: typing, resize, several viewers, replay, overflow, exit status, close,
job control, abandonment, and hostile input — against a real nats-server and execd."""

from __future__ import annotations

import asyncio
import itertools
import re
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from conftest import Execd, NatsServer, marker, pids_with, wait_until
from sandpod import AsyncSandbox, Sandbox
from sandpod.errors import (
    BadRequest,
    CommandNotFound,
    InvalidCwd,
    PayloadTooLarge,
    PtyClosed,
    PtyIdInUse,
    PtyNotFound,
)
from sandpod.pty import AsyncPty, PtyInfo
from sandpod_contract.codec import decode_reply, pack, unpack
from sandpod_contract.messages.pty import OPERATIONS as PTY_OPERATIONS
from sandpod_contract.messages.pty import PtyInfo as WireInfo

_ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>]")
_marks = itertools.count()


def lines(data: bytes) -> list[str]:
    """What a screen would show, line by line: escapes dropped, each line after its last CR."""
    clean = _ANSI.sub(b"", data).decode("utf-8", "replace")
    return [line.rsplit("\r", 1)[-1] for line in clean.split("\r\n")]


async def run_line(term: AsyncPty, command: str, timeout: float = 15) -> list[str]:
    """Type ``command`` into a shell and return the screen lines up to its end.

    The end mark is typed split by quotes, so the echo of the typed line never matches it.
    """
    n = next(_marks)
    await term.write(f"{command}; echo __m''ark{n}__\r")
    return lines(await term.expect(f"__mark{n}__\r\n", timeout=timeout))


async def wait_state(sbx: AsyncSandbox, pty_id: str, timeout: float = 15) -> PtyInfo:
    """Poll ``pty.get`` (which never reads output) until the program exited."""
    end = time.monotonic() + timeout
    while True:
        info = await sbx.pty.get(pty_id)
        if not info.running:
            return info
        if time.monotonic() > end:
            pytest.fail(f"pty {pty_id} still running after {timeout}s")
        await asyncio.sleep(0.02)


async def test_typed_command_runs_and_its_output_appears(sbx: AsyncSandbox) -> None:
    """Typing `echo hi` + Enter into the login shell prints `hi` on its own line."""
    async with await sbx.pty.open() as term:
        assert "hi" in await run_line(term, "echo hi")


async def test_resize_changes_what_stty_size_reports(sbx: AsyncSandbox) -> None:
    """After a resize the program sees the new window size (`stty size` prints rows cols)."""
    async with await sbx.pty.open(cols=80, rows=24) as term:
        assert "24 80" in await run_line(term, "stty size")
        info = await term.resize(132, 50)
        assert (info.cols, info.rows) == (132, 50)
        assert "50 132" in await run_line(term, "stty size")


async def test_shell_has_a_controlling_terminal_and_job_control(sbx: AsyncSandbox) -> None:
    """`tty` names a pts, the shell has job control on, TERM is xterm-256color, and Ctrl-C
    interrupts the foreground job."""
    async with await sbx.pty.open() as term:
        shown = await run_line(term, "tty; echo flags=$-; echo term=$TERM")
        assert any(line.startswith("/dev/pts/") for line in shown), shown
        flags = next(line for line in shown if line.startswith("flags="))
        assert "m" in flags.removeprefix("flags=")
        assert "term=xterm-256color" in shown
        m = marker()
        await term.write(f"(exec -a {m} sleep 1000)\r")
        # once exec'd, bash has given it the terminal: Ctrl-C now goes to the job, not the shell
        wait_until(lambda: bool(pids_with(m)), 10, "the foreground sleep")
        await term.write("\x03")  # without a controlling terminal this would do nothing
        assert "after" in await run_line(term, "echo after", timeout=10)


async def test_ctrl_c_interrupts_a_program_started_without_a_shell(sbx: AsyncSandbox) -> None:
    """An argv program also gets the terminal as its controlling terminal: Ctrl-C kills it."""
    async with await sbx.pty.open(["sleep", "1000"]) as term:
        # `sleep` runs once the terminal is its controlling one (setsid --ctty, then exec)
        wait_until(lambda: psutil.Process(term.pid).name() == "sleep", 10, "sleep to start")
        await term.write("\x03")
        status = await term.wait(10)
        assert (status.exit_code, status.signal) == (None, signal.SIGINT)


async def test_two_viewers_see_the_same_bytes(sbx: AsyncSandbox) -> None:
    """Two viewers reading from cursor 0 while the program runs get identical byte sequences
    (read in different piece sizes) and the same exit status."""
    script = "for i in $(seq 1 60); do echo line $i; sleep 0.005; done; exit 5"
    async with await sbx.pty.open(["bash", "-c", script]) as first:
        second = await sbx.pty.connect(first.id)

        async def everything(term: AsyncPty, max_bytes: int | None) -> bytes:
            out = b""
            while term.exit is None:
                out += (await term.read(max_bytes=max_bytes, wait=10)).data
            return out

        a, b = await asyncio.gather(everything(first, None), everything(second, 7))
        assert a == b and b"line 60\r\n" in a
        assert first.exit == second.exit and first.exit is not None
        assert first.exit.exit_code == 5
        assert (await first.info()).end_cursor == len(a)


async def test_reattach_from_cursor_zero_replays_earlier_output(sbx: AsyncSandbox) -> None:
    """A viewer that attaches later replays earlier output from cursor 0, then both viewers
    see new output; input from either reaches the same shell."""
    pty_id = f"reattach-{uuid.uuid4().hex[:8]}"
    async with await sbx.pty.open(pty_id=pty_id) as first:
        await run_line(first, "echo early-out")
        late = await sbx.pty.connect(pty_id)
        replay = await late.expect("__mark", timeout=5)
        assert "early-out" in lines(replay)
        assert "late-out" in await run_line(late, "echo late-out")
        assert "late-out" in await run_line(first, "true")


async def test_viewer_behind_the_ring_is_told_how_much_it_missed(sbx: AsyncSandbox) -> None:
    """Output larger than the replay buffer: the program finishes with nobody reading (it never
    waits for viewers), and a late viewer gets `skipped`, then the rest, then the exit."""
    cmd = "head -c 1500000 /dev/zero | tr '\\0' x"
    async with await sbx.pty.open(["sh", "-c", cmd], buffer_bytes=256 * 1024) as term:
        info = await wait_state(sbx, term.id)
        assert info.exit is not None and info.exit.exit_code == 0
        assert info.buffer_bytes == 256 * 1024 and info.end_cursor == 1_500_000
        first = await term.read(wait=0)
        assert first.skipped == first.cursor == info.end_cursor - 256 * 1024
        data = first.data
        while term.exit is None:
            out = await term.read(wait=5, max_bytes=100_000)
            assert out.skipped == 0
            data += out.data
        assert first.skipped + len(data) == 1_500_000 and set(data) == {ord("x")}


async def test_exit_status_is_reported(sbx: AsyncSandbox) -> None:
    """`exit 7` in the shell: the viewer's last read says exited with code 7, and so does get."""
    async with await sbx.pty.open() as term:
        await term.write("exit 7\r")
        status = await term.wait(10)
        assert (status.exit_code, status.signal) == (7, None)
        info = await term.info()
        assert not info.running and info.exit == status
        with pytest.raises(PtyClosed):
            await term.write("echo too late\r")


async def test_close_kills_the_whole_tree(sbx: AsyncSandbox) -> None:
    """Closing a terminal kills its shell and every job, including setsid'd and nohup'd ones,
    and forgets it (closing it again on leaving `async with` is harmless)."""
    m = marker()
    async with await sbx.pty.open() as term:
        await term.write(
            f"(exec -a {m}-a sleep 1000) & setsid bash -c 'exec -a {m}-b sleep 1000' & "
            f"nohup bash -c 'exec -a {m}-c sleep 1000' >/dev/null 2>&1 &\r"
        )
        wait_until(lambda: len(pids_with(m)) == 3, 15, "three background sleeps")
        info = await term.close()
        assert info.exit is not None and info.exit.signal == signal.SIGKILL
        wait_until(lambda: not pids_with(m), 10, "every process of the terminal to die")
        with pytest.raises(PtyNotFound):
            await sbx.pty.get(term.id)
        assert term.id not in {p.pty_id for p in await sbx.pty.list()}


async def test_signal_goes_to_the_foreground_job(sbx: AsyncSandbox) -> None:
    """pty.signal delivers the signal; the exit status names it."""
    async with await sbx.pty.open(["sleep", "1000"]) as term:
        await term.signal(signal.SIGTERM)
        assert (await term.wait(10)).signal == signal.SIGTERM


async def test_a_signal_right_after_open_reaches_the_program(sbx: AsyncSandbox) -> None:
    """Signalled before the program has taken its terminal, the program still gets the signal
    (and never execd's own process group: the CI run this once killed)."""
    for _ in range(15):
        async with await sbx.pty.open(["sleep", "1000"]) as term:
            await term.signal(signal.SIGTERM)
            assert (await term.wait(10)).signal == signal.SIGTERM
    assert (await sbx.exec("true")).exit_code == 0  # execd is alive and well


async def test_abandoned_terminal_is_killed(sbx: AsyncSandbox) -> None:
    """With abandon_after, a terminal no request names for that long is killed (list and get
    do not count as activity: list is used to watch it here)."""
    async with await sbx.pty.open(["sleep", "1000"], abandon_after=0.3) as term:
        end = time.monotonic() + 15
        while (info := next(p for p in await sbx.pty.list() if p.pty_id == term.id)).running:
            assert time.monotonic() < end, "never abandoned"
            await asyncio.sleep(0.05)
        assert info.abandoned and info.exit is not None and info.exit.signal == signal.SIGKILL


async def test_input_is_activity_and_reading_is_not(nats: NatsServer, state_dir: Path) -> None:
    """For idle timeouts typing counts as activity; a parked viewer (read, get) does not.
    On a private execd: what other tests leave running on the shared one moves its clock."""
    execd = Execd(nats.url, state_dir, [f"t-{uuid.uuid4().hex[:10]}"], {})
    try:
        async with await AsyncSandbox.connect(execd.ids[0], nats_url=nats.url) as sbx:
            await _typing_moves_the_clock(sbx)
    finally:
        execd.stop()


async def _typing_moves_the_clock(sbx: AsyncSandbox) -> None:
    async with await sbx.pty.open(["cat"]) as term:
        before = (await sbx.activity()).last_activity
        await term.read(wait=0.2)
        await term.info()
        assert (await sbx.activity()).last_activity == before
        await term.write("x")
        assert (await sbx.activity()).last_activity > before


async def test_env_cwd_and_large_input(sbx: AsyncSandbox) -> None:
    """env and cwd reach the program; 300 kB of typed input arrives whole and in order."""
    await sbx.exec("mkdir -p ptydir")  # runs in the workspace
    async with await sbx.pty.open(
        ["sh", "-c", "stty -echo; echo $FOO; pwd; wc -c"],
        env={"FOO": "bar"},
        cwd="/workspace/ptydir",
    ) as term:
        head = lines(await term.expect("ptydir\r\n"))
        assert "bar" in head and head[-2].endswith("/workspaces/shared/ptydir")
        await term.write(b"x" * 99 + b"\n" * 1 + (b"y" * 99 + b"\n") * 2999 + b"\x04")
        assert "300000" in lines(await term.expect("300000\r\n", timeout=30))
        assert (await term.wait(10)).exit_code == 0


async def test_unknown_pty_id_is_not_found(sbx: AsyncSandbox) -> None:
    """Every verb on an id execd does not know raises PtyNotFound."""
    with pytest.raises(PtyNotFound):
        await sbx.pty.connect("no-such-pty")
    with pytest.raises(PtyNotFound):
        await sbx.pty.close("no-such-pty")
    term = await sbx.pty.open(["true"])
    await term.close()
    actions = (
        lambda: term.read(wait=0),
        lambda: term.write("x"),
        lambda: term.resize(10, 10),
        lambda: term.signal(2),
    )
    for action in actions:
        with pytest.raises(PtyNotFound):
            await action()


async def test_hostile_requests_get_typed_errors(sbx: AsyncSandbox) -> None:
    """Bad sizes, ids, cursors, waits, duplicate ids, missing programs and cwds, and oversized
    input are refused with typed errors; the terminal keeps working."""
    async with await sbx.pty.open(pty_id=f"h-{uuid.uuid4().hex[:8]}") as term:
        for bad in ((-1, 24), (80, 0), (5000, 24)):
            with pytest.raises(BadRequest):
                await term.resize(*bad)
        raw = pack({"v": 1, "pty_id": term.id, "cols": -5, "rows": 10})
        reply = await sbx.bus.request(sbx.channel.subject("pty", "resize"), raw, 5)
        with pytest.raises(BadRequest):
            decode_reply(WireInfo, reply)
        huge = pack({"v": 1, "pty_id": term.id, "data": b"x" * (2 * 1024 * 1024)})
        with pytest.raises(PayloadTooLarge):  # refused before it leaves: over NATS's limit
            await sbx.bus.request(sbx.channel.subject("pty", "input"), huge, 10)
        with pytest.raises(BadRequest):
            await term.read(cursor=10**12, wait=0)
        with pytest.raises(BadRequest):
            await term.read(wait=3600)
        with pytest.raises(PtyIdInUse):
            await sbx.pty.open(pty_id=term.id)
        for bad_id in ("../etc", "a" * 200, "nul\x00", ""):
            with pytest.raises(BadRequest):
                await sbx.pty.open(pty_id=bad_id)
        with pytest.raises(BadRequest):
            await sbx.pty.open(env={"A=B": "x"})
        with pytest.raises(CommandNotFound):
            await sbx.pty.open(["no-such-program-xyz"])
        with pytest.raises(InvalidCwd):
            await sbx.pty.open(cwd="/workspace/does/not/exist")
        assert "still-ok" in await run_line(term, "echo still-ok")


async def test_input_over_the_request_limit_is_refused(
    nats: NatsServer, start_execd: Callable[..., Execd]
) -> None:
    """execd refuses one input request over its request limit with bad_request.too_large; the
    SDK splits large input into pieces under it, so the same bytes go through."""
    execd = start_execd(SANDPOD_EXECD_MAX_REQUEST="65536")
    async with (
        await AsyncSandbox.connect(execd.ids[0], nats_url=nats.url) as sbx,
        await sbx.pty.open(["sh", "-c", "stty -echo; echo ready; wc -c"]) as term,
    ):
        await term.expect("ready\r\n")
        big = pack({"v": 1, "pty_id": term.id, "data": b"z\n" * 40_000})
        reply = await sbx.bus.request(sbx.channel.subject("pty", "input"), big, 10)
        with pytest.raises(PayloadTooLarge):
            decode_reply(WireInfo, reply)
        await term.write(b"z\n" * 40_000 + b"\x04")
        assert "80000" in lines(await term.expect("80000\r\n", timeout=30))


async def test_garbage_on_every_pty_verb_is_refused(sbx: AsyncSandbox) -> None:
    """Malformed payloads and wrong types on every pty subject get bad_request replies; execd
    keeps serving."""
    wrong_types = pack({"v": 1, "pty_id": 7, "data": "s", "cols": "x", "cursor": -1})
    for op in PTY_OPERATIONS:
        for payload in (b"\xc1", pack([1, 2]), wrong_types):
            if op.verb == "list" and payload is wrong_types:
                continue  # pty.list takes no fields: unknown ones are ignored
            reply = unpack(await sbx.bus.request(sbx.channel.subject("pty", op.verb), payload, 5))
            assert reply["error"]["code"] == "bad_request", (op.verb, payload, reply)
    assert await sbx.ping() < 5


def test_sync_sdk_terminal(nats: NatsServer) -> None:
    """The blocking SDK: open, type, expect, list, wait for the exit status."""
    with (
        Sandbox.connect("shared", nats_url=nats.url) as sbx,
        sbx.pty.open(["sh", "-c", "read x; echo got-$x; exit 2"]) as term,
    ):
        assert term.id in {p.pty_id for p in sbx.pty.list()}
        term.write("abc\r")
        assert b"got-abc" in term.expect("got-abc")
        assert term.wait(10).exit_code == 2
        assert [c.data for c in sbx.pty.connect(term.id)]  # a second viewer replays it
