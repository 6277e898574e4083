"""Per-sandbox NATS credentials on a real node: a Secret the real kubelet mounts, rotated by it.

NATS runs in operator mode on the host end of the node's link (``node_operator_nats``); every
service connects as its own user and lifecycle holds the account seed, so each Sandbox's Pod
gets a user JWT of its own in a Secret (tests/node/conftest.py ``op_node_cluster``). What the
fast layer (tests/k8s/test_pod_creds.py) shows with a test kubelet is shown here with the real
one: the file from inside the container (the kubelet's atomic-writer layout, its mode and
owner), the credential taken out by the sandbox's own code and refused everything but its own
subjects by the server, and a rotation through the kubelet's Secret sync that execd follows
before its JWT expires (tests/node/rotation.py puts the three clocks on one timeline;
bench/creds_rotation.py prints its delays).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from kubernetes import client
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from k8s.cluster import NS, Cluster
from node.conftest import OpCluster, pod_env
from node.rotation import (
    SWAP_WATCHER,
    connections,
    minted,
    parse_swaps,
    secret_rewrites,
    timeline,
)
from operator_nats import Violations, installation_permissions
from sandpod import AsyncSandbox
from sandpod_contract.subjects import Subjects
from sandpod_kube.podspec import CREDS_KEY, CREDS_MOUNT

# A real node's Pods start in seconds, but the node itself takes ~40 s on first use; the
# rotation test lives past its first JWT (TTL + a rotation).
pytestmark = pytest.mark.timeout(600)

CREDS = f"{CREDS_MOUNT}/{CREDS_KEY}"
TTL = 60  # SANDPOD_NATS_CREDS_TTL's minimum: re-minted at 30 s (its half-life)


def _lifecycle(oc: OpCluster, **extra: str) -> None:
    oc.cluster.service(
        "sandpod_lifecycle", SANDPOD_NATS_ACCOUNT_SEED_FILE=str(oc.seed), **pod_env(), **extra
    )


async def _sandbox(c: Cluster, prefix: str) -> AsyncSandbox:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    return await c.create(name=name, timeout=1800)


def _secret(c: Cluster, name: str) -> client.V1Secret:
    with c.plane.settings.api_client() as api_client:
        return client.CoreV1Api(api_client).read_namespaced_secret(f"{name}-nats-creds", NS)


async def test_the_creds_file_is_the_kubelets_secret_volume_readable_by_execds_uid_only(
    op_node_cluster: OpCluster,
) -> None:
    """Inside the container: the creds file execd connects with is the kubelet's atomic-writer
    layout (``nats.creds -> ..data/nats.creds``, ``..data -> ..<timestamp>``) on a read-only
    tmpfs, holds this sandbox's own JWT, and no uid but execd's (through its group) and root
    can read it; execd runs as that uid and serves through the connection it made with it."""
    oc = op_node_cluster
    c = oc.cluster
    _lifecycle(oc)
    await c.answering()
    sbx = await _sandbox(c, "nc")
    try:
        secret = await asyncio.to_thread(_secret, c, sbx.id)
        version = minted(secret, time.time())
        commands = {
            "link": f"readlink {CREDS}",
            "data": f"readlink {CREDS_MOUNT}/..data",
            "stat": f"stat -L -c '%a %u %g' {CREDS}",
            "sha": f"sha256sum < {CREDS} | cut -c1-64",
            "uid": "id -u",
            "gid": "id -g",
            "puid": "grep -E '^Uid:' /proc/1/status",
            "pgid": "grep -E '^Gid:' /proc/1/status",
            "fs": f"stat -f -c %T {CREDS_MOUNT}/",
            "write": f"touch {CREDS_MOUNT}/x || true",
            "ids": "cat /proc/[0-9]*/status | grep -E '^(Uid|Gid):' | sort -u",
        }
        seen = {}
        for key, command in commands.items():
            r = await sbx.exec(f"( {command} ) 2>&1")
            assert r.exit_code == 0, (key, r.stdout)
            seen[key] = r.stdout.strip()
        link, data, stat, sha, uid, gid, puid, pgid, fs, write, ids = seen.values()
        # The atomic writer's layout: an update writes a new ..<timestamp> dir and swaps ..data.
        assert link == f"..data/{CREDS_KEY}", seen
        assert data.startswith("..") and data != "..data", seen
        mode, owner, group = stat.split()
        assert int(mode, 8) & 0o077 == int(mode, 8) & 0o040, seen  # group read at most
        assert int(mode, 8) & 0o400 and int(owner) == 0 and group == gid, seen
        assert puid.split()[1] == uid and pgid.split()[1] == gid, seen  # execd (pid 1): that uid
        assert uid != "0", seen
        # The kubelet widens defaultMode 0400 to 0440 for the Pod's fsGroup (the sandbox's gid):
        # every process in the container is that one uid and gid, so none other reads it.
        assert ids.splitlines() == sorted({puid, pgid}), seen
        assert fs == "tmpfs", seen  # never on the node's disk
        assert "Read-only file system" in write, seen
        assert sha == version.sha  # the file is the Secret lifecycle minted for this sandbox
        conns = connections(oc.nats.connz(), {version.user})
        assert conns and conns[-1].stop is None  # execd's live connection is this JWT's user
        assert (await sbx.exec(["echo", "served"])).stdout == "served\n"
    finally:
        await sbx.kill()
        await sbx.close()


async def test_creds_read_out_of_a_sandbox_reach_nothing_but_its_own_subjects(
    op_node_cluster: OpCluster, tmp_path: Path
) -> None:
    """Sandbox A's code reads its creds (``cat``) and hands them out: connected with them, the
    server refuses subscribing to B's subjects, ``<prefix>.api.>``, ``$JS.>`` and ``$KV.>``, and
    publishing to B's requests. The same calls with a credential shared by every sandbox (the
    installation's subjects and JetStream) go through: B answers it, its subscriptions receive."""
    oc = op_node_cluster
    c = oc.cluster
    _lifecycle(oc)
    await c.answering()
    a, b = await asyncio.gather(_sandbox(c, "na"), _sandbox(c, "nb"))
    try:
        stolen = tmp_path / "stolen.creds"
        r = await a.exec(["cat", CREDS])
        assert r.exit_code == 0 and "NATS USER JWT" in r.stdout, r
        stolen.write_text(r.stdout)
        shared = oc.nats.creds("shared", installation_permissions(c.prefix))
        subjects = Subjects(c.prefix)
        targets = {
            "b": subjects.sandbox_all(b.id),
            "api": subjects.api_all(),
            "js": "$JS.>",
            "kv": "$KV.>",
        }
        b_ping = subjects.sandbox(b.id, "sys", "ping")

        # The shared credential: every one of these works (so the refusals below are the JWT's).
        seen = await _subscribed_and_received(c.nats.url, shared, targets)
        assert seen == set(targets)
        async with _connected(c.nats.url, shared) as (nc, _):
            assert (await nc.request(b_ping, b"", timeout=10)).data is not None

        # A's credential: refused by the server, each one.
        async with _connected(c.nats.url, stolen) as (nc, violations):
            for subject in targets.values():
                await nc.subscribe(subject)
            await nc.publish(b_ping, b"", reply="_INBOX.stolen")
            await nc.flush()
            for subject in targets.values():
                await violations.wait_for(f'subscription to "{subject}"')
            await violations.wait_for(f'publish to "{b_ping}"')
        assert (await b.exec(["true"])).exit_code == 0  # B is unharmed
        assert (await a.exec(["true"])).exit_code == 0  # and A's own execd still serves
    finally:
        for sbx in (a, b):
            await sbx.kill()
            await sbx.close()


