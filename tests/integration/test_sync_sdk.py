"""The synchronous SDK has the same surface as the async one."""

from __future__ import annotations

import signal

import psutil
import pytest

from conftest import Execd, NatsServer, wait_until
from sandpod import ExecResult, Sandbox
from sandpod._loop import run
from sandpod.errors import ArgvExpected, InvalidCwd
from sandpod.exec.args import exec_status


def test_the_write_up_call_works_verbatim(nats: NatsServer, shared_execd: Execd) -> None:
    """`Sandbox.connect("default", nats_url=...).exec("/workspace", "date")` from the write-up."""
    sbx = Sandbox.connect("default", nats_url=nats.url)
    r = sbx.exec("/workspace", "date")
    assert isinstance(r, ExecResult)
    assert r.exit_code == 0 and r.stderr == ""
    assert str(__import__("datetime").datetime.now().year) in r.stdout
    sbx.close()


def test_context_manager_stream_stdin_and_errors(nats: NatsServer, shared_execd: Execd) -> None:
    """Sync exec, stream with stdin, signal and typed errors behave like the async SDK."""
    with Sandbox.connect("shared", nats_url=nats.url) as sbx:
        assert sbx.exec(["echo", "one arg"]).stdout == "one arg\n"
        with sbx.exec_stream("/workspace", "cat; echo end >&2", stdin_open=True) as st:
            st.write("hello ")
            st.write(b"world")
            st.close_stdin()
            chunks = list(st)
            status = st.wait()
        assert b"".join(c.data for c in chunks if c.stream == "stdout") == b"hello world"
        assert b"".join(c.data for c in chunks if c.stream == "stderr") == b"end\n"
        assert status.exit_code == 0
        with sbx.exec_stream("echo go; sleep 300") as st:
            assert next(st).text == "go\n"
            st.signal(signal.SIGINT)
            assert st.wait().signal == signal.SIGINT
        with pytest.raises(InvalidCwd):
            sbx.exec("/definitely/not/here", "true")
        with pytest.raises(ArgvExpected, match=r"exec\(\['ls', '-l'\]\)"):
            sbx.exec("ls", "-l")  # a program and its option: the error shows the argv form
        assert sbx.runtime_info().runtime == "process"


def test_breaking_out_of_a_bare_sync_iteration_cancels_the_command(
    nats: NatsServer, shared_execd: Execd
) -> None:
    """`for chunk in sbx.exec_stream(...): break` (the README's loop) ends the command."""
    with Sandbox.connect("shared", nats_url=nats.url) as sbx:
        st = sbx.exec_stream("yes")
        for chunk in st:
            assert chunk.data.startswith(b"y\n")
            break
        assert st.pid is not None
        pid = st.pid

        assert run(exec_status(sbx._inner.channel, st.exec_id)).pid == pid
        wait_until(lambda: _gone(pid), 10, "the command of the abandoned iteration to end")


def _gone(pid: int) -> bool:
    """The process no longer runs (exited, possibly not yet reaped)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
