"""Per-sandbox NATS credentials in Kubernetes mode, end to end: a NATS in operator mode, lifecycle
with the account seed, the real API server and the fake kubelet (which mounts each Pod's Secret
for its execd exactly as the Pod spec says).

Every service connects as its own least-privilege user (the permissions natsauth_setup mints,
:func:`sandpod_lifecycle.bus_users.kubernetes_users`), and the SDK as the client user: the real
lifecycle and pool do their work with exactly those rights.

Each Sandbox gets its own Secret (owned by it, a user JWT scoped to its subjects); its execd can
only connect with that (the server accepts nothing else); the creds of sandbox A reach nothing of
sandbox B's; the Secret goes with the Sandbox.
"""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import nats
import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from conftest import free_port
from k8s.cluster import NS, Cluster, cluster_setup, ready
from k8s.envtest import ControlPlane
from operator_nats import SECRET_MODE, OperatorNats, kubernetes_service_users
from sandpod import AsyncPools, AsyncSandbox
from sandpod_bus.natsauth import creds_jwt, decode_jwt
from sandpod_contract.pooling import POOL_LABEL
from sandpod_kube import KubeStore
from sandpod_kube.podspec import CREDS_EXPIRES, CREDS_KEY, CREDS_MOUNT


@pytest.fixture
async def op_cluster(
    kube_apiserver: ControlPlane,
    kube: KubeStore,
    operator_nats: OperatorNats,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[tuple[Cluster, Path]]:
    """A Kubernetes-mode installation on the operator-mode NATS; lifecycle and pool connect as
    their own users, this test's SDK as the client user; the account seed file for lifecycle is
    the second item."""
    await asyncio.to_thread(cluster_setup, kube_apiserver.settings, operator_nats.url)
    c = Cluster(kube_apiserver, operator_nats.server, tmp_path)
    c.store = kube
    client_creds, seed = kubernetes_service_users(operator_nats, c.prefix, c.credentials, tmp_path)
    monkeypatch.setenv("SANDPOD_NATS_CREDS", str(client_creds))  # the SDK (not execd)
    async with c.kubelet:
        try:
            yield c, seed
        finally:
            await c.cleanup()


LIFECYCLE_ENV = {
    "SANDPOD_RUNTIME": "kubernetes",
    "SANDPOD_RESYNC": "0.5",
    "SANDPOD_READY_TIMEOUT": "30",
    "SANDPOD_POD_NATS_CIDRS": "127.0.0.1/32",
}


async def test_pool_and_lifecycle_as_their_own_users_fill_a_pool_and_bind_a_claim(
    op_cluster: tuple[Cluster, Path],
) -> None:
    """The pool (its API kinds, the API as a client, ``sys.configure`` on members) and lifecycle
    (no KV, no node plane) as least-privilege users: a warm pool fills, a claim binds a member
    whose commands see the claim's env."""
    c, seed = op_cluster
    c.service("sandpod_lifecycle", SANDPOD_NATS_ACCOUNT_SEED_FILE=str(seed), **LIFECYCLE_ENV)
    c.service("sandpod_pool", SANDPOD_POOL_RESYNC="0.3")
    await c.answering()
    pools = await AsyncPools.connect(nats_url=c.nats.url, prefix=c.prefix)
    pool = f"cp-{uuid.uuid4().hex[:6]}"
    try:
        await pools.create(pool, replicas=1)
        await c.until(
            "SandboxWarmPool",
            pool,
            lambda o: o is not None and o.status.get("availableReplicas") == 1,
        )
        members, _ = await c.store.list("Sandbox", NS, f"{POOL_LABEL}={pool}")
        assert len(members) == 1 and ready(members[0])
        sbx = await AsyncSandbox.claim(
            pool, env={"AGENT": "a-9"}, timeout=600, nats_url=c.nats.url, prefix=c.prefix
        )
        try:
            assert sbx.claim_info is not None and sbx.claim_info.warm
            assert sbx.id == members[0].metadata.name
            assert (await sbx.exec("echo $AGENT")).stdout == "a-9\n"
        finally:
            await sbx.close()
    finally:
        await pools.close()
    _no_violations(c)


async def test_the_gateway_as_its_own_user_keeps_keys_and_serves_a_tenant(
    op_cluster: tuple[Cluster, Path],
    tmp_path: Path,
) -> None:
    """The gateway (its key bucket, the API and data plane as a client) as its least-privilege
    user: ``keys create`` with its creds writes a key, and a tenant creates a sandbox and
    execs in it over HTTP."""
    c, seed = op_cluster
    c.service("sandpod_lifecycle", SANDPOD_NATS_ACCOUNT_SEED_FILE=str(seed), **LIFECYCLE_ENV)
    await c.answering()
    creds = c.credentials["sandpod_gateway"]["SANDPOD_NATS_CREDS"]
    env = {
        **os.environ,
        "SANDPOD_NATS_URL": c.nats.url,
        "SANDPOD_PREFIX": c.prefix,
        "SANDPOD_NATS_CREDS": creds,
    }
    made = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "sandpod_gateway", "keys", "create", "--tenant", "acme"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    auth = {"authorization": f"Bearer {made.stdout.strip()}"}
    port = free_port()
    log = tmp_path / "gateway.log"
    with log.open("ab") as out:
        gateway = subprocess.Popen(
            [sys.executable, "-m", "sandpod_gateway"],
            env={**env, "SANDPOD_GATEWAY_PORT": str(port)},
            stdout=out,
            stderr=out,
        )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=90) as http:
            async with asyncio.timeout(30):
                while not await _ready(http, gateway, log):
                    await asyncio.sleep(0.1)
            name = f"cg-{uuid.uuid4().hex[:8]}"
            r = await http.post(
                "/v1/sandboxes", headers=auth, json={"metadata": {"name": name}, "wait": 60}
            )
            assert r.status_code == 201, r.text
            r = await http.post(
                f"/v1/sandboxes/{name}/exec",
                headers=auth,
                json={"argv": ["echo", "via", "gateway"]},
            )
            assert (r.status_code, r.json()["stdout"]) == (200, "via gateway\n"), r.text
            r = await http.delete(f"/v1/sandboxes/{name}", headers=auth)
            assert r.status_code < 300, r.text
    finally:
        gateway.terminate()
        gateway.wait(15)
    text = log.read_text(errors="replace").lower()
    assert "permissions violation" not in text, text[-2000:]
    _no_violations(c)


