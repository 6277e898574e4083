"""Cluster set-up the store relies on: installing the CRDs, namespaces, clearing a kind.

Used by installers (``deploy/``), by the test control plane, and by operators' tooling. CRDs are
installed by server-side apply (field manager ``sandpod``), so applying the same manifests twice is
a no-op and a newer manifest updates the installed one. A CRD is usable only once the API server
reports it ``Established``; :func:`apply_crds` waits for that, polling with a deadline.

These are one-off set-up steps, so they are plain blocking functions (each opens and closes its
own client); async callers run them with ``asyncio.to_thread``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandpod_contract.errors import StoreError
from sandpod_kube.config import KubeSettings
from sandpod_kube.errors import from_api_error
from sandpod_kube.kinds import resolve

__all__ = ["apply_crds", "delete_all", "ensure_namespace"]

FIELD_MANAGER = "sandpod"


def apply_crds(
    settings: KubeSettings, manifests: Iterable[Mapping[str, Any]], timeout: float = 30.0
) -> list[str]:
    """Server-side apply each CRD manifest (other documents are skipped); wait until Established.

    Returns:
        The names of the CRDs applied.

    Raises:
        ResourceInvalid: the API server rejected a manifest.
        StoreError: a CRD did not become Established within ``timeout`` seconds.
    """
    docs = [m for m in manifests if m and m.get("kind") == "CustomResourceDefinition"]
    with settings.api_client() as api_client:
        api = client.ApiextensionsV1Api(api_client)
        names = []
        for manifest in docs:
            name = str(manifest["metadata"]["name"])
            try:
                api.patch_custom_resource_definition(
                    name,
                    dict(manifest),
                    field_manager=FIELD_MANAGER,
                    force=True,
                    _content_type="application/apply-patch+yaml",
                )
            except ApiException as exc:
                raise from_api_error(
                    exc.status, exc.body, f"apply CRD {name}", "CustomResourceDefinition", name
                ) from exc
            names.append(name)
        deadline = time.monotonic() + timeout
        pending = set(names)
        while pending:
            for name in sorted(pending):
                crd = api.read_custom_resource_definition_status(name)
                conditions = (crd.status.conditions if crd.status else None) or []
                if any(c.type == "Established" and c.status == "True" for c in conditions):
                    pending.discard(name)
            if pending and time.monotonic() > deadline:
                raise StoreError(f"CRDs not established after {timeout}s: {sorted(pending)}")
            if pending:
                time.sleep(0.05)
        return names


def ensure_namespace(settings: KubeSettings, name: str) -> None:
    """Create namespace ``name`` unless it exists."""
    with settings.api_client() as api_client:
        try:
            client.CoreV1Api(api_client).create_namespace(
                client.V1Namespace(metadata=client.V1ObjectMeta(name=name))
            )
        except ApiException as exc:
            if exc.status != 409:  # 409: it exists, which is what we want
                raise from_api_error(
                    exc.status, exc.body, f"create namespace {name}", "Namespace", name
                ) from exc


def delete_all(settings: KubeSettings, kind: str, namespaces: Iterable[str] | None = None) -> None:
    """Delete every object of ``kind`` in ``namespaces`` (None: wherever there are any).

    For resetting state between tests or tearing an installation down; blocking.
    """
    info = resolve(kind)
    with settings.api_client() as api_client:
        api = client.CustomObjectsApi(api_client)
        try:
            if namespaces is None:  # deletecollection is per namespace: find the namespaces
                listed = api.list_cluster_custom_object(info.group, info.version, info.plural)
                items = listed.get("items") or [] if isinstance(listed, dict) else []
                namespaces = {str(item["metadata"]["namespace"]) for item in items}
            for namespace in sorted(namespaces):
                api.delete_collection_namespaced_custom_object(
                    info.group, info.version, namespace, info.plural
                )
        except ApiException as exc:
            raise from_api_error(exc.status, exc.body, f"delete all {kind}", kind) from exc
