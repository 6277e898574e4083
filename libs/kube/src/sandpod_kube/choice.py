"""Which resource store a control-plane service runs on: ``SANDPOD_STORE=kv|kube``.

Lifecycle and pool make the same choice the same way: the JetStream KV bucket of the
installation (embedded mode) or the CRDs on an API server (cluster mode). This module is the one
place that reads the variable and opens the store; ``kubernetes`` is imported only for ``kube``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any

from sandpod_bus import Bus
from sandpod_kube.config import KubeSettings, LeaderSettings
from sandpod_store import KvStore, Store

if TYPE_CHECKING:
    from sandpod_kube.leader import ElectedLeases

__all__ = ["Election", "elect", "open_store", "store_settings"]

# (the per-object lease seam, the election loop to run, how to give the Lease up)
Election = tuple[
    "ElectedLeases",
    Callable[[], Coroutine[Any, Any, None]],
    Callable[[], Awaitable[None]],
]

STORES = ("kv", "kube")


def store_settings(env: Mapping[str, str]) -> KubeSettings | None:
    """``SANDPOD_STORE``: None for ``kv`` (the default), the API server's settings for ``kube``.

    Raises:
        ValueError: an unknown store, or unusable ``SANDPOD_KUBE_*`` settings.
    """
    store = env.get("SANDPOD_STORE", "kv") or "kv"
    if store not in STORES:
        raise ValueError(f"SANDPOD_STORE={store!r}: use 'kv' (JetStream KV) or 'kube' (CRDs)")
    return KubeSettings.from_env(env) if store == "kube" else None


async def open_store(
    bus: Bus, bucket: str, kube: KubeSettings | None
) -> tuple[Store, Callable[[], Awaitable[None]] | None]:
    """The store, and how to close it (None: nothing to close)."""
    if kube is None:
        return await KvStore.open(bus, bucket=bucket), None
    from sandpod_kube.store import KubeStore

    store = await KubeStore.connect(kube)
    return store, store.close


def elect(
    kube: KubeSettings,
    leader: LeaderSettings,
    *,
    prefix: str,
    service: str,
    identity: str,
    on_change: Callable[[bool], None],
) -> Election:
    """Leader election of ``service`` (lifecycle, pool) on its Lease ``<prefix>-<service>``:
    what lifecycle and pool use instead of per-object KV leases in cluster mode."""
    from sandpod_kube.leader import ElectedLeases, LeaderElector, lease_name

    elector = LeaderElector(
        kube, leader, name=lease_name(prefix, service), identity=identity, on_change=on_change
    )
    return ElectedLeases(elector), elector.run, elector.close
