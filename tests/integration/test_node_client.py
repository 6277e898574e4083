"""The Node.js client in clients/node (written from schemas/ alone) against a real execd and NATS.

Each test runs `node clients/node/cli.mjs <url> <sandbox> <op> <json>` as a subprocess, so what is
checked is the second-language client end to end: exec, streaming with acks, fs, typed errors.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats as nats_py
import pytest
from nats.aio.msg import Msg

from conftest import Execd, NatsServer, wait_until
from sandpod_contract.codec import decode, encode
from sandpod_contract.messages.exec import (
    ExecExit,
    ExecResume,
    ExecStart,
    ExecStarted,
    ExecStatus,
    OutputChunk,
)
from sandpod_contract.subjects import DEFAULT_PREFIX, Subjects

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "node"
NODE = shutil.which("node")
RUN_TIMEOUT = 60  # seconds for one client process; generous for a 2-core machine


def _require_node() -> str:
    """Fail (never skip) with what to do when node or the client's dependencies are missing."""
    if NODE is None:
        pytest.fail("node is not on PATH: install Node.js >= 18 (the Node client needs it)")
    if not (CLIENT / "node_modules" / "nats").is_dir():
        pytest.fail("clients/node/node_modules is missing: run `make node-client` (npm ci)")
    return NODE


