"""`sandpod up` then `sandpod exec`, end to end through the real CLI processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from conftest import free_port

SANDPOD = str(Path(sysconfig.get_path("scripts")) / "sandpod")


def _read_until(proc: subprocess.Popen[str], needle: str, limit: int = 200) -> list[str]:
    lines: list[str] = []
    assert proc.stdout is not None
    for _ in range(limit):
        line = proc.stdout.readline()
        if not line:
            pytest.fail(f"`sandpod up` exited early:\n{''.join(lines)}")
        lines.append(line)
        if needle in line:
            return lines
    pytest.fail(f"{needle!r} never printed:\n{''.join(lines)}")


@pytest.mark.parametrize("stop", ["sigterm", "ctrl-c"])
def test_up_exec_and_clean_shutdown(tmp_path: Path, stop: str) -> None:
    """`sandpod up` serves 'default'; `sandpod exec` runs a command and exits with its code; the
    gateway it starts answers HTTP with the API key it printed; SIGTERM, or Ctrl-C (SIGINT to
    the whole foreground process group, children included), stops everything with exit 0 and
    leaves no process behind."""
    port, http_port = free_port(), free_port()
    up = subprocess.Popen(
        [
            SANDPOD,
            "up",
            "--state-dir",
            str(tmp_path),
            "--port",
            str(port),
            "--gateway-port",
            str(http_port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a shell gives a foreground job
    )
    try:
        banner = "".join(_read_until(up, "Ctrl-C stops everything"))
        url = f"nats://127.0.0.1:{port}"
        assert url in banner
        # Root with util-linux (as CI runs): the default sandbox is a namespace jail.
        expected = "namespace jail" if os.geteuid() == 0 else "NO ISOLATION"
        assert expected in banner, banner
        gateway = f"http://127.0.0.1:{http_port}"
        assert gateway in banner
        key = banner.split("API key")[1].split()[0]
        r = httpx.post(
            f"{gateway}/v1/sandboxes/default/exec",
            json={"argv": ["echo", "http"]},
            headers={"authorization": f"Bearer {key}"},
            timeout=30,
        )
        assert r.status_code == 200 and r.json()["stdout"] == "http\n", r.text
        children = psutil.Process(up.pid).children(recursive=True)
        assert len(children) >= 3  # nats-server, lifecycle, the sandbox's execd (and its jail)
        assert {"nats-server", "python"} & {c.name().split(".")[0] for c in children}
        # Its NATS refuses anonymous clients: the CLI finds the client credential in the state
        # dir (named by SANDPOD_STATE_DIR here, as it is not the default one).
        env = {**os.environ, "SANDPOD_NATS_URL": url, "SANDPOD_STATE_DIR": str(tmp_path)}
        env.pop("SANDPOD_NATS_CREDS", None)
        run = subprocess.run(
            [SANDPOD, "exec", "default", "--", "sh", "-c", "echo hi; echo oops >&2; exit 3"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert (run.stdout, run.stderr, run.returncode) == ("hi\n", "oops\n", 3)
        run = subprocess.run(
            [SANDPOD, "exec", "-i", "default", "-c", "tr a-z A-Z"],
            env=env,
            input="piped\n",
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert (run.stdout, run.returncode) == ("PIPED\n", 0)
        # The default sandbox is permanent: no lifetime and no idle timeout (the template's 15
        # minutes used to apply, so a platform left alone lost its default sandbox).
        got = subprocess.run(
            [SANDPOD, "get", "default", "-o", "json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        spec = json.loads(got.stdout)["spec"]
        assert spec["permanent"] is True and spec["idleTimeoutSeconds"] == 0, spec
        assert "shutdownTime" not in spec, spec
        run = subprocess.run(
            [SANDPOD, "exec", "nope", "--", "true"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert run.returncode == 125 and "sandbox.not_found" in run.stderr
        if stop == "sigterm":
            up.send_signal(signal.SIGTERM)
        else:
            os.killpg(up.pid, signal.SIGINT)
        assert up.wait(30) == 0
        assert up.stdout is not None
        rest = up.stdout.read()
        assert "Traceback" not in rest and "KeyboardInterrupt" not in rest, rest
        _, alive = psutil.wait_procs(children, timeout=15)
        assert not alive, f"left behind: {alive}"
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


def test_up_reports_a_busy_port_with_what_to_do(tmp_path: Path) -> None:
    """A port already in use is reported with the fix, not a stack trace."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        run = subprocess.run(
            [SANDPOD, "up", "--state-dir", str(tmp_path), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert run.returncode == 1
    assert "in use" in run.stderr and "--nats-url" in run.stderr


def test_up_without_jetstream_room_for_the_event_stream_says_what_to_do(tmp_path: Path) -> None:
    """An event stream larger than the JetStream storage its nats-server would get (here a
    1 PiB SANDPOD_EVENTS_MAX_BYTES) is refused before anything starts, with the sizes and the
    fixes, not a lifecycle's traceback; a size that is no size is refused too."""
    port = free_port()
    argv = [SANDPOD, "up", "--state-dir", str(tmp_path), "--port", str(port), "--no-gateway"]
    env = {**os.environ, "SANDPOD_EVENTS_MAX_BYTES": str(1 << 50)}
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Traceback" not in run.stderr and "starting nats-server" not in run.stdout
    said = run.stderr
    assert "error: JetStream would not have room for Sandpod's event stream" in said
    assert "reserves 1024 TiB" in said and "free disk space there" in said
    assert "SANDPOD_EVENTS_MAX_BYTES=" in said and "--nats-url" in said
    env["SANDPOD_EVENTS_MAX_BYTES"] = "lots"
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "SANDPOD_EVENTS_MAX_BYTES must be" in run.stderr, run.stderr


def test_exec_without_nats_tells_how_to_start_it() -> None:
    """`sandpod exec` with no NATS running says to run `sandpod up`."""
    env = {**os.environ, "SANDPOD_NATS_URL": "nats://127.0.0.1:1"}
    run = subprocess.run(
        [sys.executable, "-m", "sandpod.cli", "exec", "default", "--", "true"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 125 and "sandpod up" in run.stderr


def test_up_with_an_existing_nats(tmp_path: Path, nats) -> None:  # type: ignore[no-untyped-def]
    """`sandpod up --nats-url` starts no NATS of its own, serves the sandbox on the given one,
    and leaves that NATS running when it stops."""
    up = subprocess.Popen(
        [
            SANDPOD,
            "up",
            "--state-dir",
            str(tmp_path),
            "--nats-url",
            nats.url,
            "--sandbox",
            "ext-nats",
            "--no-gateway",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        banner = "".join(_read_until(up, "Ctrl-C stops everything"))
        assert "using existing NATS" in banner
        names = [c.name() for c in psutil.Process(up.pid).children(recursive=True)]
        assert not [n for n in names if n.startswith("nats-server")]
        run = subprocess.run(
            [SANDPOD, "exec", "--nats-url", nats.url, "ext-nats", "--", "echo", "shared-nats"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert (run.stdout, run.returncode) == ("shared-nats\n", 0)
        up.send_signal(signal.SIGTERM)
        assert up.wait(30) == 0
        assert nats.proc.poll() is None, "the external NATS must keep running"
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


def check_machine_formats(cli: Callable[..., str], sandbox: str, claim: str) -> None:
    """The read commands' `-o json` and `-o yaml` parse back to the same objects."""
    for fmt, load in (("json", json.loads), ("yaml", yaml.safe_load)):
        pools = load(cli("pool", "ls", "-o", fmt))
        assert [p["metadata"]["name"] for p in pools] == ["py"]
        assert load(cli("pool", "get", "py", "-o", fmt))["spec"]["replicas"] == 2
        claims = load(cli("claims", "-o", fmt))
        assert claim in [c["metadata"]["name"] for c in claims]
        names = [s["metadata"]["name"] for s in load(cli("ls", "-o", fmt))]
        assert {"default", sandbox} <= set(names)
        got = load(cli("get", sandbox, "-o", fmt))
        assert (got["kind"], got["metadata"]["name"]) == ("Sandbox", sandbox)


def test_pools_and_claims_from_the_cli(tmp_path: Path) -> None:
    """`sandpod up` runs the pool service: `pool create`, `claim` (a usable sandbox id),
    `claims`, `pool ls/get/scale`, `ls`, `get` (tables, json and yaml), `release` and `pool rm`
    work end to end."""
    port = free_port()
    up = subprocess.Popen(
        [SANDPOD, "up", "--state-dir", str(tmp_path), "--port", str(port), "--no-gateway"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    env = {
        **os.environ,
        "SANDPOD_NATS_URL": f"nats://127.0.0.1:{port}",
        "SANDPOD_STATE_DIR": str(tmp_path),
    }

    def cli(*args: str) -> str:
        run = subprocess.run([SANDPOD, *args], env=env, capture_output=True, text=True, timeout=90)
        assert run.returncode == 0, (args, run.stdout, run.stderr)
        return run.stdout

    try:
        banner = "".join(_read_until(up, "Ctrl-C stops everything"))
        assert "pool ready" in banner, banner
        assert "py" in cli("pool", "create", "py", "--replicas", "2")
        sandbox = cli("claim", "py", "-e", "WHO=cli", "--timeout", "600", "-o", "id").strip()
        assert cli("exec", sandbox, "-c", "echo $WHO") == "cli\n"
        claims = cli("claims")
        assert sandbox in claims and "claim-" in claims
        claim = next(line.split()[0] for line in claims.splitlines() if sandbox in line)
        listed = cli("pool", "ls")
        assert listed.splitlines()[0].split()[:3] == ["NAME", "TEMPLATE", "DESIRED"]
        assert "py" in listed
        check_machine_formats(cli, sandbox, claim)
        assert " 0 " in cli("pool", "scale", "py", "0") + " "
        assert f"released {claim}" in cli("release", claim)
        assert "deleted pool py" in cli("pool", "rm", "py")
        run = subprocess.run(
            [SANDPOD, "claim", "nope"], env=env, capture_output=True, text=True, timeout=30
        )
        assert run.returncode == 125 and "claim.pool_not_found" in run.stderr
        up.send_signal(signal.SIGTERM)
        assert up.wait(60) == 0
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="disk quotas need root (loop devices)")
def test_up_gives_the_default_sandbox_a_disk_quota(tmp_path: Path) -> None:
    """`sandpod up` with SANDPOD_DISK_DEFAULT=64Mi: code in the default sandbox that writes
    100 MiB into /workspace gets ENOSPC, `df` shows the 64Mi disk, and the state dir (NATS's
    JetStream data, logs) still takes writes."""
    port = free_port()
    up = subprocess.Popen(
        [
            SANDPOD,
            "up",
            "--state-dir",
            str(tmp_path),
            "--port",
            str(port),
            "--gateway-port",
            str(free_port()),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "SANDPOD_DISK_DEFAULT": "64Mi"},
    )
    try:
        _read_until(up, "Ctrl-C stops everything")
        # The CLI finds this up's credential in its state dir (not another up's on this host).
        env = {
            **os.environ,
            "SANDPOD_NATS_URL": f"nats://127.0.0.1:{port}",
            "SANDPOD_STATE_DIR": str(tmp_path),
        }
        fill = "dd if=/dev/zero of=/workspace/hog bs=1M count=100 2>&1 | grep -c 'No space'"
        script = f"df -B1 --output=size /workspace | tail -1; {fill}"
        run = subprocess.run(
            [SANDPOD, "exec", "default", "--", "sh", "-c", script],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        size, enospc = run.stdout.split()
        assert 56 << 20 <= int(size) <= 64 << 20 and enospc == "1", run
        probe = tmp_path / "probe"
        probe.write_bytes(b"x" * (8 << 20))  # the host's side of the state dir is not full
        assert probe.stat().st_size == 8 << 20
        run = subprocess.run(
            [SANDPOD, "exec", "default", "--", "echo", "alive"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert run.stdout == "alive\n", run  # the platform (NATS, lifecycle, execd) still works
        up.send_signal(signal.SIGTERM)
        assert up.wait(30) == 0
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="snapshots need the local runtime as root")
def test_snapshots_and_forks_under_up(tmp_path: Path) -> None:
    """Under `sandpod up` (its NATS users and their least-privilege grants): the default
    sandbox is snapshotted, forked and the snapshot listed and removed from the CLI; the
    layers live in the installation's own object store."""
    port = free_port()
    up = subprocess.Popen(
        [SANDPOD, "up", "--state-dir", str(tmp_path), "--port", str(port), "--no-gateway"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    env = {
        **os.environ,
        "SANDPOD_NATS_URL": f"nats://127.0.0.1:{port}",
        "SANDPOD_STATE_DIR": str(tmp_path),
    }

    def cli(*args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
        run = subprocess.run([SANDPOD, *args], env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == code, (args, run.stdout, run.stderr)
        return run

    try:
        _read_until(up, "Ctrl-C stops everything")
        cli("exec", "default", "-c", "echo under-up > /workspace/u")
        made = cli("snapshot", "create", "default", "--name", "u1").stdout
        assert "Ready" in made, made
        fork = cli("fork", "default", "--snapshot", "u1").stdout.split()[0]
        assert cli("exec", fork, "-c", "cat /workspace/u").stdout == "under-up\n"
        assert "snapshot.in_use" in cli("snapshot", "rm", "u1", code=125).stderr
        cli("rm", fork)
        assert "deleted u1" in cli("snapshot", "rm", "u1").stdout
        up.send_signal(signal.SIGTERM)
        assert up.wait(60) == 0
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


def test_up_makes_a_default_sandbox_lost_with_the_host_anew(tmp_path: Path) -> None:
    """`sandpod up` killed outright (a reboot, an OOM kill), and its default sandbox's jail with
    it: the next `sandpod up` finds that Sandbox Failed (InstanceLost), says so, and creates it
    anew instead of waiting a minute for it to answer and giving up."""
    port, http_port = free_port(), free_port()
    argv = [SANDPOD, "up", "--state-dir", str(tmp_path), "--port", str(port)]
    argv += ["--gateway-port", str(http_port)]

    def up() -> subprocess.Popen[str]:
        return subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    first = up()
    second: subprocess.Popen[str] | None = None
    try:
        _read_until(first, "Ctrl-C stops everything")
        jail = json.loads((tmp_path / "jails" / "default" / "jail.json").read_text())
        holder = psutil.Process(jail["holder_pid"])
        # no clean stop (nothing destroys the jail), and the jail and every process of this
        # installation go too, as a reboot takes them
        everything = [*psutil.Process(first.pid).children(recursive=True), holder]
        everything += holder.children(recursive=True)
        for victim in everything:
            with contextlib.suppress(psutil.NoSuchProcess):
                victim.kill()
        first.kill()
        first.wait()
        psutil.wait_procs(everything, timeout=15)
        second = up()
        banner = "".join(_read_until(second, "Ctrl-C stops everything"))
        assert "sandbox default had failed (InstanceLost" in banner, banner
        env = {**os.environ, "SANDPOD_NATS_URL": f"nats://127.0.0.1:{port}"}
        env["SANDPOD_STATE_DIR"] = str(tmp_path)
        env.pop("SANDPOD_NATS_CREDS", None)
        run = subprocess.run(
            [SANDPOD, "exec", "default", "--", "echo", "back"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert (run.stdout, run.returncode) == ("back\n", 0), run.stderr
        second.send_signal(signal.SIGTERM)
        assert second.wait(30) == 0
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
