"""The network guard on the real API server: the Pod lifecycle's driver creates for a sandbox
(with ``PodSettings.netguard``) carries the guard exactly as intended and nothing more; the
guard's channel (a watch of its own Sandbox with its own ServiceAccount) sees a network update;
another sandbox's guard credential can neither read nor change this sandbox's policy.

The fake kubelet does not run the guard (it has no per-Pod network namespace); the guard itself
runs for real in tests/integration/test_netguard.py."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from guard_harness import PodGuards, create_sandbox, guard_token, set_policy
from k8s.envtest import ControlPlane
from k8s.kubelet import FakeKubelet
from sandpod_contract.network import NetworkPolicy
from sandpod_contract.resources import EnvVar, SandboxSpec, SandboxTemplateSpec
from sandpod_kube import KubeSettings, KubeStore, PodApi, StoreForbidden
from sandpod_kube.guardpod import (
    GUARD_CONTAINER,
    guard_access_manifests,
    guard_account_name,
    guard_security_context,
)
from sandpod_kube.guardtrust import BUNDLE_FILE, TRUST_BUNDLE_CONTAINER, TRUST_MOUNT, trust_env
from sandpod_kube.guardwatch import watch_sandbox
from sandpod_kube.podspec import PodSettings
from sandpod_lifecycle.driver import Owner
from sandpod_lifecycle.network.podguard.guard import policy_of
from sandpod_lifecycle.network.podguard.settings import GuardSettings
from sandpod_lifecycle.network.secretstore import placeholder
from sandpod_lifecycle.runtime.pod import GUARD_IPV4_ONLY, PodDriver
from sandpod_store import Resource

SETTINGS = PodSettings(
    netguard=True, guard_dns=("10.96.0.10",), nats_cidrs=("10.96.0.20/32",), run_as_user=1000
)
ALLOW = NetworkPolicy.from_dict({"mode": "allowlist", "allow": ["mirror.example.com:443"]})


@pytest.fixture
async def store(kube_apiserver: ControlPlane, namespace: str) -> AsyncIterator[KubeStore]:
    def default_account() -> None:  # the ServiceAccount admission plugin wants it
        with kube_apiserver.settings.api_client() as api_client:
            client.CoreV1Api(api_client).create_namespaced_service_account(
                namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="default"))
            )

    await asyncio.to_thread(default_account)
    kube = await KubeStore.connect(kube_apiserver.settings)
    yield kube
    await kube.close()


def raw_pod(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    with plane.settings.api_client() as api_client:
        pod = client.CoreV1Api(api_client).read_namespaced_pod(name, namespace)
        return dict(api_client.sanitize_for_serialization(pod))


def as_token(plane: ControlPlane, token: str) -> KubeSettings:
    return KubeSettings(host=plane.url, ca_file=str(plane.ca_file), token=token)


def _driver(api: PodApi, namespace: str, template: SandboxTemplateSpec) -> PodDriver:
    """A Pod driver with the guard on whose every template is ``template``."""

    async def templates(_namespace: str, _name: str | None) -> SandboxTemplateSpec:
        return template

    return PodDriver(
        api, SETTINGS, installation="ig", ready_timeout=30, namespace=namespace, templates=templates
    )


async def test_the_driver_gives_the_pod_its_guard_and_nothing_else(
    kube_apiserver: ControlPlane, namespace: str, store: KubeStore, tmp_path: Path
) -> None:
    """The guard is a native sidecar first in line, with exactly NET_ADMIN + NET_BIND_SERVICE
    and the only token of the Pod; the sandbox container has no capability and no token; the
    Pod asks 127.0.0.1 for DNS; names and a sandbox's own policy are reported enforced, a
    bandwidth limit is not."""
    sandbox = await create_sandbox(store, namespace, f"sbx-{uuid.uuid4().hex[:8]}")
    name = sandbox.metadata.name
    api = PodApi(kube_apiserver.settings)
    template = SandboxTemplateSpec(network=ALLOW)
    driver = _driver(api, namespace, template)
    kubelet = FakeKubelet(kube_apiserver.settings, namespace, tmp_path)
    kubelet.run_execd = False
    try:
        async with kubelet:
            owner = Owner(namespace, sandbox.metadata.uid)
            await driver.ensure(name, SandboxSpec(), template, owner)
            pod = await asyncio.to_thread(raw_pod, kube_apiserver, namespace, name)
            spec = pod["spec"]
            guard, *_ = spec["initContainers"]
            assert guard["name"] == GUARD_CONTAINER and guard["restartPolicy"] == "Always"
            assert guard["securityContext"] == guard_security_context()
            assert guard["securityContext"]["capabilities"] == {
                "drop": ["ALL"],
                "add": ["NET_ADMIN", "NET_BIND_SERVICE"],
            }
            assert "startupProbe" in guard
            (sandbox_container,) = spec["containers"]
            context = sandbox_container["securityContext"]
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert context["runAsUser"] == 1000 and context["allowPrivilegeEscalation"] is False
            assert spec["automountServiceAccountToken"] is False
            assert spec["serviceAccountName"] == guard_account_name(name)
            token_volumes = {v["name"] for v in spec["volumes"] if "projected" in v}
            assert token_volumes == {"netguard-token"}
            mounted = {m["name"] for m in sandbox_container["volumeMounts"]}
            assert not mounted & token_volumes, "the sandbox container mounts no token"
            for init in spec["initContainers"][1:]:
                assert not {m["name"] for m in init["volumeMounts"]} & token_volumes
            _guard_env_is_what_the_guard_reads(guard, spec, namespace, name, tmp_path)
            assert spec["dnsPolicy"] == "None"
            assert spec["dnsConfig"]["nameservers"] == ["127.0.0.1"]
            enforcement = await driver.apply_network(name, ALLOW)
            assert enforcement.enforced and enforcement.reason == GUARD_IPV4_ONLY
            own = NetworkPolicy.from_dict(
                {"mode": "public", "deny": ["a.test"], "limits": {"maxConnections": 5}}
            )
            enforcement = await driver.apply_network(name, own)  # the sandbox's own policy
            assert enforcement.enforced and "network guard" in enforcement.reason
            throttled = NetworkPolicy.from_dict({"limits": {"bandwidthBytesPerSecond": 1000}})
            enforcement = await driver.apply_network(name, throttled)
            assert not enforcement.enforced and "bandwidth" in enforcement.reason
            assert driver.protections()["network-guard"] == "active"
            await driver.destroy(name)
            await kubelet.until("deleted", lambda: name not in kubelet.seen)
    finally:
        await api.close()


INJECT = NetworkPolicy.from_dict(
    {
        "mode": "allowlist",
        "allow": ["api.example.test:443"],
        "inject": [{"domain": "api.example.test", "secret": "tok/value"}],
    }
)


async def test_every_guarded_pod_gets_the_trust_bundle_and_injections_their_placeholders(
    kube_apiserver: ControlPlane, namespace: str, store: KubeStore, tmp_path: Path
) -> None:
    """A template injecting a header: the Pod's init containers end with ``trust-bundle`` (the
    sandbox's image, its securityContext, after the guard and the execd bundle), and its
    commands' environment names the merged bundle and the secret's placeholder, never a
    value. A template without injections: the same bundle and variables (an injection may be
    added while it runs: the guard then puts its authority in the bundle), no placeholder."""
    api = PodApi(kube_apiserver.settings)
    kubelet = FakeKubelet(kube_apiserver.settings, namespace, tmp_path)
    kubelet.run_execd = False
    pods = {}
    try:
        async with kubelet:
            for policy in (INJECT, ALLOW):
                template = SandboxTemplateSpec(network=policy, env=(EnvVar("MINE", "1"),))
                driver = _driver(api, namespace, template)
                sandbox = await create_sandbox(store, namespace, f"sbx-{uuid.uuid4().hex[:8]}")
                name = sandbox.metadata.name
                await driver.ensure(
                    name, SandboxSpec(), template, Owner(namespace, sandbox.metadata.uid)
                )
                pods[policy] = (await asyncio.to_thread(raw_pod, kube_apiserver, namespace, name))[
                    "spec"
                ]
                await driver.destroy(name)
    finally:
        await api.close()
    spec = pods[INJECT]
    names = [c["name"] for c in spec["initContainers"]]
    assert names == [GUARD_CONTAINER, "execd-install", TRUST_BUNDLE_CONTAINER], names
    merge, (main,) = spec["initContainers"][-1], spec["containers"]
    assert merge["image"] == main["image"] and merge["securityContext"] == main["securityContext"]
    assert merge["command"][1:3] == ["-I", "-S"]  # nothing of the image's Python setup runs
    assert {m["name"]: m.get("readOnly", False) for m in merge["volumeMounts"]} == {
        "sandpod": True,
        "netguard-trust": False,  # it writes the merged bundle there
    }
    assert {"name": "netguard-trust", "mountPath": TRUST_MOUNT, "readOnly": True} in main[
        "volumeMounts"
    ]
    env = json.loads(next(e["value"] for e in main["env"] if e["name"] == "SANDPOD_EXECD_ENV"))
    assert env["SSL_CERT_FILE"] == env["REQUESTS_CA_BUNDLE"] == BUNDLE_FILE
    assert env["SANDPOD_SECRET_TOK_VALUE"] == placeholder("tok/value") and env["MINE"] == "1"
    plain = pods[ALLOW]
    assert [c["name"] for c in plain["initContainers"]] == names
    (main,) = plain["containers"]
    env = json.loads(next(e["value"] for e in main["env"] if e["name"] == "SANDPOD_EXECD_ENV"))
    assert env == {"MINE": "1", **trust_env()}, "no injection: no placeholder"


async def _first(
    events: AsyncIterator[Any], want: Callable[[Any], bool], timeout: float = 10
) -> Any:
    async with asyncio.timeout(timeout):
        async for item in events:
            if want(item):
                return item
    raise AssertionError("the watch ended")  # pragma: no cover


async def test_a_network_update_reaches_the_guards_channel(
    kube_apiserver: ControlPlane, namespace: str, store: KubeStore
) -> None:
    """The guard's watch, with its own token, sees status.network change: first the policy
    in force, then the update."""
    sandbox = await create_sandbox(store, namespace, f"sbx-{uuid.uuid4().hex[:8]}")
    name = sandbox.metadata.name
    await set_policy(store, namespace, name, ALLOW)
    token = await guard_token(kube_apiserver.settings, sandbox)
    events = watch_sandbox(as_token(kube_apiserver, token), namespace, name)
    try:
        first = await _first(events, lambda s: s is not None)
        assert policy_of(first) == ALLOW
        public = NetworkPolicy()
        await set_policy(store, namespace, name, public)
        await _first(events, lambda s: policy_of(s) == public)
    finally:
        await events.aclose()  # type: ignore[attr-defined]


async def test_another_sandboxs_guard_cannot_read_or_change_this_policy(
    kube_apiserver: ControlPlane, namespace: str, store: KubeStore
) -> None:
    """B's guard token: reads B (positive control), but get/watch/list of A, a write of A's
    status or spec, and a write of B's own status are all refused by the API server."""
    a = await create_sandbox(store, namespace, f"sbx-a-{uuid.uuid4().hex[:6]}")
    b = await create_sandbox(store, namespace, f"sbx-b-{uuid.uuid4().hex[:6]}")
    await set_policy(store, namespace, a.metadata.name, ALLOW)
    await guard_token(kube_apiserver.settings, a)
    token_b = await guard_token(kube_apiserver.settings, b)
    settings_b = as_token(kube_apiserver, token_b)
    kube_b = await KubeStore.connect(settings_b)
    try:
        assert (await kube_b.get("Sandbox", namespace, b.metadata.name)).metadata.name
        with pytest.raises(StoreForbidden):
            await kube_b.get("Sandbox", namespace, a.metadata.name)
        with pytest.raises(StoreForbidden):
            await kube_b.list("Sandbox", namespace)
        events = watch_sandbox(settings_b, namespace, a.metadata.name)
        with pytest.raises(StoreForbidden):
            await _first(events, lambda s: True)
        await events.aclose()  # type: ignore[attr-defined]
        current_a = await store.get("Sandbox", namespace, a.metadata.name)
        forged = {"network": {"policy": {"mode": "public"}}}
        for target in (current_a, await kube_b.get("Sandbox", namespace, b.metadata.name)):
            with pytest.raises(StoreForbidden):
                await kube_b.update_status(_with_status(target, forged))
        with pytest.raises(StoreForbidden):
            await kube_b.update(_with_spec(current_a, {"network": {"mode": "public"}}))
        assert (
            policy_of((await store.get("Sandbox", namespace, a.metadata.name)).to_dict()) == ALLOW
        )
        await asyncio.to_thread(_raw_refusals, kube_apiserver, token_b, namespace, a.metadata.name)
    finally:
        await kube_b.close()


