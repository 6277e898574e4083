"""Sandpod's Kubernetes seam: the only package that imports ``kubernetes``.

- :class:`KubeStore` -- the ``Store`` interface over the ``sandpod.dev`` CRDs (cluster mode).
- :class:`KubeSettings` -- how to reach an API server (kubeconfig, in-cluster, explicit).
- :mod:`sandpod_kube.admin` -- installing CRDs, namespaces.
"""

from sandpod_kube.admin import apply_crds, delete_all, ensure_namespace
from sandpod_kube.config import KubeSettings
from sandpod_kube.errors import StoreForbidden
from sandpod_kube.kinds import KINDS, KindInfo
from sandpod_kube.store import KubeStore

__all__ = [
    "KINDS",
    "KindInfo",
    "KubeSettings",
    "KubeStore",
    "StoreForbidden",
    "apply_crds",
    "delete_all",
    "ensure_namespace",
]
