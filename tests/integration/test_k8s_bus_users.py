"""Kubernetes mode's service users, attacked with the creds ``natsauth_setup`` writes, on a real
nats-server started from the config it writes (operator mode, the same one a cluster runs).

Each user is least-privilege (:mod:`sandpod_lifecycle.bus_users`, shared with ``sandpod up``):
a stolen pool, gateway or client credential cannot reach the node plane, answer lifecycle's API
or forge its events; only the gateway reaches its key bucket; no one reaches a KV store
(Kubernetes mode keeps state in the API server) nor ``>``. Each attack must come back as a
server permission violation; afterwards each user still does its real job on the same
connection (nothing else harmed). That the real services run with these permissions is shown by
tests/k8s/test_pod_creds.py, whose lifecycle, pool and SDK connect with these users.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from conftest import NatsServer
from operator_nats import Violations
from sandpod_bus import Bus, BusSettings
from sandpod_contract.subjects import Subjects
from sandpod_lifecycle import natsauth_setup

PREFIX = "k8susers"
S = Subjects(PREFIX)
NODE_SERVE = f"{PREFIX}.node.n1.execd.serve"
RESOURCES_KV = f"$KV.{S.storage('resources')}.Sandbox.default.x"
LEASES_KV = f"$KV.{S.storage('leases')}.x"
KEYS_KV = f"$KV.{S.storage('gateway-keys')}.forged"
KEYS_STREAM = f"$JS.API.STREAM.INFO.KV_{S.storage('gateway-keys')}"
RESOURCES_STREAM = f"$JS.API.STREAM.CREATE.KV_{S.storage('resources')}"
EVENTS_STREAM = f"$JS.API.STREAM.CREATE.{S.storage('events')}"
FORGED_EVENT = f"{PREFIX}.events.default.victim"
EVERY_SUBJECT = ">"

# user -> (publishes refused, subscriptions refused)
ATTACKS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "lifecycle": (
        (NODE_SERVE, RESOURCES_KV, LEASES_KV, KEYS_KV, KEYS_STREAM, RESOURCES_STREAM),
        (EVERY_SUBJECT, S.api_kind("pools"), S.sandboxes_all(), S.events_all()),
    ),
    "pool": (
        (NODE_SERVE, RESOURCES_KV, LEASES_KV, KEYS_KV, KEYS_STREAM, EVENTS_STREAM, FORGED_EVENT),
        (
            EVERY_SUBJECT,
            S.api_kind("sandboxes"),
            S.api_tenant_kind("sandboxes"),
            S.sandboxes_all(),
            S.events_all(),
        ),
    ),
    "gateway": (
        (NODE_SERVE, RESOURCES_KV, LEASES_KV, RESOURCES_STREAM, EVENTS_STREAM, FORGED_EVENT),
        (EVERY_SUBJECT, S.api_kind("sandboxes"), S.api_kind("pools"), S.sandboxes_all()),
    ),
    "client": (
        (NODE_SERVE, RESOURCES_KV, KEYS_KV, KEYS_STREAM, EVENTS_STREAM, FORGED_EVENT),
        (EVERY_SUBJECT, S.api_kind("sandboxes"), S.sandboxes_all()),
    ),
}


async def _refused(violations: Violations, wanted: list[str]) -> None:
    """Until the server reported every violation in ``wanted`` (fail naming those it did not)."""
    try:
        for text in wanted:
            await violations.wait_for(text)
    except TimeoutError:
        missing = [w for w in wanted if not any(w.lower() in e for e in violations.errors)]
        pytest.fail(f"not refused by the server: {missing}")


@pytest.fixture
async def installation(tmp_path: Path) -> AsyncIterator[tuple[NatsServer, Path]]:
    """nats-server from natsauth_setup's config, and the directory with its creds."""
    out = tmp_path / "auth"
    assert natsauth_setup.main(["--out", str(out), "--prefix", PREFIX]) == 0
    (tmp_path / "js").mkdir()
    server = NatsServer(tmp_path / "js", out / "nats-server.conf")
    server.start()
    try:
        yield server, out
    finally:
        server.stop()


async def _connect(server: NatsServer, creds: Path, violations: Violations) -> Client:
    return await nats.connect(
        server.url, user_credentials=str(creds), allow_reconnect=False, error_cb=violations.record
    )


def test_the_setup_makes_exactly_the_kubernetes_users(tmp_path: Path) -> None:
    """No execd user (each Pod's execd gets its sandbox's creds) and nothing beyond the roles."""
    out = tmp_path / "auth"
    assert natsauth_setup.main(["--out", str(out), "--prefix", PREFIX]) == 0
    assert sorted(p.stem for p in out.glob("*.creds")) == sorted(ATTACKS)


@pytest.mark.parametrize("user", sorted(ATTACKS))
async def test_each_service_user_is_refused_beyond_its_role(
    installation: tuple[NatsServer, Path], user: str
) -> None:
    """Every publish and subscription outside the user's role is a permission violation; the
    connection stays up and the user's own job still works on it."""
    server, out = installation
    publishes, subscriptions = ATTACKS[user]
    violations = Violations()
    nc = await _connect(server, out / f"{user}.creds", violations)
    try:
        for subject in publishes:
            await nc.publish(subject, b"attack")
        for subject in subscriptions:
            await nc.subscribe(subject)
        await nc.flush()
        wanted = [f'permissions violation for publish to "{s}"' for s in publishes] + [
            f'permissions violation for subscription to "{s}"' for s in subscriptions
        ]
        await _refused(violations, wanted)
        assert nc.is_connected
    finally:
        await nc.close()
    await _still_works(server, out, user)


async def _still_works(server: NatsServer, out: Path, user: str) -> None:
    """The user's own job, through the real bus library, with no violation."""
    violations = Violations()
    nc = await _connect(server, out / f"{user}.creds", violations)
    try:
        if user == "lifecycle":  # owns the event stream; serves its API kinds
            bus = await Bus.connect(BusSettings(url=server.url, creds=str(out / "lifecycle.creds")))
            try:
                await bus.ensure_stream(S.storage("events"), [S.events_all()], 60.0)
                assert await bus.js_publish(f"{PREFIX}.events.default.s1", b"{}") == 1
            finally:
                await bus.close()
            await nc.subscribe(S.api_kind("sandboxes"))
        elif user == "pool":
            await nc.subscribe(S.api_kind("pools"))
            await nc.publish(S.api("sandboxes", "create"), b"{}")
        elif user == "gateway":  # its key bucket
            bus = await Bus.connect(BusSettings(url=server.url, creds=str(out / "gateway.creds")))
            try:
                kv = await bus.kv(S.storage("gateway-keys"))
                revision = await kv.create("k1", b"v")
                assert (await kv.get("k1")).revision == revision
            finally:
                await bus.close()
        else:
            await nc.subscribe(S.events_all())
            await nc.publish(S.api("sandboxes", "list"), b"")
        await nc.flush()
        rtt = await nc.rtt()  # a round trip after the flush: a violation would be in by now
        assert rtt >= 0 and violations.errors == []
    finally:
        await nc.close()
