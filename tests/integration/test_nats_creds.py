"""Per-sandbox NATS credentials against a real nats-server in operator mode.

A sandbox's user JWT (``sandbox_permissions``) lets its execd serve its own subjects and nothing
else; the server reports every attempt outside them as a permissions violation, which nats-py
delivers to the connection's error callback (the connection stays up). Expired JWTs are refused
at connect, and a live connection is dropped when its JWT expires; nats-py then re-reads the creds
file, which is how a renewed credential reaches a running execd.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from conftest import Execd, NatsServer
from operator_nats import OperatorNats, Violations, installation_permissions
from sandpod import AsyncSandbox
from sandpod_bus import Bus, BusSettings, Inbound
from sandpod_bus.natsauth import decode_jwt, sandbox_permissions
from sandpod_contract.subjects import Subjects
from sandpod_lifecycle import natsauth_setup

PREFIX = "credtest"
SUBJECTS = Subjects(PREFIX)


@pytest.fixture
def service_creds(operator_nats: OperatorNats) -> Path:
    return operator_nats.creds("test-service", installation_permissions(PREFIX))


@pytest.fixture
async def connect(operator_nats: OperatorNats) -> AsyncIterator[Callable[..., object]]:
    """Factory: a raw nats-py connection with a creds file and a Violations recorder."""
    opened: list[Client] = []

    async def open_(creds: Path, **kw: object) -> tuple[Client, Violations]:
        violations = Violations()
        nc = await nats.connect(
            operator_nats.url, user_credentials=str(creds), error_cb=violations.record, **kw
        )
        opened.append(nc)
        return nc, violations

    yield open_
    for nc in opened:
        await nc.close()


def start_sandbox(op: OperatorNats, state: Path, service: Path) -> tuple[str, Path, Execd]:
    sandbox_id = f"c-{uuid.uuid4().hex[:10]}"
    creds = op.creds(
        sandbox_id,
        sandbox_permissions(SUBJECTS.sandbox_all(sandbox_id)),
        expires=int(time.time()) + 3600,
    )
    execd = Execd(
        op.url,
        state,
        [sandbox_id],
        {"SANDPOD_NATS_CREDS": str(creds), "SANDPOD_PREFIX": PREFIX},
        client_creds=str(service),
    )
    return sandbox_id, creds, execd


async def test_sandbox_creds_serve_their_own_sandbox(
    operator_nats: OperatorNats, state_dir: Path, service_creds: Path
) -> None:
    """execd connected with its sandbox's JWT answers one-shot and streaming execs."""
    sandbox_id, _, execd = start_sandbox(operator_nats, state_dir, service_creds)
    try:
        sbx = await AsyncSandbox.connect(
            sandbox_id, nats_url=operator_nats.url, prefix=PREFIX, nats_creds=str(service_creds)
        )
        try:
            result = await sbx.exec("/workspace", ["echo", "hello", sandbox_id])
            assert result.stdout == f"hello {sandbox_id}\n" and result.exit_code == 0
            out = b""
            async with sbx.exec_stream("for i in 1 2 3; do echo line$i; done") as st:
                async for chunk in st:  # frames to the client's inbox: execd's _INBOX.> right
                    out += chunk.data
                assert (await st.wait()).exit_code == 0
            assert out == b"line1\nline2\nline3\n"
        finally:
            await sbx.close()
    finally:
        assert execd.stop() == 0


