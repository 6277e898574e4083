"""Streaming exec: ordering, flow control, stdin, signals, cancel, resume, abandonment."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from conftest import Execd, NatsServer
from sandpod import AsyncExecStream, AsyncSandbox
from sandpod.errors import BadRequest, StreamClosed
from sandpod.exec.args import exec_status
from sandpod_bus import Bus, BusSettings, Inbound
from sandpod_contract.codec import Message, decode, decode_reply, encode, unpack
from sandpod_contract.messages.exec import (
    ExecExit,
    ExecRef,
    ExecResume,
    ExecStart,
    ExecStarted,
    ExecStatus,
    OutputChunk,
    StreamAck,
)
from sandpod_contract.subjects import Subjects

PY = "python3"


async def test_chunks_arrive_in_order_then_the_exit(sbx: AsyncSandbox) -> None:
    """Chunks carry consecutive sequence numbers; the exit status follows the last one."""
    seqs, out = [], b""
    async with sbx.exec_stream("for i in $(seq 1 50); do echo line$i; done; exit 4") as st:
        async for chunk in st:
            seqs.append(chunk.seq)
            out += chunk.data
        status = await st.wait()
    assert seqs == list(range(1, len(seqs) + 1))
    assert out == b"".join(f"line{i}\n".encode() for i in range(1, 51))
    assert status.exit_code == 4 and status.stdout_size == len(out)


async def test_stdout_and_stderr_are_told_apart(sbx: AsyncSandbox) -> None:
    """Each chunk says which stream it came from."""
    got: dict[str, bytes] = {"stdout": b"", "stderr": b""}
    async with sbx.exec_stream(["sh", "-c", "echo a; echo b >&2; echo c"]) as st:
        async for chunk in st:
            got[chunk.stream] += chunk.data
    assert got == {"stdout": b"a\nc\n", "stderr": b"b\n"}


def _wchan(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return ""


def _blocked_writing(pid: int) -> bool:
    """``pid`` sleeps in the kernel's pipe_write."""
    try:
        sleeping = psutil.Process(pid).status() == psutil.STATUS_SLEEPING
    except psutil.Error:
        return False
    return sleeping and "pipe_write" in _wchan(pid)


async def _until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.02)

    try:
        await asyncio.wait_for(poll(), timeout)
    except TimeoutError:
        pytest.fail(f"timed out waiting for {what}")


