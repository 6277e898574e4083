"""``kubectl get sandboxes`` shows the CRD's printer columns, filled from the objects.

kubectl renders what the API server returns for ``Accept: application/json;as=Table;v=v1;
g=meta.k8s.io`` (server-side printing): the columns come from the CRD's
``additionalPrinterColumns``, the cells from their JSONPaths. The first test asks the real API
server for that Table directly; the second runs kubectl itself when it is installed.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import subprocess
import urllib.request
from typing import Any

import pytest

from k8s.envtest import ControlPlane
from sandpod_kube import KubeStore
from sandpod_store import ObjectMeta, Resource

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


async def running_sandbox(kube: KubeStore, namespace: str, name: str) -> Resource:
    """A Sandbox with the status the lifecycle gives a ready one."""
    created = await kube.create(
        Resource(
            api_version="sandpod.dev/v1alpha1",
            kind="Sandbox",
            metadata=ObjectMeta(name=name, namespace=namespace),
            spec={"templateRef": {"name": "python"}, "shutdownTime": "2099-01-01T00:00:00Z"},
        )
    )
    status = {
        "phase": "Running",
        "shutdownTime": "2099-01-01T00:00:00Z",
        "lastActivityTime": "2026-01-01T00:00:00Z",
        "network": {
            "policy": {"mode": "allowlist", "allow": ["10.0.0.0/8:443"], "deny": []},
            "source": "template",
            "enforced": True,
            "reason": "",
            "observedGeneration": 1,
        },
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "ExecdReady",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
    }
    return await kube.update_status(
        Resource(
            api_version=created.api_version,
            kind=created.kind,
            metadata=created.metadata,
            spec=created.spec,
            status=status,
        )
    )


def get_table(plane: ControlPlane, path: str) -> dict[str, Any]:
    context = ssl.create_default_context(cafile=str(plane.ca_file))
    context.load_cert_chain(*map(str, plane.admin_cert))
    request = urllib.request.Request(f"{plane.url}{path}", headers={"Accept": TABLE})
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        result: dict[str, Any] = json.load(response)
        return result


async def test_the_api_servers_table_for_sandboxes_has_the_printer_columns_with_values(
    kube_apiserver: ControlPlane, kube: KubeStore, namespace: str
) -> None:
    """The Table the API server renders for sandboxes (what kubectl prints) has the CRD's
    columns, and a running sandbox's row shows its phase, readiness and template."""
    await running_sandbox(kube, namespace, "sbx-table")
    path = f"/apis/sandpod.dev/v1alpha1/namespaces/{namespace}/sandboxes"
    table = await asyncio.to_thread(get_table, kube_apiserver, path)
    assert table["kind"] == "Table"
    columns = [(c["name"], c["priority"]) for c in table["columnDefinitions"]]
    assert columns == [
        ("Name", 0),
        ("Phase", 0),
        ("Ready", 0),
        ("Reason", 0),
        ("Template", 0),
        ("Network", 0),
        ("Enforced", 1),
        ("Expires", 0),
        ("Last-Activity", 1),
        ("Age", 0),
    ]
    (row,) = table["rows"]
    name, phase, ready, reason, template, network, enforced, expires, last_activity, age = row[
        "cells"
    ]
    assert (name, phase, ready, reason, template, network, enforced) == (
        "sbx-table",
        "Running",
        "True",
        "ExecdReady",
        "python",
        "allowlist",
        True,
    )
    assert expires and last_activity and age  # dates: rendered as ages by the server
    assert row["object"]["metadata"]["name"] == "sbx-table"  # PartialObjectMetadata


async def test_kubectl_get_sandboxes_prints_the_columns(
    kube_apiserver: ControlPlane, kube: KubeStore, namespace: str
) -> None:
    """``kubectl get sbx -o wide`` (the short name) prints the columns and the row's values."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip(
            "kubectl is not installed (Debian: kubernetes-client); the Table test covers it"
        )
    await running_sandbox(kube, namespace, "sbx-kubectl")
    out = await asyncio.to_thread(
        subprocess.run,
        [
            kubectl,
            "--kubeconfig",
            str(kube_apiserver.kubeconfig()),
            "-n",
            namespace,
            "get",
            "sbx",
            "-o",
            "wide",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    header, row = out.stdout.splitlines()
    assert header.split() == [
        "NAME",
        "PHASE",
        "READY",
        "REASON",
        "TEMPLATE",
        "NETWORK",
        "ENFORCED",
        "EXPIRES",
        "LAST-ACTIVITY",
        "AGE",
    ]
    assert row.split()[:7] == [
        "sbx-kubectl",
        "Running",
        "True",
        "ExecdReady",
        "python",
        "allowlist",
        "true",
    ]