def node(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run a script of clients/node, returning the finished process (stdout/stderr as text)."""
    return subprocess.run(
        [_require_node(), str(CLIENT / script), *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )


def client(nats: NatsServer, op: str, args: dict[str, Any], sandbox: str = "shared") -> Any:
    """One client operation; returns its JSON output (an {"error": ...} on a typed error)."""
    proc = node("cli.mjs", nats.url, sandbox, op, json.dumps(args))
    assert proc.returncode in (0, 3), f"client crashed ({proc.returncode}): {proc.stderr}"
    out = json.loads(proc.stdout)
    assert ("error" in out) == (proc.returncode == 3), proc.stdout
    return out


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


def test_vectors_checker_passes_for_every_vector() -> None:
    """The Node codec decodes, re-encodes byte for byte, and rejects every schemas/vectors entry."""
    proc = node("check_vectors.mjs")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith(" 0 failed")
    passed = int(proc.stdout.strip().splitlines()[-1].split()[0])
    total = sum(
        len(json.loads(p.read_text())["vectors"])
        for p in (CLIENT.parents[1] / "schemas" / "vectors").glob("*.json")
    )
    assert passed == total


def test_exec_returns_exit_code_and_output(nats: NatsServer) -> None:
    """A shell command's stdout, stderr and exit code come back through the Node client."""
    r = client(nats, "exec", {"shell": "date +%Y; echo err >&2; exit 7"})
    assert (r["exit_code"], r["signal"], r["timed_out"]) == (7, None, False)
    assert unb64(r["stdout_b64"]).strip().isdigit()
    assert unb64(r["stderr_b64"]) == b"err\n"


def test_exec_stdout_and_stdin_are_binary_exact(nats: NatsServer) -> None:
    """All 256 byte values go in as stdin and come back unchanged as stdout (msgpack bin)."""
    payload = bytes(range(256)) * 16
    r = client(nats, "exec", {"argv": ["cat"], "stdin_b64": b64(payload)})
    assert (r["exit_code"], unb64(r["stdout_b64"])) == (0, payload)


def test_exec_output_larger_than_one_reply_is_fetched(nats: NatsServer) -> None:
    """Output beyond one NATS message comes back whole: the client follows up with exec.fetch."""
    count = 400_000  # `seq` prints ~2.7 MiB, more than the 1 MiB reply
    expected = "".join(f"{i}\n" for i in range(1, count + 1)).encode()
    r = client(nats, "exec", {"argv": ["seq", "1", str(count)]})
    assert (r["exit_code"], unb64(r["stdout_b64"])) == (0, expected)


def test_exec_env_and_cwd_reach_the_command(nats: NatsServer, tmp_path: Path) -> None:
    """env is added to the command's environment and cwd is its working directory."""
    args = {
        "argv": ["sh", "-c", 'printf "%s|" "$GREETING"; pwd'],
        "env": {"GREETING": "hé"},
        "cwd": str(tmp_path),
    }
    r = client(nats, "exec", args)
    assert unb64(r["stdout_b64"]).decode() == f"hé|{tmp_path}\n"


def test_exec_timeout_kills_and_reports_timed_out(nats: NatsServer) -> None:
    """A command past its timeout is killed: timed_out, signal 9, no exit code."""
    r = client(nats, "exec", {"argv": ["sleep", "30"], "timeout": 0.5})
    assert (r["timed_out"], r["signal"], r["exit_code"]) == (True, 9, None)


def test_streaming_exec_delivers_mebibytes_in_order(nats: NatsServer) -> None:
    """Several MiB stream through a small window (many acks) and hash exactly like the source."""
    count = 600_000  # `seq` prints ~4.4 MiB
    expected = "".join(f"{i}\n" for i in range(1, count + 1)).encode()
    args = {"shell": f"seq 1 {count}; echo done >&2; exit 3", "window": 256 * 1024}
    r = client(nats, "stream", args)
    assert (r["exit_code"], r["timed_out"]) == (3, False)
    assert r["stdout"] == {"bytes": len(expected), "sha256": hashlib.sha256(expected).hexdigest()}
    assert r["stdout_size"] == len(expected)
    assert r["stderr"]["sha256"] == hashlib.sha256(b"done\n").hexdigest()
    assert r["chunks"] > len(expected) // (256 * 1024)  # chunks fit the window, so acks happened


def test_fs_write_then_read_round_trips(nats: NatsServer, tmp_path: Path) -> None:
    """fs.write stores bytes atomically and fs.read returns the same bytes."""
    data = bytes(range(256)) * 40 + b"\x00end"
    path = str(tmp_path / "sub" / "blob.bin")
    entry = client(nats, "write", {"path": path, "data_b64": b64(data)})
    assert (entry["type"], entry["size"], entry["name"]) == ("file", len(data), "blob.bin")
    assert Path(path).read_bytes() == data
    assert unb64(client(nats, "read", {"path": path})["data_b64"]) == data


def test_unknown_cwd_is_a_typed_invalid_cwd_error(nats: NatsServer, tmp_path: Path) -> None:
    """A missing working directory raises exec.invalid_cwd, a subclass of exec.spawn_failed."""
    r = client(nats, "exec", {"argv": ["true"], "cwd": str(tmp_path / "missing")})
    err = r["error"]
    assert (err["code"], err["known"], err["retryable"]) == (
        "exec.invalid_cwd",
        "exec.invalid_cwd",
        False,
    )
    assert err["classes"] == ["exec.spawn_failed", "exec.error"]
    assert err["message"]


def test_unknown_sandbox_maps_no_responders_to_sandbox_not_found(nats: NatsServer) -> None:
    """A sandbox nobody serves gets NATS no responders, reported as sandbox.not_found."""
    r = client(nats, "exec", {"argv": ["true"]}, sandbox="nobody-serves-this")
    err = r["error"]
    assert (err["code"], err["retryable"], err["classes"]) == (
        "sandbox.not_found",
        False,
        ["sandbox.error"],
    )


def test_execd_killed_mid_exec_is_sandbox_unavailable(
    nats: NatsServer, start_execd: Callable[..., Execd], tmp_path: Path
) -> None:
    """SIGKILL on execd during an exec without timeout: liveness probing ends the wait, typed."""
    execd = start_execd()
    args = json.dumps({"shell": f"touch {tmp_path}/go; exec sleep 30"})
    with subprocess.Popen(
        [_require_node(), str(CLIENT / "cli.mjs"), nats.url, execd.ids[0], "exec", args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        wait_until((tmp_path / "go").exists, 15, "the command to start")
        execd.kill()
        try:
            out, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(
                "the Node client still waits 20 s after its execd died (no liveness probing)"
            )
    assert proc.returncode == 3, err
    error = json.loads(out)["error"]
    assert (error["code"], error["retryable"]) == ("sandbox.unavailable", True)


def test_missing_dependencies_fail_with_the_make_target(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without clients/node/node_modules the tests fail (not skip) and name `make node-client`."""
    monkeypatch.setattr(sys.modules[__name__], "CLIENT", tmp_path)
    with pytest.raises(pytest.fail.Exception, match="make node-client"):
        _require_node()


async def test_a_stream_whose_last_frames_were_lost_is_resumed_not_hung(nats: NatsServer) -> None:
    """Frames are NATS core messages: a slow consumer or a reconnect can lose some. A gap shows
    when a later frame comes; the last frames (the exit frame too) have nothing after them. A
    responder that answers exec.start as execd does, publishes the first chunk and then stops
    (the rest "lost") gets an exec.resume from the Node client once it heard nothing for a
    while, re-sends from there, and the client ends with the whole output (before the fix it
    waited forever: the process timeout failed the test)."""
    nc = await nats_py.connect(nats.url)
    subjects = Subjects(DEFAULT_PREFIX)
    resumed: list[int] = []
    frames: list[OutputChunk | ExecExit] = []

    async def on_start(msg: Msg) -> None:
        start = decode(ExecStart, msg.data)
        exec_id = start.exec_id or "x"
        frames[:] = [
            OutputChunk(exec_id=exec_id, seq=1, stream="stdout", data=b"first "),
            OutputChunk(exec_id=exec_id, seq=2, stream="stdout", data=b"lost\n"),
            ExecExit(exec_id=exec_id, seq=3, exit_code=0, stdout_size=11),
        ]
        await msg.respond(encode(ExecStarted(exec_id=exec_id, pid=1, window=65536)))
        await nc.publish(start.deliver, encode(frames[0]))  # then silence
        starts.append(start.deliver)

    async def on_resume(msg: Msg) -> None:
        req = decode(ExecResume, msg.data)
        resumed.append(req.from_seq)
        await msg.respond(encode(ExecStatus(exec_id=req.exec_id, state="exited")))
        for frame in frames[req.from_seq - 1 :]:
            await nc.publish(starts[0], encode(frame))

    starts: list[str] = []
    await nc.subscribe(subjects.sandbox("lossy", "exec", "start"), cb=on_start)
    await nc.subscribe(subjects.sandbox("lossy", "exec", "resume"), cb=on_resume)
    await nc.subscribe(subjects.sandbox("lossy", "exec", "ack"), cb=_ignore)
    try:
        r = await asyncio.to_thread(client, nats, "stream", {"shell": "x"}, "lossy")
    finally:
        await nc.close()
    assert resumed and resumed[0] == 2, resumed
    assert r["exit_code"] == 0
    assert r["stdout"]["sha256"] == hashlib.sha256(b"first lost\n").hexdigest()


async def _ignore(_: Msg) -> None:
    """Acks need no answer (publish only)."""
