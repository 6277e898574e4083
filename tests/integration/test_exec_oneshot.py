"""One-shot exec through the async SDK against a real execd and nats-server."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from conftest import Execd, NatsServer, marker, pids_with
from sandpod import AsyncSandbox
from sandpod.errors import ArgvExpected, CommandFailed, CommandNotFound, InvalidCwd

PY = "python3"


async def test_shell_command_returns_stdout_stderr_and_exit_code(sbx: AsyncSandbox) -> None:
    """A shell string runs in the sandbox shell; stdout, stderr and the exit code come back."""
    r = await sbx.exec("/workspace", "echo out; echo err >&2; exit 7")
    assert (r.stdout, r.stderr, r.exit_code, r.signal) == ("out\n", "err\n", 7, None)
    assert not r.timed_out and r.duration > 0


async def test_argv_is_passed_without_a_shell(sbx: AsyncSandbox) -> None:
    """An argv list reaches the program verbatim: no globbing, no word splitting."""
    r = await sbx.exec(["printf", "%s|", "a b", "*", "$HOME"])
    assert r.stdout == "a b|*|$HOME|"


async def test_binary_output_is_byte_exact(sbx: AsyncSandbox) -> None:
    """Every byte value, invalid UTF-8 included, comes back unchanged."""
    payload = bytes(range(256)) * 64 + b"\xff\xfe\x00\x80"
    code = "import sys; sys.stdout.buffer.write(sys.stdin.buffer.read())"
    r = await sbx.exec([PY, "-c", code], stdin=payload)
    assert r.stdout_bytes == payload
    assert "\ufffd" in r.stdout  # the text view replaces what is not UTF-8


async def test_multi_megabyte_output_is_complete_and_exact(sbx: AsyncSandbox) -> None:
    """Output far beyond one NATS message arrives whole (fetched in parts), on both streams."""
    code = (
        "import sys, hashlib\n"
        "out = bytes((i * 7) % 251 for i in range(6_000_000))\n"
        "err = bytes((i * 13) % 241 for i in range(3_000_000))\n"
        "sys.stdout.buffer.write(out); sys.stderr.buffer.write(err)\n"
    )
    r = await sbx.exec([PY, "-c", code], timeout=60)
    assert r.exit_code == 0
    assert r.stdout_bytes == bytes((i * 7) % 251 for i in range(6_000_000))
    assert r.stderr_bytes == bytes((i * 13) % 241 for i in range(3_000_000))
    assert not r.stdout_truncated and not r.stderr_truncated


async def test_output_over_the_cap_is_truncated_and_flagged(sbx: AsyncSandbox) -> None:
    """max_output caps what is kept per stream and says so; the command still runs to the end."""
    r = await sbx.exec("head -c 100000 /dev/zero; echo done >&2", max_output=1000)
    assert len(r.stdout_bytes) == 1000 and r.stdout_truncated
    assert r.stderr == "done\n" and not r.stderr_truncated
    assert r.exit_code == 0


async def test_exit_by_signal_is_reported_as_signal(sbx: AsyncSandbox) -> None:
    """A command killed by a signal has no exit code, and the signal number is reported."""
    r = await sbx.exec("kill -TERM $$")
    assert r.exit_code is None and r.signal == signal.SIGTERM
    assert r.signal_name == "SIGTERM"


async def test_timeout_kills_the_whole_tree_including_grandchildren(
    sbx: AsyncSandbox, tmp_path: Path
) -> None:
    """On timeout the process group and escaped (setsid) grandchildren are all killed."""
    tag = marker()
    pids = tmp_path / "pids"
    pids.mkdir()
    # Each sleeper records its pid before sleeping, so the test knows they really started.
    (tmp_path / "sleeper.py").write_text(
        f"import os, time\nopen('{pids}/' + str(os.getpid()), 'w').close()\ntime.sleep(300)\n"
    )
    sleeper = f"{PY} {tmp_path}/sleeper.py {tag}"
    # one grandchild in the group, one that left it with setsid, one under a nested shell
    script = f"{sleeper} & setsid {sleeper} & sh -c '{sleeper}' & wait"
    r = await sbx.exec(script, timeout=2.0)
    assert r.timed_out
    assert r.signal == signal.SIGKILL
    started = [int(p.name) for p in pids.iterdir()]
    assert len(started) == 3, "all three grandchildren must have started before the timeout"
    procs = [psutil.Process(p) for p in started if psutil.pid_exists(p)]
    _, alive = psutil.wait_procs(procs, timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert not [p for p in pids_with(tag) if psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


async def test_stdin_bytes_reach_the_command(sbx: AsyncSandbox) -> None:
    """stdin is written to the command and closed, so readers see EOF."""
    r = await sbx.exec("wc -c; cat", stdin=b"")
    assert r.stdout.strip() == "0"
    r = await sbx.exec("tr a-z A-Z", stdin="hello\n")
    assert r.stdout == "HELLO\n"


async def test_large_stdin_is_streamed_transparently(sbx: AsyncSandbox) -> None:
    """stdin larger than one NATS message still arrives byte-exact (sent as a stream)."""
    data = os.urandom(3 * 1024 * 1024)
    r = await sbx.exec("sha256sum | cut -d' ' -f1", stdin=data, timeout=60)
    assert r.stdout.strip() == hashlib.sha256(data).hexdigest()
    assert r.exit_code == 0


async def test_env_is_added_and_daemon_env_does_not_leak(sbx: AsyncSandbox) -> None:
    """Request env is visible; execd's own environment (e.g. its NATS URL) is not."""
    r = await sbx.exec(
        'echo "$GREETING|$SANDPOD_NATS_URL|$SANDPOD_SANDBOX_ID"', env={"GREETING": "hi there"}
    )
    assert r.stdout == "hi there||shared\n"


