"""Attacks on a real `sandpod up` (local runtime, as root) through its bus, from where the attacker
sits: another local user (``nobody``) with no credential, or code holding one service's
credential. Each attack is refused, and afterwards the platform is unharmed: ``default`` still
serves exec, nothing the attacker asked for ran (as root or at all).

The state dir sits in a directory every user can traverse, so only its own modes protect it.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import nats
import psutil
import pytest
from nats.aio.client import Client

import conftest
from conftest import free_port
from operator_nats import Violations
from rootless import as_user
from sandpod_contract.codec import decode_reply, encode
from sandpod_contract.errors import SandboxJailRefused
from sandpod_contract.messages.common import Empty
from sandpod_contract.messages.node import NodeSandboxes, Serve
from sandpod_contract.subjects import Subjects

SANDPOD = str(Path(sysconfig.get_path("scripts")) / "sandpod")
ATTACKER = Path(__file__).with_name("bus_attacker.py")
PREFIX = "sandpod"
SUBJECTS = Subjects(PREFIX)
NODE = os.environ.get("SANDPOD_NODE") or socket.gethostname().split(".")[0]

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="attacks on `sandpod up` as root from user nobody: run the suite as root with "
    "util-linux (setpriv) installed",
)


class Up:
    def __init__(self, base: Path, proc: subprocess.Popen[str], port: int) -> None:
        self.base = base
        self.state = base / "state"
        self.proc = proc
        self.url = f"nats://127.0.0.1:{port}"

    def creds(self, user: str) -> Path:
        path = self.state / "nats-auth" / f"{user}.creds"
        assert path.is_file(), f"`sandpod up` made no {user} credential in {path.parent}"
        return path

    def cli(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """The CLI as the user who ran `sandpod up`, with no credential flag or variable."""
        env = {k: v for k, v in os.environ.items() if k != "SANDPOD_NATS_CREDS"}
        env |= {"SANDPOD_NATS_URL": self.url, "SANDPOD_STATE_DIR": str(self.state)}
        return subprocess.run([SANDPOD, *argv], env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def up() -> Iterator[Up]:
    """`sandpod up` (no gateway) with its state dir below a world-traversable directory."""
    base = Path(tempfile.mkdtemp(prefix="sandpod-bus-attack-", dir="/tmp"))
    base.chmod(0o755)
    port = free_port()
    proc = subprocess.Popen(
        [
            SANDPOD,
            "up",
            "--state-dir",
            str(base / "state"),
            "--port",
            str(port),
            "--no-gateway",
            "--runtime",
            "local",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "Ctrl-C stops everything" in line:
                break
        else:
            pytest.fail(f"`sandpod up` exited early:\n{''.join(lines)}")
        tree = psutil.Process(proc.pid).children(recursive=True)
        conftest.SESSION_DAEMON_PIDS.update(p.pid for p in tree)  # this module's daemons
        yield Up(base, proc, port)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(base, ignore_errors=True)


def _nobody(up: Up, *args: str) -> dict[str, object]:
    """Run the attacker script as ``nobody`` (no groups) and return what it printed."""
    entry = pwd.getpwnam("nobody")
    spare = up.base / f"spare-{uuid.uuid4().hex[:6]}"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": "/nonexistent",
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    try:
        run = subprocess.run(
            [*as_user(entry.pw_uid, entry.pw_gid, spare), sys.executable, str(ATTACKER), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        shutil.rmtree(spare, ignore_errors=True)
    assert run.returncode == 0, run.stderr
    result: dict[str, object] = json.loads(run.stdout.strip().splitlines()[-1])
    return result


async def _connect(up: Up, user: str) -> tuple[Client, Violations]:
    violations = Violations()
    nc = await nats.connect(
        up.url,
        user_credentials=str(up.creds(user)),
        error_cb=violations.record,
        allow_reconnect=False,
    )
    return nc, violations


def _assert_unharmed(up: Up, attacked: str, marker: Path) -> None:
    """`default` still runs commands as its sandbox user; the attacker's sandbox is not served
    and its command never ran."""
    run = up.cli("exec", "default", "--", "id", "-u")
    assert run.returncode == 0, run.stderr
    assert int(run.stdout) != 0, "default runs as its own uid, never root"
    assert not marker.exists(), f"the attacker's command ran (as uid {marker.read_text()!r})"

    async def served() -> tuple[str, ...]:
        nc, _ = await _connect(up, "lifecycle")
        try:
            msg = await nc.request(SUBJECTS.node(NODE, "execd", "list"), encode(_empty()), 10)
            return decode_reply(NodeSandboxes, msg.data).sandbox_ids
        finally:
            await nc.close()

    ids = asyncio.run(served())
    assert "default" in ids and attacked not in ids, ids


def _empty() -> Empty:
    return Empty()


def test_nobody_cannot_connect_nor_serve_an_unjailed_sandbox(up: Up) -> None:
    """A local user with no credential is refused at connect, so cannot ask the root execd to
    serve a sandbox without a jail (and run a command in it as root); nothing was harmed."""
    attacked, marker = f"evil-{uuid.uuid4().hex[:6]}", up.base / f"marker-{uuid.uuid4().hex}"
    result = _nobody(up, "anonymous", up.url, PREFIX, NODE, attacked, str(marker))
    assert result["connected"] is False, f"anonymous client accepted: {result}"
    assert "authorization violation" in str(result["error"]).lower(), result
    _assert_unharmed(up, attacked, marker)


def test_nobody_cannot_read_the_state_dir(up: Up) -> None:
    """The state dir is 0700 and its secrets and logs 0600: nobody lists or reads none of them."""
    result = _nobody(up, "read", str(up.state))
    assert "listing" not in result, f"nobody listed the state dir: {result}"
    readable = [k for k, v in result.items() if v == "read"]
    assert not readable, f"nobody read {readable}"
    assert stat.S_IMODE(up.state.stat().st_mode) == 0o700
    for path in [
        up.state / "nats.conf",
        *up.state.glob("nats-auth/*"),
        *up.state.glob("logs/*.log"),
    ]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    run = up.cli("exec", "default", "--", "true")  # the owner still reads its credential
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize(
    "subject",
    [
        SUBJECTS.node(NODE, "execd", "serve"),
        SUBJECTS.node(NODE, "execd", "release"),
        "$KV.sandpod-gateway-keys.forged",
        "$KV.sandpod-resources.sandbox.default.default",
        "$JS.API.STREAM.INFO.KV_sandpod-gateway-keys",
        "$JS.API.STREAM.DELETE.KV_sandpod-resources",
    ],
)
def test_client_creds_cannot_reach_the_node_plane_or_the_buckets(up: Up, subject: str) -> None:
    """Even the legitimate client credential (the CLI's) gets a permission violation on the node
    plane, the KV buckets and the JetStream API; `default` is untouched."""

    async def attack() -> None:
        nc, violations = await _connect(up, "client")
        try:
            serve = encode(Serve(sandbox_id="default"))
            with pytest.raises(nats.errors.TimeoutError):  # no one may answer: never delivered
                await nc.request(subject, serve, timeout=2)
            await violations.wait_for(f'permissions violation for publish to "{subject.lower()}"')
        finally:
            await nc.close()

    asyncio.run(attack())
    _assert_unharmed(up, "none", up.base / "no-marker")


@pytest.mark.parametrize("subject", [SUBJECTS.api_all(), ">", SUBJECTS.node_plane()])
def test_execd_creds_cannot_listen_to_the_control_plane(up: Up, subject: str) -> None:
    """The execd credential subscribes to its sandboxes' subjects only: `<prefix>.api.>`, `>`
    and the whole node plane are permission violations, and it receives nothing there."""

    async def attack() -> None:
        nc, violations = await _connect(up, "execd")
        got: list[str] = []

        async def on_msg(msg: object) -> None:
            got.append(getattr(msg, "subject", ""))

        try:
            await nc.subscribe(subject, cb=on_msg)
            await violations.wait_for(f'permissions violation for subscription to "{subject}"')
        finally:
            await nc.close()
        assert not got, got

    asyncio.run(attack())


@pytest.mark.parametrize("jail", ["none", "attacker_file"])
def test_serve_without_a_trusted_jail_is_refused_even_from_lifecycle(up: Up, jail: str) -> None:
    """With lifecycle's own credential, `serve` of a sandbox that has no jail file (or naming a
    jail file the attacker wrote) is refused with `sandbox.jail_refused`; nothing is served."""
    attacked = f"evil-{uuid.uuid4().hex[:6]}"
    forged = up.base / "forged-jail.json"
    forged.write_text(json.dumps({"version": 1, "sandbox_id": attacked, "phase": "running"}))
    os.chown(forged, pwd.getpwnam("nobody").pw_uid, -1)
    request = Serve(sandbox_id=attacked, jail=str(forged) if jail == "attacker_file" else None)

    async def attack() -> None:
        nc, _ = await _connect(up, "lifecycle")
        try:
            msg = await nc.request(SUBJECTS.node(NODE, "execd", "serve"), encode(request), 15)
        finally:
            await nc.close()
        with pytest.raises(SandboxJailRefused) as refused:
            decode_reply(NodeSandboxes, msg.data)
        assert attacked in refused.value.message

    asyncio.run(attack())
    _assert_unharmed(up, attacked, up.base / "no-marker")


def test_serve_refuses_a_jail_file_another_user_wrote_in_the_jail_dir(up: Up) -> None:
    """A jail file in execd's own jail directory that another user owns (or could write) is not
    trusted: `sandbox.jail_refused`, nothing served."""
    attacked = f"evil-{uuid.uuid4().hex[:6]}"
    jail_dir = up.state / "jails" / attacked
    jail_dir.mkdir(parents=True)
    forged = jail_dir / "jail.json"  # no holder or cgroups: lifecycle's sweep harms nothing
    forged.write_text(json.dumps({"version": 1, "sandbox_id": attacked, "phase": "running"}))
    os.chown(forged, pwd.getpwnam("nobody").pw_uid, -1)

    async def attack() -> None:
        nc, _ = await _connect(up, "lifecycle")
        try:
            msg = await nc.request(
                SUBJECTS.node(NODE, "execd", "serve"), encode(Serve(sandbox_id=attacked)), 15
            )
        finally:
            await nc.close()
        with pytest.raises(SandboxJailRefused) as refused:
            decode_reply(NodeSandboxes, msg.data)
        assert "owned by uid" in refused.value.message

    try:
        asyncio.run(attack())
        _assert_unharmed(up, attacked, up.base / "no-marker")
    finally:
        shutil.rmtree(jail_dir, ignore_errors=True)
