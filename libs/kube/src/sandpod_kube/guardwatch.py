"""The network guard's one read of the control plane: its own Sandbox object, watched.

The guard (``sandpod_lifecycle.network.podguard``) runs in the sandbox's Pod with a credential
of its own: the Sandbox's guard ServiceAccount (:mod:`sandpod_kube.guardpod`), whose Role
allows ``get``/``list``/``watch`` on ``sandboxes`` with ``resourceNames: [<its sandbox>]`` and
nothing else. The API server authorises a list or watch by name only when the request carries
the field selector ``metadata.name=<name>``, so that is how this module asks:

    API server --watch sandboxes?fieldSelector=metadata.name=<name>--> WatchStream (thread,
        bounded queue, resumes from the last resourceVersion) --> raw Sandbox dicts

A DELETED event yields None. Errors are the contract's typed store errors (``StoreForbidden``
for a credential that may not read the object).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

from kubernetes import client

from sandpod_kube.config import KubeSettings
from sandpod_kube.kinds import resolve
from sandpod_kube.watch import WatchStream

__all__ = ["watch_sandbox"]


async def watch_sandbox(
    settings: KubeSettings, namespace: str, name: str
) -> AsyncIterator[Mapping[str, Any] | None]:
    """The Sandbox ``namespace/name`` now (if it exists) and after every change; None once it
    is deleted. Runs until the caller stops iterating.

    Raises:
        StoreError: the API server refused (``StoreForbidden``) or is unreachable for good.
    """
    info = resolve("Sandbox")
    api_client = settings.api_client()
    api = client.CustomObjectsApi(api_client)
    timeouts = (settings.request_timeout, settings.watch_timeout + 30.0)

    def open_watch(version: str | None) -> Any:
        return api.list_namespaced_custom_object(
            info.group,
            info.version,
            namespace,
            info.plural,
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=version,
            field_selector=f"metadata.name={name}",
            timeout_seconds=settings.watch_timeout,
            _preload_content=False,
            _request_timeout=timeouts,
        )

    stream = WatchStream(open_watch, None, "Sandbox")
    try:
        async for event in stream:
            yield None if event["type"] == "DELETED" else dict(event["object"])
    finally:
        await stream.close()
        with contextlib.suppress(Exception):
            api_client.close()  # type: ignore[no-untyped-call]  # the client leaves close untyped