async def test_cwd_workspace_alias_relative_and_absolute(sbx: AsyncSandbox, tmp_path: Path) -> None:
    """/workspace maps to the sandbox workspace; relative paths are under it; absolute stay.
    sys.info says /workspace (no reply shows the host path); a process runtime's command sees
    where its cwd really is (pwd -P), which is how this test learns the host directory."""
    assert (await sbx.runtime_info()).workspace == "/workspace"
    host = os.path.realpath((await sbx.exec("pwd -P")).stdout.strip())
    r = await sbx.exec("/workspace", "pwd")
    assert os.path.realpath(r.stdout.strip()) == host
    await sbx.exec("mkdir -p sub/dir")
    r = await sbx.exec("sub/dir", "pwd")
    assert os.path.realpath(r.stdout.strip()) == os.path.join(host, "sub/dir")
    r = await sbx.exec(str(tmp_path), "pwd")
    assert r.stdout.strip() == str(tmp_path)


async def test_missing_cwd_and_program_are_typed_errors(sbx: AsyncSandbox) -> None:
    """A missing directory or program is a typed error, not a generic failure."""
    with pytest.raises(InvalidCwd):
        await sbx.exec("/no/such/dir", "true")
    with pytest.raises(CommandNotFound):
        await sbx.exec(["no-such-program-sandpod"])


async def test_the_write_ups_cwd_and_command_form_runs_in_that_directory(
    sbx: AsyncSandbox,
) -> None:
    """``exec("/workspace", "date")`` runs the shell command ``date`` in the workspace."""
    workspace = (await sbx.exec("pwd")).stdout  # the default cwd (a host path without the jail)
    r = await sbx.exec("/workspace", "date && pwd")
    assert r.exit_code == 0 and len(r.stdout.splitlines()) == 2
    assert r.stdout.endswith(workspace)


