"""`sandpod shell` end to end, run under a real pseudo-terminal as a user's terminal would."""

from __future__ import annotations

import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import sysconfig
import termios
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import Execd, NatsServer, wait_until
from sandpod import Sandbox

SANDPOD = str(Path(sysconfig.get_path("scripts")) / "sandpod")
_ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>]")


def screen_lines(data: bytes) -> list[str]:
    clean = _ANSI.sub(b"", data).decode("utf-8", "replace")
    return [line.rsplit("\r", 1)[-1] for line in clean.split("\r\n")]


class LocalTerminal:
    """A pty standing in for the user's terminal, with ``sandpod shell`` running on it."""

    def __init__(self, args: list[str], nats_url: str, cols: int = 100, rows: int = 30) -> None:
        self.master, self.slave = os.openpty()
        self.resize(cols, rows)
        self.cooked = termios.tcgetattr(self.slave)
        self.output = b""
        self.proc = subprocess.Popen(
            [SANDPOD, "shell", *args],
            stdin=self.slave,
            stdout=self.slave,
            stderr=self.slave,
            env={**os.environ, "SANDPOD_NATS_URL": nats_url, "TERM": "xterm-256color"},
            start_new_session=True,
        )

    def resize(self, cols: int, rows: int) -> None:
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def read_until(self, done: object, timeout: float = 20) -> bytes:
        """Read the terminal until ``done`` (bytes to find, or "exit") happens; all output."""
        end = time.monotonic() + timeout
        while True:
            if (isinstance(done, bytes) and done in self.output) or (done == "any" and self.output):
                return self.output
            if done == "exit" and self.proc.poll() is not None:
                self._drain()
                return self.output
            if time.monotonic() > end:
                pytest.fail(f"waited {timeout}s for {done!r}; terminal shows {self.output!r}")
            ready, _, _ = select.select([self.master], [], [], 0.05)
            if ready:
                self.output += os.read(self.master, 65536)

    def _drain(self) -> None:
        while select.select([self.master], [], [], 0)[0]:
            chunk = os.read(self.master, 65536)
            if not chunk:
                break
            self.output += chunk

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        os.close(self.master)
        os.close(self.slave)


@pytest.fixture
def local_terminals(nats: NatsServer, shared_execd: Execd) -> Iterator[list[LocalTerminal]]:
    made: list[LocalTerminal] = []
    yield made
    for term in made:
        term.close()


def test_shell_in_a_real_terminal_propagates_the_exit_code(
    nats: NatsServer, local_terminals: list[LocalTerminal]
) -> None:
    """Typing `echo hi; exit 3` into `sandpod shell` shows `hi`, exits 3, gives the remote
    shell the local window size, and leaves the local terminal as it found it."""
    term = LocalTerminal(["shared"], nats.url, cols=100, rows=30)
    local_terminals.append(term)
    term.read_until("any")  # output is written once the local terminal is in raw mode
    term.type(b"stty size; echo hi; exit 3\r")
    shown = screen_lines(term.read_until("exit"))
    assert term.proc.returncode == 3
    assert "hi" in shown and "30 100" in shown, shown
    assert termios.tcgetattr(term.slave) == term.cooked  # raw mode undone


def test_detach_resize_and_reattach(nats: NatsServer, local_terminals: list[LocalTerminal]) -> None:
    """Ctrl-] detaches leaving the shell running; SIGWINCH resizes it; `--attach` replays what
    it printed and the exit code of the re-attached session is the CLI's."""
    pty_id = f"cli-{uuid.uuid4().hex[:8]}"
    first = LocalTerminal(["shared", "--id", pty_id], nats.url, cols=90, rows=20)
    local_terminals.append(first)
    first.type(b"echo one-$((40+2))\r")
    first.read_until(b"one-42\r\n")
    first.resize(120, 40)
    first.proc.send_signal(signal.SIGWINCH)
    with Sandbox.connect("shared", nats_url=nats.url) as sbx:  # the resize reached execd
        wait_until(lambda: sbx.pty.get(pty_id).cols == 120, 10, "the resize to reach execd")
    first.type(b"stty size\r")
    first.read_until(b"40 120\r\n")
    first.type(b"\x1d")
    assert "--attach " + pty_id in first.read_until("exit").decode(errors="replace")
    assert first.proc.returncode == 0
    second = LocalTerminal(["shared", "--attach", pty_id], nats.url)
    local_terminals.append(second)
    second.read_until(b"one-42\r\n")  # replayed from the buffer
    second.type(b"exit 4\r")
    second.read_until("exit")
    assert second.proc.returncode == 4


def test_shell_with_piped_stdin(nats: NatsServer, shared_execd: Execd) -> None:
    """Without a terminal, stdin is typed as it is and its end is Ctrl-D; options may follow
    the sandbox id."""
    script = "read a; echo got-$a-$X; cat >/dev/null"
    run = subprocess.run(
        [SANDPOD, "shell", "shared", "-e", "X=y", "--", "sh", "-c", script],
        input=b"x1\n",
        capture_output=True,
        timeout=30,
        env={**os.environ, "SANDPOD_NATS_URL": nats.url},
    )
    assert run.returncode == 0, run
    assert b"got-x1-y" in run.stdout