def _with_status(resource: Resource, status: dict[str, Any]) -> Resource:
    import dataclasses

    return dataclasses.replace(resource, status={**resource.status, **status})


def _with_spec(resource: Resource, spec: dict[str, Any]) -> Resource:
    import dataclasses

    return dataclasses.replace(resource, spec={**resource.spec, **spec})


def _raw_refusals(plane: ControlPlane, token: str, namespace: str, name: str) -> None:
    """The same credential on the raw API: patch A, delete A, read Secrets, create a Pod."""
    with as_token(plane, token).api_client() as api_client:
        custom, core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
        attempts: list[Callable[[], object]] = [
            lambda: custom.patch_namespaced_custom_object_status(
                "sandpod.dev", "v1alpha1", namespace, "sandboxes", name, {"status": {}}
            ),
            lambda: custom.delete_namespaced_custom_object(
                "sandpod.dev", "v1alpha1", namespace, "sandboxes", name
            ),
            lambda: core.list_namespaced_secret(namespace),
            lambda: core.list_namespaced_pod(namespace),
        ]
        for attempt in attempts:
            with pytest.raises(ApiException) as refused:
                attempt()
            assert refused.value.status == 403


async def test_the_charts_lifecycle_role_can_grant_the_guard_its_access(
    kube_apiserver: ControlPlane, tmp_path: Path
) -> None:
    """With netguard.enabled, the chart's lifecycle rules let lifecycle create (and delete) a
    guard's ServiceAccount, Role and RoleBinding -- RBAC's escalation check passes because it
    holds what it grants; without it, it may not."""
    from k8s.chart import missing_helm, render
    from k8s.cluster import NS
    from k8s.test_rbac import grant

    if problem := missing_helm():
        pytest.fail(problem)
    for enabled in (True, False):
        values = {"netguard": {"enabled": enabled, "dns": ["10.96.0.10"]}}
        docs = render(tmp_path / str(enabled), values, release="g", namespace="sandpod")
        rules = next(
            d["rules"]
            for d in docs
            if d["kind"] in ("ClusterRole", "Role")
            and d["metadata"]["name"] == "g-sandpod-lifecycle"
        )
        role = f"guard-granter-{uuid.uuid4().hex[:6]}"
        token = await asyncio.to_thread(grant, kube_apiserver, role, rules)
        admin = await KubeStore.connect(kube_apiserver.settings)
        api = PodApi(as_token(kube_apiserver, token))
        try:
            sandbox = await create_sandbox(admin, NS, f"sbx-{uuid.uuid4().hex[:8]}")
            owner = {
                "apiVersion": "sandpod.dev/v1alpha1",
                "kind": "Sandbox",
                "name": sandbox.metadata.name,
                "uid": sandbox.metadata.uid,
            }
            manifests = guard_access_manifests(NS, sandbox.metadata.name, owner, {})
            if enabled:
                await api.apply_guard_access(manifests)
                await api.delete_guard_access(NS, guard_account_name(sandbox.metadata.name))
            else:
                with pytest.raises(StoreForbidden):
                    await api.apply_guard_access(manifests)
        finally:
            await api.close()
            await admin.close()


