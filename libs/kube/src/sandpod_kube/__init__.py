"""Sandpod's Kubernetes seam: the only package that imports ``kubernetes``.

- :class:`KubeStore` -- the ``Store`` interface over the ``sandpod.dev`` CRDs (cluster mode).
- :class:`KubeSettings` -- how to reach an API server (kubeconfig, in-cluster, explicit).
- :class:`PodApi` -- the Pods, NetworkPolicies and Secrets the Pod runtime needs.
- :class:`LeaderElector` / :class:`ElectedLeases` -- leader election on a Lease (Kubernetes mode's
  replacement for per-object KV leases), timed by :class:`LeaderSettings`.
- :mod:`sandpod_kube.admin` -- installing CRDs, namespaces.
- :mod:`sandpod_kube.guardpod` / :mod:`sandpod_kube.guardwatch` -- the network guard in a sandbox
  Pod: its container and per-Sandbox read-only access; its watch of its own Sandbox.

Names are resolved lazily (PEP 562): ``from sandpod_kube import KubeSettings`` does not import the
``kubernetes`` client (~1 s), so a service in KV mode never pays for it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandpod_kube.admin import apply_crds, delete_all, ensure_namespace
    from sandpod_kube.choice import elect, open_store, store_settings
    from sandpod_kube.config import KubeSettings, LeaderSettings
    from sandpod_kube.errors import StoreForbidden
    from sandpod_kube.kinds import KINDS, KindInfo
    from sandpod_kube.leader import ElectedLeases, LeaderElector, lease_name
    from sandpod_kube.pods import PodApi
    from sandpod_kube.store import KubeStore

__all__ = [
    "KINDS",
    "ElectedLeases",
    "KindInfo",
    "KubeSettings",
    "KubeStore",
    "LeaderElector",
    "LeaderSettings",
    "PodApi",
    "StoreForbidden",
    "apply_crds",
    "delete_all",
    "elect",
    "ensure_namespace",
    "lease_name",
    "open_store",
    "store_settings",
]

_WHERE = {
    "KINDS": "kinds",
    "KindInfo": "kinds",
    "KubeSettings": "config",
    "KubeStore": "store",
    "PodApi": "pods",
    "StoreForbidden": "errors",
    "apply_crds": "admin",
    "delete_all": "admin",
    "ensure_namespace": "admin",
    "open_store": "choice",
    "store_settings": "choice",
    "elect": "choice",
    "ElectedLeases": "leader",
    "LeaderElector": "leader",
    "LeaderSettings": "config",
    "lease_name": "leader",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'sandpod_kube' has no attribute {name!r}")
    return getattr(importlib.import_module(f"sandpod_kube.{module}"), name)