async def test_a_program_and_its_option_as_two_positionals_says_to_pass_an_argv_list(
    sbx: AsyncSandbox,
) -> None:
    """``exec("ls", "-l")`` fails with the argv hint, not a bare invalid cwd; so does
    ``exec("python3", "x.py")`` once execd finds no directory ``python3``; a missing path stays
    InvalidCwd, and the argv list itself runs."""
    with pytest.raises(ArgvExpected, match=r"argv list: exec\(\['ls', '-l'\]\)"):
        await sbx.exec("ls", "-l")
    with pytest.raises(ArgvExpected, match="no directory 'python3' in the sandbox"):
        await sbx.exec("python3", "x.py")
    with pytest.raises(InvalidCwd) as info:
        await sbx.exec("/no/such/dir", "true")
    assert type(info.value) is InvalidCwd
    await sbx.fs.write("argv-hint.txt", "x")
    r = await sbx.exec(["ls", "-l"])
    assert r.exit_code == 0 and "argv-hint.txt" in r.stdout


async def test_check_raises_command_failed(sbx: AsyncSandbox) -> None:
    """check=True turns a non-zero exit into CommandFailed carrying the exit code."""
    with pytest.raises(CommandFailed) as info:
        await sbx.exec("exit 3", check=True)
    assert info.value.details["exit_code"] == 3


async def test_check_details_are_the_same_when_stdin_is_streamed(sbx: AsyncSandbox) -> None:
    """A large stdin (streamed in, not one request) gives CommandFailed the same details."""
    stdin = b"x" * sbx.bus.max_payload
    with pytest.raises(CommandFailed) as info:
        await sbx.exec("cat >/dev/null; exit 3", stdin=stdin, check=True)
    details = info.value.details
    assert (details["exit_code"], details.get("signal"), details["timed_out"]) == (3, None, False)
    with pytest.raises(CommandFailed) as info:
        await sbx.exec("cat >/dev/null; kill -TERM $$", stdin=stdin, check=True)
    assert info.value.details["signal"] == signal.SIGTERM
    assert "SIGTERM" in info.value.message


async def test_concurrent_execs_each_get_their_own_output(sbx: AsyncSandbox) -> None:
    """64 concurrent calls on one connection never mix results."""
    results = await asyncio.gather(*(sbx.exec(["echo", str(i)]) for i in range(64)))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(64)]


async def test_info_names_the_runtime_honestly(sbx: AsyncSandbox) -> None:
    """The process runtime says it has no isolation, so nobody mistakes it for a jail."""
    info = await sbx.runtime_info()
    assert (info.runtime, info.isolation) == ("process", "none")
    assert info.sandbox_id == "shared"
    assert await sbx.ping() > 0


async def test_cancelling_the_caller_cancels_the_remote_command(
    sbx: AsyncSandbox, tmp_path: Path
) -> None:
    """A caller that gives up (task cancelled, Ctrl-C) does not leave its command running."""
    pid_file = tmp_path / "pid"
    call = asyncio.create_task(
        sbx.exec(
            f"echo $$ > {pid_file}.tmp; mv {pid_file}.tmp {pid_file}; exec sleep 300", timeout=None
        )
    )
    while not pid_file.exists():
        await asyncio.sleep(0.02)
    pid = int(pid_file.read_text())
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    with contextlib.suppress(psutil.NoSuchProcess):  # gone already: what is wanted
        psutil.Process(pid).wait(10)  # raises TimeoutExpired if the command survived


async def test_oversized_output_is_released_once_fetched(
    sbx: AsyncSandbox,
    shared_execd: Execd,
) -> None:
    """Output kept for exec.fetch is dropped as soon as the client read it all."""
    from sandpod.errors import ExecNotFound
    from sandpod_contract.messages.exec import ExecFetch, OutputPart

    r = await sbx.exec("head -c 3000000 /dev/zero")
    assert len(r.stdout_bytes) == 3_000_000
    with pytest.raises(ExecNotFound):
        await sbx.channel.call(
            "exec", "fetch", ExecFetch(exec_id=r.exec_id, stream="stdout", offset=0), OutputPart, 5
        )