def _guard_env_is_what_the_guard_reads(
    guard: dict[str, Any], spec: dict[str, Any], namespace: str, name: str, tmp_path: Path
) -> None:
    """The guard container's env, as the kubelet gives it (the NATS URL from its Secret, the
    in-cluster API address), parses into the settings the Pod means: its sandbox, the sandbox
    container's uid, NATS, the cluster DNS, the token and ready file on its own mounts."""
    env = {e["name"]: e["value"] for e in guard["env"] if "value" in e}
    mounts = {m["name"]: m["mountPath"] for m in guard["volumeMounts"]}
    assert env["SANDPOD_KUBE_TOKEN_FILE"] == f"{mounts['netguard-token']}/token"
    assert env["SANDPOD_KUBE_CA_FILE"] == f"{mounts['netguard-token']}/ca.crt"
    ready = env["SANDPOD_GUARD_READY_FILE"]
    assert ready.startswith(mounts["netguard-run"] + "/")
    assert ready in guard["startupProbe"]["exec"]["command"][-1]
    token = tmp_path / "token"  # the kubelet's projected file, here
    token.write_text("t")
    env |= {
        "SANDPOD_KUBE_TOKEN_FILE": str(token),
        "SANDPOD_NATS_URL": "nats://nats.sandpod.svc.cluster.local:4222",  # its secretKeyRef
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
    }
    settings = GuardSettings.from_env(env)
    assert (settings.sandbox_id, settings.namespace) == (name, namespace)
    assert settings.sandbox_uid == spec["containers"][0]["securityContext"]["runAsUser"]
    assert settings.nats_cidrs == (ipaddress.IPv4Network("10.96.0.20/32"),)
    assert (settings.nats_host, settings.nats_port) == ("nats.sandpod.svc.cluster.local", 4222)
    assert settings.dns.upstreams == (("10.96.0.10", 53),)
    assert settings.kube.host == "https://10.0.0.1:443"


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root (netns, nftables)"
)
async def test_the_pods_own_guard_enforces_its_sandboxs_policy_live(
    kube_apiserver: ControlPlane, namespace: str, store: KubeStore, tmp_path: Path
) -> None:
    """End to end from the Pod spec: the driver makes the Pod, the fake kubelet runs its
    guard container (its env, its ServiceAccount's token) in a netns of the Pod's own and
    starts the rest only once the guard is ready; as the sandbox container's uid an allowed
    name resolves, a denied one does not, an IP literal goes nowhere; an update of the
    Sandbox's status.network reaches the guard and opens the denied name."""
    await asyncio.to_thread(_nats_secret, kube_apiserver, namespace)
    sandbox = await create_sandbox(store, namespace, f"sbx-{uuid.uuid4().hex[:8]}")
    name = sandbox.metadata.name
    await set_policy(store, namespace, name, ALLOW_TEST)
    template = SandboxTemplateSpec(network=ALLOW_TEST)

    async def templates(_namespace: str, _name: str | None) -> SandboxTemplateSpec:
        return template

    api = PodApi(kube_apiserver.settings)
    driver = PodDriver(
        api, SETTINGS, installation="ig", ready_timeout=60, namespace=namespace, templates=templates
    )
    records = [("allowed.test", "11.9.0.1"), ("denied.test", "11.9.0.2")]
    guards = PodGuards(
        kube_apiserver.settings, kube_apiserver.port, kube_apiserver.ca_file, tmp_path, records
    )
    kubelet = FakeKubelet(kube_apiserver.settings, namespace, tmp_path / "kubelet")
    kubelet.run_execd = False  # execd would run on the host, outside the Pod's netns
    kubelet.guard_runner = guards
    uid = SETTINGS.run_as_user
    try:
        async with kubelet:
            await driver.ensure(
                name, SandboxSpec(), template, Owner(namespace, sandbox.metadata.uid)
            )
            pod = guards.netns[name]

            async def resolves(host: str) -> bool:
                return (await pod.as_sandbox(uid, "getent", "ahostsv4", host))[0] == 0

            assert await resolves("allowed.test") and not await resolves("denied.test")
            auth = guards.auth[name]
            assert auth.asked_for("denied.test") == 0
            code, out = await pod.as_sandbox(uid, "/usr/bin/python3", "-c", PROBE, "11.9.0.2:80")
            assert code == 0 and "refused:" in out, out
            await set_policy(
                store,
                namespace,
                name,
                NetworkPolicy.from_dict({"mode": "allowlist", "allow": ["*.test"]}),
            )
            async with asyncio.timeout(15):
                while not await resolves("denied.test"):
                    pass
            await driver.destroy(name)
    finally:
        await guards.close()
        await api.close()


ALLOW_TEST = NetworkPolicy.from_dict({"mode": "allowlist", "allow": ["allowed.test"]})
PROBE = r"""
import socket, sys
h, p = sys.argv[1].rsplit(":", 1)
try:
    socket.create_connection((h, int(p)), timeout=1.5).close()
    print("reached")
except OSError as e:
    print("refused:" + type(e).__name__)
"""


def _nats_secret(plane: ControlPlane, namespace: str) -> None:
    """The NATS URL Secret the Pod's env names (its secretKeyRef, resolved by the kubelet)."""
    with plane.settings.api_client() as api_client:
        client.CoreV1Api(api_client).create_namespaced_secret(
            namespace,
            client.V1Secret(
                metadata=client.V1ObjectMeta(name="sandpod-nats"),
                string_data={"url": "nats://10.96.0.20:4222"},
            ),
        )
