"""Which process group a terminal signal goes to (the CI run that signalled its own make)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from sandpod_execd.terminal import foreground_group


@pytest.fixture
def pty_pair() -> Iterator[tuple[int, int]]:
    master, slave = os.openpty()
    yield master, slave
    os.close(master)
    os.close(slave)


def test_a_pty_nobody_controls_yet_signals_the_program_not_our_own_group(
    pty_pair: tuple[int, int],
) -> None:
    """Before the program took the pty as its controlling terminal, tcgetpgrp answers 0 and
    killpg(0) would hit execd's own group: the program's group is used instead."""
    master, _ = pty_pair
    assert os.tcgetpgrp(master) == 0  # the hazard this guards against
    assert foreground_group(master, 4242) == 4242


def test_a_closed_terminal_signals_the_program(pty_pair: tuple[int, int]) -> None:
    assert foreground_group(None, 4242) == 4242
    assert foreground_group(-1, 4242) == 4242  # EBADF


def test_the_foreground_job_of_a_controlled_pty_is_chosen(pty_pair: tuple[int, int]) -> None:
    master, slave = pty_pair
    child = subprocess.Popen(
        [
            "setsid",
            "--ctty",
            sys.executable,
            "-c",
            "import os; print(os.getpid(), flush=True); input()",
        ],
        stdin=slave,
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        program = int(child.stdout.readline())  # it runs, so it holds the pty by now
        assert foreground_group(master, 1) == program
    finally:
        child.kill()
        child.wait()
