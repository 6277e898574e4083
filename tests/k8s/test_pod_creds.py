"""Per-sandbox NATS credentials in Kubernetes mode, end to end: a NATS in operator mode, lifecycle
with the account seed, the real API server and the fake kubelet (which mounts each Pod's Secret
for its execd exactly as the Pod spec says).

Each Sandbox gets its own Secret (owned by it, a user JWT scoped to its subjects); its execd can
only connect with that (the server accepts nothing else); the creds of sandbox A reach nothing of
sandbox B's; the Secret goes with the Sandbox.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from k8s.cluster import NS, Cluster, cluster_setup
from k8s.envtest import ControlPlane
from operator_nats import OperatorNats
from sandpod import AsyncSandbox
from sandpod_bus.natsauth import creds_jwt, decode_jwt, service_permissions
from sandpod_kube import KubeStore
from sandpod_kube.podspec import CREDS_EXPIRES, CREDS_KEY, CREDS_MOUNT

SECRET_MODE = 0o400


@pytest.fixture
async def op_cluster(
    kube_apiserver: ControlPlane, kube: KubeStore, operator_nats: OperatorNats, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[tuple[Cluster, Path]]:  # fmt: skip
    """A Kubernetes-mode installation on the operator-mode NATS; services and this test connect
    with a service user's creds; the account seed file for lifecycle is the second item."""
    await asyncio.to_thread(cluster_setup, kube_apiserver.settings, operator_nats.url)
    c = Cluster(kube_apiserver, operator_nats.server, tmp_path)
    c.store = kube
    service = operator_nats.creds("services", service_permissions(c.prefix))
    monkeypatch.setenv("SANDPOD_NATS_CREDS", str(service))  # services and the SDK (not execd)
    seed = tmp_path / "account.seed"
    seed.write_text(operator_nats.account_seed)
    seed.chmod(SECRET_MODE)
    async with c.kubelet:
        try:
            yield c, seed
        finally:
            await c.cleanup()


def _secret(c: Cluster, name: str) -> client.V1Secret | None:
    with c.plane.settings.api_client() as api_client:
        try:
            return client.CoreV1Api(api_client).read_namespaced_secret(f"{name}-nats-creds", NS)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise


async def test_each_sandbox_pod_connects_with_its_own_creds_that_reach_only_its_subjects(
    op_cluster: tuple[Cluster, Path], tmp_path: Path,
) -> None:  # fmt: skip
    """Sandbox A's Secret is owned by A, holds a JWT scoped to A's subjects, is mounted 0400 for
    A's execd (which serves through it), cannot reach B or the control plane, and is deleted
    with A; the Sandbox reports full isolation."""
    c, seed = op_cluster
    c.service("sandpod_lifecycle", SANDPOD_RUNTIME="kubernetes", SANDPOD_RESYNC="0.5",
              SANDPOD_READY_TIMEOUT="30", SANDPOD_POD_NATS_CIDRS="127.0.0.1/32",
              SANDPOD_NATS_ACCOUNT_SEED_FILE=str(seed))  # fmt: skip
    await c.answering()
    a_name, b_name = f"ca-{uuid.uuid4().hex[:8]}", f"cb-{uuid.uuid4().hex[:8]}"
    a = await AsyncSandbox.create(name=a_name, timeout=120, nats_url=c.nats.url, prefix=c.prefix)
    b = await AsyncSandbox.create(name=b_name, timeout=120, nats_url=c.nats.url, prefix=c.prefix)
    try:
        assert (await a.exec(["echo", "from", a_name])).stdout == f"from {a_name}\n"
        assert (await b.exec(["echo", "from", b_name])).stdout == f"from {b_name}\n"
        sandbox = await c.store.get("Sandbox", NS, a_name)
        isolated = {x["type"]: x for x in sandbox.status["conditions"]}["Isolated"]
        assert (isolated["status"], isolated["reason"]) == ("True", "FullIsolation")

        # The Secret: owned by the Sandbox, a JWT for A's subjects only, expiring with A.
        secret = _secret(c, a_name)
        assert secret is not None
        owner = secret.metadata.owner_references[0]
        assert (owner.kind, owner.name, owner.uid, owner.controller) == (
            "Sandbox", a_name, sandbox.metadata.uid, True)  # fmt: skip
        creds = base64.b64decode(secret.data[CREDS_KEY]).decode()
        claims = decode_jwt(creds_jwt(creds))
        assert claims["nats"]["sub"] == {"allow": [f"{c.prefix}.sbx.{a_name}.>"]}
        assert claims["nats"]["pub"] == {"allow": ["_INBOX.>"]}
        assert claims["nats"]["resp"]["max"] == 1
        assert str(claims["exp"]) == secret.metadata.annotations[CREDS_EXPIRES]
        assert claims["exp"] - claims["iat"] <= 120 + 300  # the sandbox's lifetime + margin

        # The Pod mounts it read-only, 0400, as a directory; execd is pointed at the file.
        pod = c.kubelet.seen[a_name]
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "nats-creds")
        assert volume["secret"]["secretName"] == f"{a_name}-nats-creds"
        assert volume["secret"]["defaultMode"] == SECRET_MODE
        main = pod["spec"]["containers"][0]
        assert {"name": "nats-creds", "mountPath": CREDS_MOUNT, "readOnly": True} in main[
            "volumeMounts"
        ]
        env = {e["name"]: e.get("value") for e in main["env"]}
        assert env["SANDPOD_NATS_CREDS"] == f"{CREDS_MOUNT}/{CREDS_KEY}"
        local = c.state / "pods" / a_name / "volumes" / "nats-creds" / CREDS_KEY
        assert local.read_text() == creds and local.stat().st_mode & 0o777 == SECRET_MODE

        await _a_cannot_reach_b(c, creds, tmp_path, b_name)
        assert (await b.exec(["true"])).exit_code == 0  # B is unharmed

        # Deleted with its Sandbox.
        await a.kill()
        await c.until("Sandbox", a_name, lambda o: o is None)
        assert _secret(c, a_name) is None
        assert _secret(c, b_name) is not None
    finally:
        await a.close()
        await b.close()


