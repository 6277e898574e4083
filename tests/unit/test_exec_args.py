"""The exec call shapes: ``exec("/workspace", "date")`` is (cwd, command); ``exec("ls", "-l")``
is a program and its arguments given in the wrong form, and the error says so.

Fast layer over a fake :class:`~sandpod.channel.Channel` that answers ``exec.run`` the way execd
does; tests/integration/test_exec_oneshot.py checks the same against a real sandbox.
"""

from __future__ import annotations

from typing import TypeVar

import pytest

from sandpod.channel import Limits
from sandpod.errors import ArgvExpected, BadRequest, InvalidCwd
from sandpod.exec.api import open_exec_stream, run_exec
from sandpod.exec.args import cwd_and_command
from sandpod_bus import Bus
from sandpod_contract.codec import Message
from sandpod_contract.messages.exec import ExecRequest
from sandpod_contract.messages.exec import ExecResult as WireResult

R = TypeVar("R", bound=Message)


class FakeChannel:
    """Answers ``exec.run``: an empty success in an existing cwd, else execd's InvalidCwd."""

    def __init__(self, dirs: set[str]) -> None:
        self.dirs = dirs
        self.sent: list[ExecRequest] = []

    @property
    def sandbox_id(self) -> str:
        return "fake"

    @property
    def bus(self) -> Bus:
        raise NotImplementedError("no streams in this test")

    @property
    def limits(self) -> Limits:
        return Limits(max_payload=1024 * 1024)

    def subject(self, family: str, verb: str) -> str:
        return f"sandpod.sandbox.fake.{family}.{verb}"

    async def call(self, family: str, verb: str, msg: Message, reply: type[R], timeout: float) -> R:
        assert (family, verb, reply) == ("exec", "run", WireResult)
        assert isinstance(msg, ExecRequest)
        self.sent.append(msg)
        if msg.cwd is not None and msg.cwd not in self.dirs:
            raise InvalidCwd(f"cwd {msg.cwd!r}: no such directory")
        result = WireResult(exec_id=msg.exec_id or "", exit_code=0, duration=0.01)
        assert isinstance(result, reply)
        return result

    async def publish(self, family: str, verb: str, msg: Message) -> None:
        raise NotImplementedError


async def _exec(channel: FakeChannel, first: str, second: str | None = None) -> None:
    await run_exec(
        channel, first, second, env=None, stdin=None, timeout=5, max_output=None, check=False
    )


def test_cwd_then_shell_command_is_the_write_ups_form() -> None:
    """``("/workspace", "date")`` is a cwd and a shell command; one positional is the command."""
    assert cwd_and_command("/workspace", "date") == ("/workspace", "date")
    assert cwd_and_command("ls -l", None) == (None, "ls -l")
    assert cwd_and_command(["ls", "-l"], None) == (None, ["ls", "-l"])
    assert cwd_and_command("src", ["make", "-j4"]) == ("src", ["make", "-j4"])


def test_an_option_as_the_command_says_to_pass_an_argv_list() -> None:
    """``("ls", "-l")``: no shell command starts with ``-``; the error shows the argv form."""
    with pytest.raises(ArgvExpected) as info:
        cwd_and_command("ls", "-l")
    assert "exec(['ls', '-l'])" in info.value.message
    assert isinstance(info.value, BadRequest) and isinstance(info.value, InvalidCwd)
    assert info.value.code == "exec.argv_expected"
    with pytest.raises(ArgvExpected, match=r"exec\(\['grep', '-r', 'x'\]\)"):
        cwd_and_command("grep", "-r x")


async def test_the_write_ups_call_reaches_execd_with_cwd_and_shell() -> None:
    """``exec("/workspace", "date")`` is sent as cwd /workspace and shell ``date``."""
    channel = FakeChannel({"/workspace"})
    await _exec(channel, "/workspace", "date")
    [sent] = channel.sent
    assert (sent.cwd, sent.shell, sent.argv) == ("/workspace", "date", None)


async def test_option_command_is_refused_before_anything_is_sent() -> None:
    """``exec("ls", "-l")`` fails in the SDK with the argv hint; execd never sees it."""
    channel = FakeChannel({"/workspace"})
    with pytest.raises(ArgvExpected, match=r"argv list: exec\(\['ls', '-l'\]\)"):
        await _exec(channel, "ls", "-l")
    assert channel.sent == []


async def test_a_program_name_that_is_no_directory_gets_the_argv_hint() -> None:
    """``exec("python3", "app.py")``: execd's InvalidCwd becomes ArgvExpected with the argv."""
    channel = FakeChannel({"/workspace"})
    with pytest.raises(ArgvExpected) as info:
        await _exec(channel, "python3", "app.py")
    assert "no directory 'python3'" in info.value.message
    assert "exec(['python3', 'app.py'])" in info.value.message
    assert isinstance(info.value.__cause__, InvalidCwd)


async def test_a_missing_path_stays_a_plain_invalid_cwd() -> None:
    """A cwd that reads as a path (``/no/such``, ``./build``) keeps execd's InvalidCwd."""
    channel = FakeChannel({"/workspace"})
    for cwd in ("/no/such/dir", "./build", "src/app"):
        with pytest.raises(InvalidCwd) as info:
            await _exec(channel, cwd, "true")
        assert type(info.value) is InvalidCwd, cwd


def test_exec_stream_refuses_an_option_command_too() -> None:
    """``exec_stream("ls", "-l")`` raises the same hint when the stream is made, not later."""
    with pytest.raises(ArgvExpected):
        open_exec_stream(
            FakeChannel(set()),
            "ls",
            "-l",
            env=None,
            stdin=None,
            stdin_open=False,
            timeout=None,
            window=None,
            abandon_after=None,
        )
