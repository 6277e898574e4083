"""`sandpod ps` and `sandpod logs [-f]` through the real CLI process."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sysconfig
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import Execd, NatsServer
from sandpod import Sandbox

SANDPOD = str(Path(sysconfig.get_path("scripts")) / "sandpod")
EXIT_DEADLINE = 60.0  # seconds for the CLI to exit after Ctrl-C (half the suite's test timeout)


@pytest.fixture
def sync_sbx(nats: NatsServer, shared_execd: Execd) -> Iterator[Sandbox]:
    with Sandbox.connect("shared", nats_url=nats.url) as sbx:
        yield sbx


def cli(nats: NatsServer, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SANDPOD_NATS_URL": nats.url}
    out: subprocess.CompletedProcess[str] = subprocess.run(
        [SANDPOD, *args], env=env, capture_output=True, text=True, timeout=60, **kw
    )
    return out


def test_ps_shows_a_table_and_filters(nats: NatsServer, sync_sbx: Sandbox) -> None:
    """`sandpod ps` lists processes with state, exit code, tags and command; -t/-s filter."""
    run = uuid.uuid4().hex[:8]
    a = sync_sbx.proc.start("sleep 300", proc_id=f"cli-a-{run}", tags={"run": run})
    b = sync_sbx.proc.start("exit 3", proc_id=f"cli-b-{run}", tags={"run": run})
    try:
        b.wait(10)
        out = cli(nats, "ps", "shared", "-t", f"run={run}")
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[0].split() == ["ID", "PID", "STATE", "EXIT", "AGE", "TAGS", "COMMAND"]
        rows = {line.split()[0]: line.split() for line in lines[1:]}
        assert rows[a.id][2:4] == ["running", "-"] and rows[a.id][-2:] == ["sleep", "300"]
        assert rows[b.id][2:4] == ["exited", "3"] and f"run={run}" in rows[b.id]
        running = cli(nats, "ps", "shared", "-t", f"run={run}", "-s", "running").stdout
        assert a.id in running and b.id not in running
    finally:
        a.remove()
        b.remove()


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_ps_prints_json_and_yaml(nats: NatsServer, sync_sbx: Sandbox, fmt: str) -> None:
    """`sandpod ps -o json|yaml` prints the processes as data: a list of objects with the raw
    fields (epoch start, tags as a mapping), parsed back by the format's own parser."""
    run = uuid.uuid4().hex[:8]
    a = sync_sbx.proc.start("exit 3", proc_id=f"cli-o-{run}", tags={"run": run})
    try:
        a.wait(10)
        out = cli(nats, "ps", "shared", "-t", f"run={run}", "-o", fmt)
        assert out.returncode == 0, out.stderr
        listed = json.loads(out.stdout) if fmt == "json" else yaml.safe_load(out.stdout)
        assert [p["proc_id"] for p in listed] == [a.id]
        (info,) = listed
        assert (info["state"], info["exit_code"], info["tags"]) == ("exited", 3, {"run": run})
        assert isinstance(info["started_at"], float)
    finally:
        a.remove()


def test_logs_prints_and_follows_until_exit(nats: NatsServer, sync_sbx: Sandbox) -> None:
    """`logs` prints kept output to the right streams; `logs -f` follows until the exit."""
    p = sync_sbx.proc.start(
        "echo one; echo two >&2; sleep 0.3; echo three", proc_id=f"cli-{uuid.uuid4().hex[:8]}"
    )
    try:
        followed = cli(nats, "logs", "-f", "shared", p.id)
        assert (followed.stdout, followed.stderr, followed.returncode) == (
            "one\nthree\n",
            "two\n",
            0,
        )
        again = cli(nats, "logs", "shared", p.id, "--stream", "stdout", "--tail", "6")
        assert again.stdout == "three\n"
        missing = cli(nats, "logs", "shared", "no-such-proc")
        assert missing.returncode == 125 and "proc.not_found" in missing.stderr
    finally:
        p.remove()


@contextlib.contextmanager
def _sigint_as_in_a_terminal() -> Iterator[None]:
    """Children started inside get SIGINT at its default, as from a shell in a terminal: a suite
    run as a background job (`.ci/run &`) has SIGINT ignored, which children would inherit (and
    Python keeps an inherited SIG_IGN), while a handler is reset to the default at exec."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def test_ctrl_c_stops_following_not_the_process(nats: NatsServer, sync_sbx: Sandbox) -> None:
    """Ctrl-C on `logs -f` ends the CLI (130); the process keeps running."""
    p = sync_sbx.proc.start("echo up; sleep 300", proc_id=f"cli-{uuid.uuid4().hex[:8]}")
    env = {**os.environ, "SANDPOD_NATS_URL": nats.url}
    with _sigint_as_in_a_terminal():
        follower = subprocess.Popen(
            [SANDPOD, "logs", "-f", "shared", p.id], env=env, stdout=subprocess.PIPE, text=True
        )
    try:
        # "up" printed: the CLI follows (its SIGINT handling is in place before it reads)
        assert follower.stdout is not None and follower.stdout.readline() == "up\n"
        follower.send_signal(signal.SIGINT)
        # The exit is the condition waited on; the bound is only there to fail, not to race:
        # a loaded machine took over 15 s for the CLI's shutdown (cancel, drain, exit).
        assert follower.wait(EXIT_DEADLINE) == 130
        assert sync_sbx.proc.status(p.id).running
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
        sync_sbx.proc.remove(p.id)