async def _subscribed_and_received(url: str, creds: Path, targets: dict[str, str]) -> set[str]:
    """Which of ``targets`` (wildcards) a connection with ``creds`` can subscribe to and then
    receive a message published (by itself) under."""
    got: set[str] = set()
    async with _connected(url, creds) as (nc, violations):
        events = {key: asyncio.Event() for key in targets}
        for key, subject in targets.items():

            async def on_msg(_msg: Msg, key: str = key) -> None:
                events[key].set()

            await nc.subscribe(subject, cb=on_msg)
        for subject in targets.values():
            await nc.publish(subject.replace(">", "probe"), b"")
        await nc.flush()
        for key, event in events.items():
            async with asyncio.timeout(10):
                await event.wait()
            got.add(key)
        assert not violations.errors, violations.errors
    return got


@contextlib.asynccontextmanager
async def _connected(url: str, creds: Path) -> AsyncIterator[tuple[NatsClient, Violations]]:
    """A connection with ``creds`` whose async errors (permission violations) are recorded."""
    violations = Violations()
    nc = await nats.connect(
        url, user_credentials=str(creds), error_cb=violations.record, allow_reconnect=False
    )
    try:
        yield nc, violations
    finally:
        await nc.close()


async def test_the_kubelet_rotates_the_creds_and_execd_reconnects_before_the_jwt_expires(
    op_node_cluster: OpCluster,
) -> None:
    """With a 60 s JWT, lifecycle re-mints at its half-life; the real kubelet's Secret sync swaps
    the file in the container, execd reconnects with it before the old JWT expires (the server
    saw its connection as the new user start before that expiry, and closed none for an expired
    JWT), and the sandbox keeps answering exec well past its first JWT's expiry."""
    oc = op_node_cluster
    c = oc.cluster
    _lifecycle(oc, SANDPOD_NATS_CREDS_TTL=str(TTL))
    await c.answering()
    sbx = await _sandbox(c, "nr")
    try:
        secret = await asyncio.to_thread(_secret, c, sbx.id)
        assert secret.metadata is not None and secret.metadata.resource_version
        first = minted(secret, time.time())
        assert TTL <= first.expires - first.issued <= TTL + 1  # iat floored, exp rounded up
        watcher = await sbx.proc.start(SWAP_WATCHER, proc_id="swaps")
        # Three rewrites: the last comes at the second JWT's half-life, past the first's expiry.
        versions = [first] + await asyncio.to_thread(
            secret_rewrites,
            c.plane.settings,
            NS,
            f"{sbx.id}-nats-creds",
            after=secret.metadata.resource_version,
            count=3,
            timeout=4 * TTL,
        )
        assert len(versions) == 4, versions
        r = await sbx.exec(["echo", "still", sbx.id])
        assert r.stdout == f"still {sbx.id}\n"
        assert time.time() > first.expires  # answered well past the first JWT's expiry
        await watcher.kill()
        swaps = parse_swaps((await sbx.fs.read("/workspace/swaps")).decode())
        conns = connections(oc.nats.connz(), {v.user for v in versions})
        rotations = timeline(versions, swaps, conns)
        for rot in rotations[:2]:  # the third may still be on its way through the kubelet
            assert rot.t_file is not None and rot.t_conn is not None, (rot, swaps, conns)
            assert rot.new.issued <= rot.t_file < rot.old.expires, rot
            assert rot.new.issued <= rot.t_conn < rot.old.expires, rot  # before the old expired
        expired = [x for x in conns if "expired" in x.reason.lower()]
        assert not expired, expired
        assert versions[-1].issued > first.expires  # the chain went on past the first expiry
    finally:
        await sbx.kill()
        await sbx.close()