async def test_slow_consumer_blocks_the_command_and_loses_nothing(sbx: AsyncSandbox) -> None:
    """With the window full, execd stops reading: the writer blocks in pipe_write; then every
    byte still arrives in order once the consumer reads."""
    total = 32 * 1024 * 1024
    writer = (
        "import sys\n"
        f"for i in range({total // 4096}):\n"
        "    sys.stdout.buffer.write(i.to_bytes(4, 'big') * 1024)\n"
    )
    st = sbx.exec_stream([PY, "-c", writer], window=256 * 1024)
    async with st:
        pid = st.pid
        assert pid is not None
        # Consume nothing: the command must end up blocked writing to its full pipe. Both
        # facts are one condition: under load the pipe can fill before execd's pumps took the
        # window's worth, so a writer seen in pipe_write once may be running again just after.
        await _until(lambda: _blocked_writing(pid), 20, "the writer to block")
        received = bytearray()
        async for chunk in st:
            received += chunk.data
            if len(received) < 2 * 1024 * 1024:
                await asyncio.sleep(0.001)  # be slow for a while
        status = await st.wait()
    assert status.exit_code == 0
    assert len(received) == total
    expected = b"".join(i.to_bytes(4, "big") * 1024 for i in range(total // 4096))
    assert hashlib.sha256(received).digest() == hashlib.sha256(expected).digest()


async def test_execd_memory_stays_bounded_by_the_window(
    sbx: AsyncSandbox,
    shared_execd: Execd,
) -> None:
    """A fast producer and an absent consumer do not grow execd's memory."""
    execd = psutil.Process(shared_execd.proc.pid)
    rss_before = execd.memory_info().rss
    st = sbx.exec_stream(["cat", "/dev/zero"], window=1024 * 1024)
    async with st:
        pid = st.pid
        assert pid is not None, "a started command has a pid"
        await _until(lambda: "pipe_write" in _wchan(pid), 20, "cat to block")
        growth = execd.memory_info().rss - rss_before
        await st.cancel()
        status = await st.wait()
    assert status.cancelled and status.signal == signal.SIGKILL
    assert growth < 32 * 1024 * 1024, f"execd grew by {growth} bytes with a 1 MiB window"


async def test_stdin_streams_with_eof(sbx: AsyncSandbox) -> None:
    """Bytes written to stdin reach the command in order; close_stdin delivers EOF."""
    data = os.urandom(2 * 1024 * 1024 + 17)
    out = bytearray()
    async with sbx.exec_stream("cat", stdin_open=True) as st:

        async def feed() -> None:
            for i in range(0, len(data), 100_000):
                await st.write(data[i : i + 100_000])
            await st.close_stdin()

        feeder = asyncio.create_task(feed())
        async for chunk in st:
            out += chunk.data
        await feeder
        status = await st.wait()
    assert bytes(out) == data and status.exit_code == 0


async def test_writing_after_eof_is_a_typed_error(sbx: AsyncSandbox) -> None:
    """stdin that is already closed refuses further writes with StreamClosed."""
    async with sbx.exec_stream("cat >/dev/null; sleep 0.1", stdin_open=True) as st:
        await st.close_stdin()
        with pytest.raises(StreamClosed):
            await st.write(b"late")
        assert (await st.wait()).exit_code == 0


async def test_signal_reaches_the_running_command(sbx: AsyncSandbox) -> None:
    """A signal sent to a stream is delivered to the command's process group."""
    script = "trap 'echo got-term; exit 7' TERM; echo ready; while :; do sleep 0.05; done"
    async with sbx.exec_stream(script) as st:
        first = await st.__anext__()
        assert first.data == b"ready\n"
        await st.signal(signal.SIGTERM)
        rest = b"".join([c.data async for c in st])
        status = await st.wait()
    assert b"got-term" in rest and status.exit_code == 7


async def test_cancel_kills_the_command(sbx: AsyncSandbox) -> None:
    """cancel() kills the tree; the exit says cancelled."""
    async with sbx.exec_stream("echo started; sleep 300") as st:
        await st.__anext__()
        await st.cancel()
        status = await st.wait()
    assert status.cancelled and status.signal == signal.SIGKILL


async def test_stream_timeout_kills_and_says_so(sbx: AsyncSandbox) -> None:
    """A streaming exec's timeout kills the command and the exit says timed_out."""
    async with sbx.exec_stream("sleep 300", timeout=0.5) as st:
        status = await st.wait()
    assert status.timed_out and status.signal == signal.SIGKILL


async def _gone(sbx: AsyncSandbox, exec_id: str, pid: int) -> None:
    """Wait until the exec's process no longer runs (execd still knows the exec: its frames
    wait for an ack until the abandon period ends, but the command is dead)."""
    assert (await exec_status(sbx.channel, exec_id)).pid == pid

    async def poll() -> None:
        while _running(pid):
            await asyncio.sleep(0.02)

    try:
        await asyncio.wait_for(poll(), 10)
    except TimeoutError:
        pytest.fail(f"exec {exec_id} (pid {pid}) still runs after its iteration was left")


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def _cleaned_up(st: AsyncExecStream) -> None:
    """Wait for the close that leaving a bare iteration started: it runs in the task the event
    loop creates to finalize the abandoned generator, which nobody else awaits, so a test that
    ended before its cancel round trip did would leave it running (the leak guard's wait)."""
    await st.close()  # joins the close under way


async def test_breaking_out_of_a_bare_iteration_cancels_the_command(sbx: AsyncSandbox) -> None:
    """`async for chunk in sbx.exec_stream(...): break` (no `async with`) cancels the command
    and stops the keepalives, instead of acking a stream nobody reads forever."""
    st = sbx.exec_stream("yes")
    async for chunk in st:
        assert chunk.data.startswith(b"y\n")
        break
    assert st.pid is not None
    await _gone(sbx, st.exec_id, st.pid)
    await _cleaned_up(st)


async def test_an_exception_in_a_bare_iteration_cancels_the_command(sbx: AsyncSandbox) -> None:
    """An exception raised in the loop body also ends the command of a bare iteration."""
    st = sbx.exec_stream("yes")

    async def fail_in_the_loop() -> None:
        async for _ in st:
            raise LookupError

    with pytest.raises(LookupError):
        await fail_in_the_loop()
    assert st.pid is not None
    await _gone(sbx, st.exec_id, st.pid)
    await _cleaned_up(st)


async def test_streams_nobody_reads_any_more_do_not_hold_execds_shutdown(
    nats: NatsServer,
    start_execd: Callable[..., Execd],
) -> None:
    """A stream whose bare iteration was left early (its command cancelled, its client gone
    without acking the exit frame) ends as soon as execd stops: nothing is still waiting for
    delivery when the shutdown grace period ends, so nothing has to be cancelled then."""
    execd = start_execd()
    async with await AsyncSandbox.connect(execd.ids[0], nats_url=nats.url) as sbx:
        st = sbx.exec_stream("yes")
        async for _ in st:
            break
        assert st.pid is not None
        await _gone(sbx, st.exec_id, st.pid)
        await _cleaned_up(st)
    assert execd.stop() == 0
    assert "task_cancelled_at_shutdown" not in execd.log.read_text()


async def test_breaking_out_inside_async_with_keeps_the_command(sbx: AsyncSandbox) -> None:
    """Inside `async with` the block owns the command: a break leaves it running (iterating
    again continues the output) until the block ends."""
    async with sbx.exec_stream("echo one; read _; echo two", stdin_open=True) as st:
        async for chunk in st:
            assert chunk.data == b"one\n"
            break
        assert (await exec_status(sbx.channel, st.exec_id)).state == "running"
        await st.write(b"go\n")
        assert b"".join([c.data async for c in st]) == b"two\n"
        assert (await st.wait()).exit_code == 0


class RawClient:
    """Speaks the streaming protocol by hand (no SDK), to test execd's side of it."""

    def __init__(self, bus: Bus, sandbox: str) -> None:
        self.bus = bus
        self.subjects = Subjects()
        self.sandbox = sandbox
        self.frames: asyncio.Queue[OutputChunk | ExecExit] = asyncio.Queue()

    def subject(self, verb: str) -> str:
        return self.subjects.sandbox(self.sandbox, "exec", verb)

    async def on_frame(self, msg: Inbound) -> None:
        raw = unpack(msg.data)
        frame: OutputChunk | ExecExit = (
            decode(ExecExit, msg.data) if raw["kind"] == "exit" else decode(OutputChunk, msg.data)
        )
        await self.frames.put(frame)

    async def start(self, **kw: Any) -> tuple[str, ExecStarted]:
        inbox = self.bus.new_inbox()
        await self.bus.subscribe(inbox, self.on_frame)
        req = ExecStart(deliver=inbox, **kw)
        reply = await self.bus.request(self.subject("start"), encode(req), 5)
        return inbox, decode_reply(ExecStarted, reply)

    async def call(
        self, verb: str, msg: Message, reply_type: type[ExecStatus] = ExecStatus
    ) -> ExecStatus:
        return decode_reply(reply_type, await self.bus.request(self.subject(verb), encode(msg), 5))


@pytest.fixture
async def raw(nats: NatsServer, shared_execd: Execd) -> AsyncIterator[RawClient]:
    bus = await Bus.connect(BusSettings(url=nats.url))
    yield RawClient(bus, "shared")
    await bus.close()


async def test_resume_resends_unacked_frames(raw: RawClient) -> None:
    """Frames not yet acknowledged are kept and re-sent on resume, with the same seqs."""
    _, started = await raw.start(shell="echo one; sleep 0.05; echo two")
    first = [await raw.frames.get()]
    while not isinstance(first[-1], ExecExit):
        first.append(await raw.frames.get())
    assert len(first) >= 2
    await raw.call("resume", ExecResume(exec_id=started.exec_id, from_seq=1))
    again = [await raw.frames.get() for _ in first]
    assert [f.seq for f in again] == [f.seq for f in first]
    assert again == first


async def test_resume_before_the_acked_point_is_refused(raw: RawClient) -> None:
    """Frames the client acknowledged are released; asking for them again is a bad request."""
    from sandpod_contract.messages.exec import StreamAck

    _, started = await raw.start(shell="echo a; sleep 300")
    chunk = await raw.frames.get()
    await raw.bus.publish(
        raw.subject("ack"), encode(StreamAck(exec_id=started.exec_id, seq=chunk.seq))
    )
    await raw.bus.flush()
    with pytest.raises(BadRequest):
        await raw.call("resume", ExecResume(exec_id=started.exec_id, from_seq=1))
    status = await raw.call("cancel", ExecRef(exec_id=started.exec_id))
    assert status.state in {"running", "exited"}
    frame = await raw.frames.get()
    assert isinstance(frame, ExecExit) and frame.cancelled


async def test_a_silent_client_is_abandoned_and_its_command_killed(raw: RawClient) -> None:
    """A client that stops acking and sending keepalives loses its command after abandon_after."""
    _, started = await raw.start(shell="sleep 300", abandon_after=0.5)
    frame = await asyncio.wait_for(raw.frames.get(), 20)
    assert isinstance(frame, ExecExit)
    assert frame.abandoned and frame.signal == signal.SIGKILL
    assert not psutil.pid_exists(started.pid) or psutil.Process(started.pid).status() == "zombie"


async def _status_until(
    raw: RawClient, exec_id: str, done: Callable[[ExecStatus], bool], timeout: float, what: str
) -> ExecStatus:
    """Poll ``exec.status`` until ``done(status)``; fail with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not done(status := await raw.call("status", ExecRef(exec_id=exec_id))):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}; last: {status}")
        await asyncio.sleep(0.02)
    return status


async def _drain(raw: RawClient, exec_id: str, seen: int) -> None:
    """Ack frame ``seen`` and every later one up to the exit frame, so execd lets it go."""
    while True:
        await raw.bus.publish(raw.subject("ack"), encode(StreamAck(exec_id=exec_id, seq=seen)))
        frame = await asyncio.wait_for(raw.frames.get(), 10)
        seen = frame.seq
        if isinstance(frame, ExecExit):
            await raw.bus.publish(raw.subject("ack"), encode(StreamAck(exec_id=exec_id, seq=seen)))
            await raw.bus.flush()
            return


async def test_status_reports_the_exit_of_a_cancelled_stream_with_a_full_window(
    raw: RawClient,
) -> None:
    """A cancelled stream whose client never acked (window full, exit frame held back) reports
    `exited` with the killing signal as soon as its process died, not `running` for the whole
    abandon period."""
    _, started = await raw.start(shell="yes", window=4096)
    first = await raw.frames.get()
    assert isinstance(first, OutputChunk)
    try:
        await raw.call("cancel", ExecRef(exec_id=started.exec_id))
        status = await _status_until(
            raw, started.exec_id, lambda s: s.state == "exited", 5, "the cancelled exec to exit"
        )
        assert status.signal == signal.SIGKILL and status.exit_code is None
        assert status.pid == started.pid
    finally:
        await _drain(raw, started.exec_id, first.seq)


async def test_a_dead_stream_whose_client_went_silent_is_let_go(raw: RawClient) -> None:
    """A stream whose command died while the client's window was full is forgotten after
    abandon_after (its exec slot freed), instead of waiting for window credit forever."""
    _, started = await raw.start(shell="yes", window=4096, abandon_after=0.5)
    assert isinstance(await raw.frames.get(), OutputChunk)
    await raw.call("cancel", ExecRef(exec_id=started.exec_id))
    status = await _status_until(
        raw, started.exec_id, lambda s: s.next_seq is None, 10, "execd to forget the stream"
    )
    assert status.state == "exited"


async def test_sdk_keepalive_prevents_abandonment(sbx: AsyncSandbox) -> None:
    """A live SDK stream with a quiet command is not abandoned: keepalives reach execd."""
    async with sbx.exec_stream("sleep 1.5; echo late", abandon_after=0.4) as st:
        out = b"".join([c.data async for c in st])
        status = await st.wait()
    assert out == b"late\n" and not status.abandoned and status.exit_code == 0


async def test_large_initial_stdin_echoed_back_does_not_deadlock(sbx: AsyncSandbox) -> None:
    """Initial stdin bigger than a pipe, echoed by the command, flows while output streams."""
    data = os.urandom(900 * 1024)
    async with sbx.exec_stream("cat", stdin=data, window=64 * 1024, timeout=30) as st:
        out = b"".join([c.data async for c in st])
        status = await st.wait()
    assert status.exit_code == 0 and not status.timed_out
    assert out == data


async def test_after_the_exit_frame_is_acked_every_verb_but_status_finds_no_stream(
    raw: RawClient,
) -> None:
    """Once the exit frame is acked the stream is released at once: cancel, signal, resume and
    stdin answer exec.not_found (not an exec.status of the released stream), and status still
    answers exited with the exit code from execd's memory (issue 13.5 item 4)."""
    from sandpod.errors import ExecNotFound
    from sandpod_contract.messages.exec import ExecSignal, StdinWrite

    _, started = await raw.start(shell="exit 3")
    exit_frame = await raw.frames.get()
    while not isinstance(exit_frame, ExecExit):
        exit_frame = await raw.frames.get()
    ack = StreamAck(exec_id=started.exec_id, seq=exit_frame.seq)
    await raw.bus.publish(raw.subject("ack"), encode(ack))  # ack and cancel keep their order
    ref = ExecRef(exec_id=started.exec_id)
    for verb, msg in (
        ("cancel", ref),
        ("signal", ExecSignal(exec_id=started.exec_id, signal=15)),
        ("resume", ExecResume(exec_id=started.exec_id, from_seq=exit_frame.seq + 1)),
        ("stdin", StdinWrite(exec_id=started.exec_id, eof=True)),
    ):
        with pytest.raises(ExecNotFound):
            await raw.call(verb, msg)
    status = await raw.call("status", ref)
    assert (status.state, status.exit_code) == ("exited", 3)
