"""`sandpod exec|ping|info` through the real CLI process: exit codes, output, a terminal stdin."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

from conftest import Execd, NatsServer

SANDPOD = str(Path(sysconfig.get_path("scripts")) / "sandpod")


def cli(nats: NatsServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SANDPOD_NATS_URL": nats.url}
    return subprocess.run([SANDPOD, *args], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_command_killed_by_a_signal_exits_128_plus_n(
    nats: NatsServer, shared_execd: Execd, sig: signal.Signals
) -> None:
    """As in a shell: signal N killed the command, so `sandpod exec` exits 128+N."""
    run = cli(nats, "exec", "shared", "--", "sh", "-c", f"echo before; kill -{int(sig)} $$")
    assert (run.stdout, run.returncode) == ("before\n", 128 + sig), run.stderr


def test_a_timed_out_command_exits_124_and_says_so(nats: NatsServer, shared_execd: Execd) -> None:
    """`-t` kills the command when it runs too long: exit 124 (like timeout(1)) and a message."""
    run = cli(nats, "exec", "-t", "0.5", "shared", "--", "sleep", "30")
    assert run.returncode == 124
    assert "timed out after 0.5s" in run.stderr


def test_ping_prints_the_round_trip(nats: NatsServer, shared_execd: Execd) -> None:
    """`sandpod ping` names the sandbox and the round-trip time; an unknown one exits 125."""
    run = cli(nats, "ping", "shared")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("shared: execd answered in ") and run.stdout.endswith(" ms\n")
    run = cli(nats, "ping", "nobody-serves-this")
    assert run.returncode == 125 and "sandbox.not_found" in run.stderr


def test_info_prints_the_runtime_and_its_limits(nats: NatsServer, shared_execd: Execd) -> None:
    """`sandpod info` prints one `key value` line per sys.info field and warns of no isolation."""
    run = cli(nats, "info", "shared")
    assert run.returncode == 0, run.stderr
    fields = dict(line.split(None, 1) for line in run.stdout.splitlines() if line and " " in line)
    assert fields["sandbox_id"] == "shared"
    assert (fields["runtime"], fields["isolation"]) == ("process", "none")
    assert "NO ISOLATION" in run.stdout


def test_info_prints_human_units(nats: NatsServer, shared_execd: Execd) -> None:
    """`sandpod info` shows sizes in KiB/MiB, the start as a local date with its age and the
    families as a comma list: no epoch floats, no byte counts, no Python tuples."""
    run = cli(nats, "info", "shared")
    assert run.returncode == 0, run.stderr
    fields = dict(line.split(None, 1) for line in run.stdout.splitlines() if line and " " in line)
    assert fields["max_output_limit"] == "64 MiB"
    assert fields["max_payload"].endswith(("KiB", "MiB"))
    date, clock, *_ = fields["started_at"].split()
    assert len(date) == 10 and date[4] == "-" and clock.count(":") == 2
    assert fields["started_at"].endswith(" ago)")
    assert "(" not in fields["families"] and "exec, " in fields["families"]
    assert "TYPE" not in fields, "a ClassVar of the message is not a field"


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_info_and_ping_print_json_and_yaml(nats: NatsServer, shared_execd: Execd, fmt: str) -> None:
    """`-o json|yaml` prints sys.info's raw values (bytes, epoch seconds, a list) and ping's
    round trip as data, parsed back by the format's own parser."""
    load = json.loads if fmt == "json" else yaml.safe_load
    run = cli(nats, "info", "shared", "-o", fmt)
    assert run.returncode == 0, run.stderr
    info = load(run.stdout)
    assert (info["sandbox_id"], info["isolation"]) == ("shared", "none")
    assert info["max_output_limit"] == 64 * 1024 * 1024
    assert isinstance(info["started_at"], float) and "exec" in info["families"]
    run = cli(nats, "ping", "shared", "-o", fmt)
    assert run.returncode == 0, run.stderr
    pong = load(run.stdout)
    assert pong["sandbox"] == "shared" and 0 < pong["rtt_seconds"] < 60


def test_the_exec_path_never_imports_aiohttp(nats: NatsServer, shared_execd: Execd) -> None:
    """`sandpod exec` runs a command without importing aiohttp (nats-py's WebSocket transport)
    or the SDK families it does not use."""
    probe = (
        "import sys\n"
        "from sandpod.cli import main\n"
        "code = main(['exec', 'shared', '--', 'true'])\n"
        "print(code, sorted(m for m in ('aiohttp', 'sandpod.fs', 'sandpod.pty', 'yaml')"
        " if m in sys.modules))\n"
    )
    env = {**os.environ, "SANDPOD_NATS_URL": nats.url}
    run = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[-2] == "0 []"


def test_interactive_exec_from_a_terminal_exits_when_the_command_does(
    nats: NatsServer, shared_execd: Execd
) -> None:
    """`sandpod exec -i` with a terminal as stdin returns as soon as the command exits, without
    waiting for an EOF the user never types (no stdin read left blocking)."""
    leader, follower = pty.openpty()
    env = {**os.environ, "SANDPOD_NATS_URL": nats.url}
    proc = subprocess.Popen(
        [SANDPOD, "exec", "-i", "shared", "--", "head", "-c", "3"],
        stdin=follower,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    os.close(follower)
    try:
        os.write(leader, b"abc\n")  # a line: the terminal hands it over without an EOF
        out, err = proc.communicate(timeout=30)
        assert (out, proc.returncode) == (b"abc", 0), err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        os.close(leader)


def test_interactive_exec_reads_a_file_or_dev_null(
    nats: NatsServer, shared_execd: Execd, tmp_path: Path
) -> None:
    """Stdin that cannot be polled (a regular file, /dev/null) is read to its end as well."""
    data = tmp_path / "in.txt"
    data.write_bytes(b"line\n" * 50_000)
    env = {**os.environ, "SANDPOD_NATS_URL": nats.url}
    for source, expected in ((data, b"50000\n"), (Path(os.devnull), b"0\n")):
        with source.open("rb") as stdin:
            run = subprocess.run(
                [SANDPOD, "exec", "-i", "shared", "--", "wc", "-l"],
                stdin=stdin,
                capture_output=True,
                env=env,
                timeout=60,
            )
        assert (run.stdout, run.returncode) == (expected, 0), run.stderr
