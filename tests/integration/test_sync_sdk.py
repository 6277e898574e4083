"""The synchronous SDK has the same surface as the async one."""

from __future__ import annotations

import signal

import pytest

from conftest import Execd, NatsServer
from sandpod import ExecResult, Sandbox
from sandpod.errors import InvalidCwd


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
        assert sbx.runtime_info().runtime == "process"