async def _ready(http: httpx.AsyncClient, proc: subprocess.Popen[bytes], log: Path) -> bool:
    if proc.poll() is not None:
        pytest.fail(f"gateway exited with {proc.returncode}:\n{log.read_text()}")
    try:
        return (await http.get("/readyz")).status_code == 200
    except httpx.HTTPError:
        return False


def _no_violations(c: Cluster) -> None:
    """No service met a permission violation on the way (its bus logs each as a warning)."""
    for proc in c.procs:
        text = proc.log.read_text(errors="replace").lower()
        assert "permissions violation" not in text, (proc.module, proc.tail())


def _secret(c: Cluster, name: str) -> client.V1Secret | None:
    with c.plane.settings.api_client() as api_client:
        try:
            return client.CoreV1Api(api_client).read_namespaced_secret(f"{name}-nats-creds", NS)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise


async def test_each_sandbox_pod_connects_with_its_own_creds_that_reach_only_its_subjects(
    op_cluster: tuple[Cluster, Path],
    tmp_path: Path,
) -> None:
    """Sandbox A's Secret is owned by A, holds a JWT scoped to A's subjects, is mounted 0400 for
    A's execd (which serves through it), cannot reach B or the control plane, and is deleted
    with A; the Sandbox reports full isolation."""
    c, seed = op_cluster
    c.service(
        "sandpod_lifecycle",
        SANDPOD_RUNTIME="kubernetes",
        SANDPOD_RESYNC="0.5",
        SANDPOD_READY_TIMEOUT="30",
        SANDPOD_POD_NATS_CIDRS="127.0.0.1/32",
        SANDPOD_NATS_ACCOUNT_SEED_FILE=str(seed),
    )
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
        assert secret is not None and secret.metadata is not None and secret.data is not None
        assert secret.metadata.owner_references and secret.metadata.annotations is not None
        owner = secret.metadata.owner_references[0]
        assert (owner.kind, owner.name, owner.uid, owner.controller) == (
            "Sandbox",
            a_name,
            sandbox.metadata.uid,
            True,
        )
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
        _no_violations(c)
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
        wanted = [
            f'publish to "{b_ping}"',
            f'subscription to "{c.prefix}.sbx.{b_name}.>"',
            f'subscription to "{c.prefix}.api.>"',
        ]
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
    c.service(
        "sandpod_lifecycle",
        SANDPOD_RUNTIME="kubernetes",
        SANDPOD_RESYNC="0.5",
        SANDPOD_READY_TIMEOUT="30",
        SANDPOD_POD_NATS_CIDRS="127.0.0.1/32",
        SANDPOD_NATS_ACCOUNT_SEED_FILE=str(seed),
    )
    await c.answering()
    name = f"cr-{uuid.uuid4().hex[:8]}"
    sbx = await AsyncSandbox.create(name=name, timeout=120, nats_url=c.nats.url, prefix=c.prefix)
    try:
        secret = _secret(c, name)
        assert secret is not None and secret.metadata is not None
        assert secret.metadata.annotations is not None and secret.metadata.resource_version
        first = int(secret.metadata.annotations[CREDS_EXPIRES])
        await sbx.renew(3 * 3600)
        renewed = await asyncio.to_thread(_next_version, c, name, secret.metadata.resource_version)
        assert renewed.metadata is not None and renewed.metadata.annotations is not None
        assert renewed.data is not None
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
        _no_violations(c)
    finally:
        await sbx.kill()
        await sbx.close()


def _next_version(c: Cluster, name: str, after: str) -> client.V1Secret:
    """The Secret once it changed after resourceVersion ``after`` (a watch, not polling)."""
    with c.plane.settings.api_client() as api_client:
        core = client.CoreV1Api(api_client)
        stream = watch.Watch()  # type: ignore[no-untyped-call]  # untyped in the client
        for event in stream.stream(  # type: ignore[no-untyped-call]  # untyped in the client
            core.list_namespaced_secret,
            NS,
            timeout_seconds=30,
            field_selector=f"metadata.name={name}-nats-creds",
            resource_version=after,
        ):
            if event["type"] == "MODIFIED":
                stream.stop()  # type: ignore[no-untyped-call]  # untyped in the client
                secret = event["object"]
                assert isinstance(secret, client.V1Secret)
                return secret
    pytest.fail(f"the creds Secret of {name} was not renewed within 30s")