@pytest.mark.parametrize(
    ("verb", "subject"),
    [
        ("subscription", SUBJECTS.sandbox_all("other-sandbox")),
        ("publish", SUBJECTS.sandbox("other-sandbox", "exec", "run")),
        ("subscription", SUBJECTS.api_all()),
        ("publish", SUBJECTS.api("sandboxes", "create")),
        ("subscription", SUBJECTS.events_all()),
        ("publish", "$JS.API.STREAM.LIST"),
        ("publish", "$KV.sandpod-objects.anything"),
        ("subscription", "$KV.>"),
        ("subscription", "_INBOX.>"),  # another client's replies and stream frames
    ],
)
async def test_sandbox_creds_cannot_leave_their_sandbox(
    operator_nats: OperatorNats, connect: Callable[..., object], verb: str, subject: str
) -> None:
    """The server refuses a sandbox user every subject outside its own (a permissions error)."""
    creds = operator_nats.creds("sbx-a", sandbox_permissions(SUBJECTS.sandbox_all("sbx-a")))
    nc, violations = await connect(creds)  # type: ignore[misc]
    # Its own subjects work on the same connection: the refusal below is about the subject.
    await nc.subscribe(SUBJECTS.sandbox_all("sbx-a"))
    await nc.publish("_INBOX.someone.1", b"frame")
    await nc.flush()
    assert violations.errors == []
    if verb == "subscription":
        await nc.subscribe(subject)
    else:
        await nc.publish(subject, b"x")
    await nc.flush()
    await violations.wait_for(f'permissions violation for {verb} to "{subject}"')
    assert nc.is_connected  # a violation is refused, not a disconnect


async def test_sandbox_creds_cannot_request_another_sandbox(
    operator_nats: OperatorNats,
    state_dir: Path,
    service_creds: Path,
    connect: Callable[..., object],
) -> None:
    """Sandbox A's creds get no answer from sandbox B's execd: the request itself is refused."""
    b_id, _, execd = start_sandbox(operator_nats, state_dir, service_creds)
    try:
        creds = operator_nats.creds("sbx-a", sandbox_permissions(SUBJECTS.sandbox_all("sbx-a")))
        nc, violations = await connect(creds)  # type: ignore[misc]
        with pytest.raises(nats.errors.Error):  # no responders / timeout: never a reply
            await nc.request(SUBJECTS.sandbox(b_id, "sys", "ping"), b"", timeout=1)
        await violations.wait_for(f'permissions violation for publish to "{PREFIX}.sbx.{b_id}')
    finally:
        assert execd.stop() == 0


async def test_expired_jwt_is_refused(operator_nats: OperatorNats) -> None:
    """A user JWT whose ``exp`` passed cannot connect; the same account's live one can."""
    now = int(time.time())
    perms = sandbox_permissions(SUBJECTS.sandbox_all("sbx-exp"))
    expired = operator_nats.creds("sbx-exp", perms, issued=now - 120, expires=now - 60)
    assert decode_jwt(_jwt(expired))["exp"] == now - 60
    errors = Violations()
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(
            operator_nats.url,
            user_credentials=str(expired),
            error_cb=errors.record,
            allow_reconnect=False,
            connect_timeout=2,
        )
    live = operator_nats.creds("sbx-exp", perms, issued=now, expires=now + 60)
    nc = await nats.connect(operator_nats.url, user_credentials=str(live), allow_reconnect=False)
    await nc.close()


async def test_expiry_closes_a_live_connection(
    operator_nats: OperatorNats, connect: Callable[..., object]
) -> None:
    """At ``exp`` the server drops the client and nats-py closes it for good (no reconnect):
    which is why a renewal must reach the client before then (see the next test)."""
    perms = sandbox_permissions(SUBJECTS.sandbox_all("sbx-exp"))
    path = operator_nats.creds("sbx-exp", perms, expires=int(time.time()) + 2)
    closed = asyncio.Event()

    async def on_closed() -> None:
        closed.set()

    nc, _ = await connect(path, closed_cb=on_closed)  # type: ignore[misc]
    assert nc.is_connected
    await asyncio.wait_for(closed.wait(), 10)
    assert nc.is_closed and "authentication expired" in str(nc.last_error).lower()


