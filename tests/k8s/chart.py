"""The Helm chart under test: the helm binary, rendering, and plain REST calls to the API server.

``helm`` comes from ``deploy/envtest/build-helm.sh`` (built with Go from the module proxy, cached
next to the envtest binaries); without it the tests fail and say what to run, never skip.

Rendering: the chart declares the official NATS chart as a dependency, which cannot be fetched
here (no chart repository is reachable) and Helm refuses to render a chart whose declared
dependency is missing from ``charts/`` -- even when its condition is off. So :func:`render` copies
the chart and drops the ``dependencies`` list from the copy: every object of *our* templates is
rendered (``nats.enabled`` still switches what they point at); the NATS subchart's own objects
are not part of this validation.

REST: objects are sent to the real API server as JSON over HTTPS (httpx), kubectl-free; the
resource path of each kind comes from the server's own discovery documents.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import ssl
import subprocess
import uuid
from pathlib import Path
from typing import Any

import httpx
import yaml

from k8s.envtest import KUBE_VERSION, REPO, ControlPlane

CHART = REPO / "deploy" / "helm" / "sandpod"
BUILD_SCRIPT = REPO / "deploy" / "envtest" / "build-helm.sh"
HELM_VERSION = (REPO / "deploy" / "helm" / "helm-version").read_text().strip()


def unique(prefix: str) -> str:
    """A name no other test uses (objects stay: there is no controller-manager to collect them)."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def helm_binary() -> Path:
    """Where build-helm.sh put (or will put) helm for the pinned version."""
    if explicit := os.environ.get("SANDPOD_HELM_BIN"):
        return Path(explicit)
    root = os.environ.get("SANDPOD_ENVTEST_DIR") or str(Path.home() / ".cache/sandpod/envtest")
    return Path(root) / f"helm-{HELM_VERSION}" / "bin" / "helm"


def missing_helm() -> str | None:
    """None when helm is there, else what to run to build it."""
    if os.access(helm_binary(), os.X_OK):
        return None
    return (
        f"{helm_binary()} not found: build it with `{BUILD_SCRIPT.relative_to(REPO)}` "
        "(Go from the module proxy, 2-8 min once, then cached; .ci/run does this)"
    )


def without_dependencies(workdir: Path) -> Path:
    """A copy of the chart in ``workdir`` whose Chart.yaml declares no dependencies."""
    chart = workdir / "sandpod"
    if not chart.exists():
        shutil.copytree(CHART, chart)
        meta = yaml.safe_load((chart / "Chart.yaml").read_text())
        meta.pop("dependencies", None)
        (chart / "Chart.yaml").write_text(yaml.safe_dump(meta))
    return chart


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    """Run helm with ``args``; the caller checks ``returncode``."""
    return subprocess.run(
        [str(helm_binary()), *args], capture_output=True, text=True, timeout=60, check=False
    )


def render(
    workdir: Path, values: dict[str, Any], *, release: str, namespace: str
) -> list[dict[str, Any]]:
    """``helm template --include-crds`` of the chart (dependency list dropped, see above).

    Raises:
        subprocess.CalledProcessError: helm refused the chart or the values (stderr attached).
    """
    chart = without_dependencies(workdir)
    values_file = workdir / f"values-{release}.yaml"
    values_file.write_text(yaml.safe_dump(values))
    out = subprocess.run(
        [
            str(helm_binary()),
            "template",
            release,
            str(chart),
            "--namespace",
            namespace,
            "--include-crds",
            "--kube-version",
            KUBE_VERSION,
            "--values",
            str(values_file),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


@dataclasses.dataclass(frozen=True)
class ApiResource:
    plural: str
    namespaced: bool


class Rest:
    """Blocking JSON calls to the API server with one credential (admin cert or a bearer token)."""

    def __init__(self, plane: ControlPlane, token: str | None = None) -> None:
        context = ssl.create_default_context(cafile=str(plane.ca_file))
        headers = {}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        else:
            context.load_cert_chain(*map(str, plane.admin_cert))
        self.http = httpx.Client(base_url=plane.url, verify=context, headers=headers, timeout=30)
        self._resources: dict[tuple[str, str], ApiResource] = {}

    def close(self) -> None:
        self.http.close()

    def resource(self, api_version: str, kind: str) -> ApiResource | None:
        """The plural and scope of ``kind`` from the server's discovery (None: not served)."""
        key = (api_version, kind)
        if key not in self._resources:
            base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            reply = self.http.get(base)
            if reply.status_code == 404:
                return None
            reply.raise_for_status()
            for item in reply.json()["resources"]:
                if "/" not in item["name"]:
                    found = ApiResource(item["name"], item["namespaced"])
                    self._resources[(api_version, item["kind"])] = found
        return self._resources.get(key)

    def path(self, obj: dict[str, Any], namespace: str | None = None) -> str:
        """The collection URL path of ``obj`` (its own namespace, else ``namespace``)."""
        res = self.resource(obj["apiVersion"], obj["kind"])
        if res is None:
            raise LookupError(f"{obj['apiVersion']} {obj['kind']} is not served")
        base = "/api/v1" if obj["apiVersion"] == "v1" else f"/apis/{obj['apiVersion']}"
        if res.namespaced:
            ns = obj["metadata"].get("namespace") or namespace
            return f"{base}/namespaces/{ns}/{res.plural}"
        return f"{base}/{res.plural}"

    def create(self, obj: dict[str, Any], *, dry_run: bool = False) -> httpx.Response:
        """POST ``obj`` with strict field validation (unknown or duplicate fields are errors)."""
        params = {"fieldValidation": "Strict"}
        if dry_run:
            params["dryRun"] = "All"
        return self.http.post(self.path(obj), json=obj, params=params)

    def apply(self, obj: dict[str, Any], *, dry_run: bool = False) -> httpx.Response:
        """Server-side apply ``obj`` (field manager ``sandpod-test``), strict validation."""
        params = {"fieldManager": "sandpod-test", "force": "true", "fieldValidation": "Strict"}
        if dry_run:
            params["dryRun"] = "All"
        return self.http.patch(
            f"{self.path(obj)}/{obj['metadata']['name']}",
            content=yaml.safe_dump(obj),
            params=params,
            headers={"Content-Type": "application/apply-patch+yaml"},
        )