async def _a_cannot_reach_b(c: Cluster, creds: str, tmp_path: Path, b_name: str) -> None:
    path = tmp_path / "a.creds"
    path.write_text(creds)
    errors: list[str] = []
    seen = asyncio.Event()

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc).lower())
        seen.set()

    nc = await nats.connect(c.nats.url, user_credentials=str(path), error_cb=on_error)
    try:
        b_ping = f"{c.prefix}.sbx.{b_name}.sys.ping"
        with pytest.raises(nats.errors.Error):  # no reply ever reaches A
            await nc.request(b_ping, b"", timeout=1)
        await nc.subscribe(f"{c.prefix}.sbx.{b_name}.>")
        await nc.subscribe(f"{c.prefix}.api.>")
        await nc.flush()
        wanted = [f'publish to "{b_ping}"', f'subscription to "{c.prefix}.sbx.{b_name}.>"',
                  f'subscription to "{c.prefix}.api.>"']  # fmt: skip
        async with asyncio.timeout(5):
            while not all(any(w in e for e in errors) for w in wanted):
                seen.clear()
                await seen.wait()
    finally:
        await nc.close()


async def test_a_renew_re_mints_the_secret_and_the_running_execd_switches_to_it(
    op_cluster: tuple[Cluster, Path],
) -> None:
    """Renewing a sandbox moves its JWT's expiry: lifecycle rewrites the Secret, the kubelet's
    sync rewrites the file, and execd reconnects with the new JWT (and keeps serving)."""
    c, seed = op_cluster
    c.service("sandpod_lifecycle", SANDPOD_RUNTIME="kubernetes", SANDPOD_RESYNC="0.5",
              SANDPOD_READY_TIMEOUT="30", SANDPOD_POD_NATS_CIDRS="127.0.0.1/32",
              SANDPOD_NATS_ACCOUNT_SEED_FILE=str(seed))  # fmt: skip
    await c.answering()
    name = f"cr-{uuid.uuid4().hex[:8]}"
    sbx = await AsyncSandbox.create(name=name, timeout=120, nats_url=c.nats.url, prefix=c.prefix)
    try:
        secret = _secret(c, name)
        assert secret is not None
        first = int(secret.metadata.annotations[CREDS_EXPIRES])
        await sbx.renew(3 * 3600)
        renewed = await asyncio.to_thread(_next_version, c, name, secret.metadata.resource_version)
        later = int(renewed.metadata.annotations[CREDS_EXPIRES])
        assert later >= first + 3 * 3600 - 120
        creds = base64.b64decode(renewed.data[CREDS_KEY]).decode()
        assert decode_jwt(creds_jwt(creds))["exp"] == later
        await c.kubelet.sync_secret_volumes(name)
        log = c.state / "pods" / name / "execd.log"
        async with asyncio.timeout(30):  # execd polls its creds file every few seconds
            while "nats reconnected" not in log.read_text():
                await asyncio.sleep(0.1)
        assert "nats creds file changed" in log.read_text()
        assert (await sbx.exec(["echo", "still", name])).stdout == f"still {name}\n"
    finally:
        await sbx.kill()
        await sbx.close()


def _next_version(c: Cluster, name: str, after: str) -> client.V1Secret:
    """The Secret once it changed after resourceVersion ``after`` (a watch, not polling)."""
    with c.plane.settings.api_client() as api_client:
        core = client.CoreV1Api(api_client)
        stream = watch.Watch()
        for event in stream.stream(core.list_namespaced_secret, NS, timeout_seconds=30,
                                   field_selector=f"metadata.name={name}-nats-creds",
                                   resource_version=after):  # fmt: skip
            if event["type"] == "MODIFIED":
                stream.stop()
                return event["object"]
    pytest.fail(f"the creds Secret of {name} was not renewed within 30s")
