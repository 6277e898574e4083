"""`helm install deploy/helm/sandpod` on the real node, NATS from the chart itself, and a sandbox
made through it: the services run as Pods from the project's images, the lifecycle Pod makes the
sandbox's Pod, and the SDK on the host execs in it over the chart's NATS. Uninstall leaves
nothing of the release behind (the CRDs stay, as Helm keeps ``crds/`` by design).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from k8s.chart import helm_binary, missing_helm, without_dependencies
from k8s.realnode import IMAGE_PREFIX, RealNode, image
from sandpod import AsyncSandbox
from sandpod.errors import SandboxError
from sandpod_kube import ensure_namespace

pytestmark = pytest.mark.timeout(600)

RELEASE = "sp"
INSTANCE = "app.kubernetes.io/instance"


def _helm(node: RealNode, *args: str, timeout: float = 300) -> str:
    done = subprocess.run(
        [str(helm_binary()), "--kubeconfig", str(node.dir / "admin.kubeconfig"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)}: {done.stdout}{done.stderr}")
    return done.stdout


def _values(ns: str) -> dict[str, Any]:
    return {
        "image": {"repository": IMAGE_PREFIX, "pullPolicy": "IfNotPresent"},
        "nats": {"enabled": False},
        "bundledNats": {"enabled": True, "persistence": {"enabled": False}},
        "sandboxes": {"defaultImage": image("sandpod-base")},
        "lifecycle": {"replicas": 1, "pdb": {"enabled": False}},
        "pool": {"replicas": 1, "pdb": {"enabled": False}},
        "gateway": {"replicas": 1, "hpa": {"enabled": False}, "pdb": {"enabled": False}},
        "logLevel": "debug",
    }


def _objects_of_release(api: client.ApiClient, ns: str) -> list[str]:
    """Everything labelled with the release, namespaced (in ``ns``) and cluster-wide."""
    selector = f"{INSTANCE}={RELEASE}"
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    rbac = client.RbacAuthorizationV1Api(api)
    admission = client.AdmissionregistrationV1Api(api)
    found: list[str] = []
    for kind, listing in (
        ("Pod", lambda: core.list_namespaced_pod(ns, label_selector=selector)),
        ("Secret", lambda: core.list_namespaced_secret(ns, label_selector=selector)),
        ("Service", lambda: core.list_namespaced_service(ns, label_selector=selector)),
        (
            "ServiceAccount",
            lambda: core.list_namespaced_service_account(ns, label_selector=selector),
        ),
        ("Deployment", lambda: apps.list_namespaced_deployment(ns, label_selector=selector)),
        ("StatefulSet", lambda: apps.list_namespaced_stateful_set(ns, label_selector=selector)),
        ("ClusterRole", lambda: rbac.list_cluster_role(label_selector=selector)),
        ("ClusterRoleBinding", lambda: rbac.list_cluster_role_binding(label_selector=selector)),
        (
            "ValidatingAdmissionPolicy",
            lambda: admission.list_validating_admission_policy(label_selector=selector),
        ),
    ):
        found += [f"{kind}/{o['metadata']['name']}" for o in listing().to_dict()["items"]]
    return found


def _rbac_holds(node: RealNode, ns: str) -> None:
    """The installed chart's lifecycle, as its own ServiceAccount against the real API server:
    what it needs is allowed, what it must not do is Forbidden (Secrets are written, never read;
    no cluster-wide escalation)."""
    who = f"system:serviceaccount:{ns}:{RELEASE}-sandpod-lifecycle"

    def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["kubectl", "--kubeconfig", str(node.dir / "admin.kubeconfig"), "--as", who, *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    assert kubectl("get", "pods", "-n", "default").returncode == 0
    assert kubectl("get", "sandboxes.sandpod.dev", "-n", "default").returncode == 0
    for denied in (
        ("get", "secrets", "-n", "default"),
        ("delete", "node", "sandpod-node", "--dry-run=server"),
        ("create", "clusterrolebinding", "x", "--clusterrole=cluster-admin", f"--user={who}"),
    ):
        done = kubectl(*denied)
        assert done.returncode != 0 and "forbidden" in done.stderr.lower(), (denied, done)


async def _create(nats_url: str) -> AsyncSandbox:
    """A sandbox through the chart's lifecycle, once it answers (helm --wait sees its Pod
    Running; its NATS subscriptions follow a moment later)."""
    async with asyncio.timeout(120):
        while True:
            try:
                return await AsyncSandbox.create(wait=180, nats_url=nats_url, prefix="sandpod")
            except SandboxError as exc:
                if "no lifecycle service answers" not in exc.message:
                    raise
                await asyncio.sleep(0.2)


def _logs(core: client.CoreV1Api, ns: str) -> str:
    """The last lines of every container of the release's Pods (for a failure's message)."""
    out = []
    for pod in core.list_namespaced_pod(ns).to_dict()["items"]:
        name = pod["metadata"]["name"]
        for c in pod["spec"]["containers"]:
            try:
                text = core.read_namespaced_pod_log(name, ns, container=c["name"], tail_lines=25)
            except client.ApiException as exc:
                text = f"(no log: {exc.status})"
            out.append(f"--- {name}/{c['name']} ({pod['status']['phase']})\n{text}")
    return "\n".join(out)


async def test_the_chart_installs_runs_a_sandbox_and_uninstalls_cleanly(
    real_node: RealNode, tmp_path: Path
) -> None:
    if problem := missing_helm():
        pytest.fail(problem)
    ns = f"sandpod-{uuid.uuid4().hex[:6]}"
    await asyncio.to_thread(ensure_namespace, real_node.settings, ns)
    # The chart owns default/sandpod-nats; the host-process installations of the other tests
    # (node_cluster) wrote one of their own, which Helm refuses to adopt. It is theirs to remake.
    with real_node.settings.api_client() as api, contextlib.suppress(client.ApiException):
        client.CoreV1Api(api).delete_namespaced_secret("sandpod-nats", "default")
    chart = without_dependencies(tmp_path)
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(_values(ns)))
    await asyncio.to_thread(
        _helm,
        real_node,
        "install",
        RELEASE,
        str(chart),
        "-n",
        ns,
        "-f",
        str(values),
        "--wait",
        "--timeout",
        "5m",
    )
    await asyncio.to_thread(_rbac_holds, real_node, ns)
    sbx: AsyncSandbox | None = None
    with real_node.settings.api_client() as api:
        core = client.CoreV1Api(api)
        nats_pod = core.list_namespaced_pod(
            ns, label_selector=f"{INSTANCE}={RELEASE},app.kubernetes.io/component=nats"
        ).to_dict()["items"][0]
        nats_url = f"nats://{nats_pod['status']['pod_ip']}:4222"  # the host routes to Pod IPs
        try:
            try:
                sbx = await _create(nats_url)
            except Exception as exc:
                raise AssertionError(f"{exc}\n{_logs(core, ns)}") from exc
            r = await sbx.exec("cat /proc/1/cgroup | grep -c kubepods; id -u")
            assert r.exit_code == 0 and r.stdout.split()[1] != "0", r
            await sbx.fs.write("/workspace/hello", b"through the chart")
            assert await sbx.fs.read("/workspace/hello") == b"through the chart"
            sandbox_pod = core.read_namespaced_pod(
                sbx.id, "default"
            ).to_dict()  # the API's namespace
            assert sandbox_pod["spec"]["containers"][0]["image"] == image("sandpod-base")
            await sbx.kill()
        finally:
            if sbx is not None:
                await sbx.close()
        await asyncio.to_thread(_helm, real_node, "uninstall", RELEASE, "-n", ns, "--wait")
        # Deleting a Deployment leaves its Pods to the garbage collector and their grace period.
        async with asyncio.timeout(120):
            while left := await asyncio.to_thread(_objects_of_release, api, ns):
                await asyncio.sleep(0.5)
        assert left == [], left
        pods = core.list_namespaced_pod(ns).to_dict()["items"]
        assert [
            p["metadata"]["name"] for p in pods if not p["metadata"]["deletion_timestamp"]
        ] == []