async def test_status_of_a_finished_one_shot_reports_how_it_exited(sbx: AsyncSandbox) -> None:
    """exec.status of a one-shot that finished says exited with its exit code or signal, as
    a streaming exec's does (what execd remembers of recent execs)."""
    from sandpod_contract.messages.exec import ExecRef, ExecStatus

    async def status(exec_id: str) -> ExecStatus:
        return await sbx.channel.call("exec", "status", ExecRef(exec_id=exec_id), ExecStatus, 5)

    coded = await sbx.exec("exit 7")
    killed = await sbx.exec("kill -TERM $$")
    assert (coded.exit_code, killed.signal) == (7, signal.SIGTERM)
    s = await status(coded.exec_id)
    assert (s.state, s.exit_code, s.signal) == ("exited", 7, None)
    s = await status(killed.exec_id)
    assert (s.state, s.exit_code, s.signal) == ("exited", None, signal.SIGTERM)


async def test_timeout_kills_orphans_that_left_the_tree(sbx: AsyncSandbox, tmp_path: Path) -> None:
    """A grandchild that called setsid and whose parent exited (re-parented to init: no longer
    a descendant, nor in the group) still dies on timeout: the tree's token finds it."""
    pid_file = tmp_path / "orphan"
    script = (
        f"(setsid sh -c 'echo $$ > {pid_file}.tmp; mv {pid_file}.tmp {pid_file}; exec sleep 300' &)"
        f"; while [ ! -e {pid_file} ]; do sleep 0.01; done; sleep 300"
    )
    r = await sbx.exec(script, timeout=1.0)
    assert r.timed_out
    pid = int(pid_file.read_text())
    if psutil.pid_exists(pid):
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).wait(10)  # raises TimeoutExpired if the orphan survived


def _live(token: str) -> list[int]:
    """Processes whose command line holds ``token``, zombies excluded."""
    found = []
    for pid in pids_with(token):
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                found.append(pid)
    return found


async def test_timeout_kills_children_forked_while_the_tree_is_being_killed(
    sbx: AsyncSandbox,
) -> None:
    """A command that keeps starting setsid'd children, each of which at once starts its own,
    leaves none behind on timeout: the kill scans again until a scan finds nobody new."""
    tag = marker()
    child = f'sh -c "sleep 300; :" {tag} & sleep 300'
    script = f"while :; do setsid sh -c '{child}' >/dev/null 2>&1 </dev/null & done"
    try:
        r = await sbx.exec(script, timeout=0.3)
        assert r.timed_out
        deadline = asyncio.get_running_loop().time() + 10
        while survivors := _live(tag):  # SIGKILLed ones are gone within moments
            assert asyncio.get_running_loop().time() < deadline, f"survivors: {survivors}"
            await asyncio.sleep(0.05)
    finally:
        for pid in pids_with(tag):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def test_max_output_is_clamped_to_execd_limit(
    nats: NatsServer,
    start_execd: Callable[..., Execd],
) -> None:
    """A client's huge max_output is clamped to SANDPOD_EXECD_MAX_OUTPUT_LIMIT (flagged
    truncated), sys.info reports the limit, and execd keeps answering."""
    limit = 256 * 1024
    execd = start_execd(SANDPOD_EXECD_MAX_OUTPUT_LIMIT=str(limit))
    async with await AsyncSandbox.connect(execd.ids[0], nats_url=nats.url) as sbx:
        assert (await sbx.runtime_info()).max_output_limit == limit
        r = await sbx.exec("head -c 3000000 /dev/zero; echo done >&2", max_output=2**40)
        assert r.exit_code == 0
        assert len(r.stdout_bytes) == limit and r.stdout_truncated
        assert r.stderr == "done\n" and not r.stderr_truncated
        assert await sbx.ping() > 0