async def test_a_renewed_creds_file_reaches_the_live_bus_before_expiry(
    operator_nats: OperatorNats,
) -> None:
    """Bus watches its creds file: a rewrite (the kubelet's update of a renewed Secret) makes it
    reconnect with the new JWT, so it outlives the old JWT's expiry."""
    perms = sandbox_permissions(SUBJECTS.sandbox_all("sbx-renew"))
    expires = int(time.time()) + 3
    path = operator_nats.creds("sbx-renew", perms, expires=expires)
    old = operator_nats.root / "creds" / f"old-{uuid.uuid4().hex[:6]}.creds"
    old.write_text(path.read_text())
    bus = await Bus.connect(BusSettings(url=operator_nats.url, creds=str(path), creds_poll=0.05))
    witness_closed = asyncio.Event()

    async def on_closed() -> None:
        witness_closed.set()

    # A second client on the old JWT: its close is the event "the old JWT has expired".
    witness = await nats.connect(
        operator_nats.url, user_credentials=str(old), closed_cb=on_closed, allow_reconnect=False
    )
    try:
        renewed = operator_nats.creds("sbx-renew", perms, expires=expires + 3600)
        tmp = path.with_suffix(".new")
        tmp.write_text(renewed.read_text())
        tmp.replace(path)  # atomic, like the kubelet's symlink swap
        await asyncio.wait_for(witness_closed.wait(), 10)
        assert bus.creds_watch is not None and bus.creds_watch.changes == 1
        got: asyncio.Queue[bytes] = asyncio.Queue(maxsize=1)

        async def on_msg(msg: Inbound) -> None:
            await got.put(msg.data)

        sub = await bus.subscribe(SUBJECTS.sandbox("sbx-renew", "sys", "ping"), on_msg)
        await bus.flush()
        service = await nats.connect(
            operator_nats.url,
            user_credentials=str(operator_nats.creds("svc", installation_permissions(PREFIX))),
        )
        await service.publish(SUBJECTS.sandbox("sbx-renew", "sys", "ping"), b"still here")
        await service.close()
        assert await asyncio.wait_for(got.get(), 5) == b"still here"
        assert bus.is_connected
        await sub.stop()
    finally:
        await witness.close()
        await bus.close()


def _jwt(creds: Path) -> str:
    lines = creds.read_text().splitlines()
    return lines[lines.index("-----BEGIN NATS USER JWT-----") + 1]


async def test_natsauth_setup_makes_a_working_operator_installation(tmp_path: Path) -> None:
    """The setup command's files: a nats-server started from its config accepts the service
    creds (the gateway's key bucket included), which reach the installation's subjects only
    (each user's least-privilege limits: tests/integration/test_k8s_bus_users.py); the Helm
    values carry the same operator and accounts; every secret file is 0600."""
    out = tmp_path / "auth"
    assert natsauth_setup.main(["--out", str(out), "--prefix", PREFIX]) == 0
    assert natsauth_setup.main(["--out", str(out)]) == 2  # never overwrites keys
    for name in (
        "operator.seed",
        "account.seed",
        "lifecycle.creds",
        "pool.creds",
        "gateway.creds",
        "client.creds",
    ):
        assert (out / name).stat().st_mode & 0o777 == 0o600
    merge = json.loads((out / "nats-values.yaml").read_text())["nats"]["config"]["merge"]
    conf = (out / "nats-server.conf").read_text()
    assert f"operator: {merge['operator']}" in conf and merge["resolver"] == "MEMORY"
    assert all(f"{k}: {v}" in conf for k, v in merge["resolver_preload"].items())
    (tmp_path / "js").mkdir()
    server = NatsServer(tmp_path / "js", out / "nats-server.conf")
    server.start()
    try:
        violations = Violations()
        nc = await nats.connect(
            server.url, user_credentials=str(out / "gateway.creds"), error_cb=violations.record
        )
        try:
            kv = await nc.jetstream().create_key_value(bucket=f"{PREFIX}-gateway-keys")
            assert await kv.put("k", b"v") == 1
            await nc.publish(SUBJECTS.api("sandboxes", "list"), b"")
            await nc.publish("other.api.sandboxes.list", b"")
            await nc.flush()
            await violations.wait_for('permissions violation for publish to "other.api')
            assert len(violations.errors) == 1
        finally:
            await nc.close()
    finally:
        server.stop()
