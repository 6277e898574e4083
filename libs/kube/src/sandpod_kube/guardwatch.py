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

:func:`read_secret_keys` is its other read: the Kubernetes Secrets its policy's header
injections name (``inject[].secret: <secret>/<key>``), which its Role allows by name only
(``guardpod.guard_access_manifests(secrets=...)``); the values stay in the guard's memory.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from sandpod_contract.errors import StoreError
from sandpod_kube.config import KubeSettings
from sandpod_kube.errors import from_api_error
from sandpod_kube.kinds import resolve
from sandpod_kube.watch import WatchStream

__all__ = ["read_secret_keys", "watch_sandbox"]


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


async def read_secret_keys(settings: KubeSettings, namespace: str, name: str) -> dict[str, str]:
    """The keys of Secret ``namespace/name`` and their values (UTF-8 text; a key whose value
    is not text is left out).

    Raises:
        StoreError: refused (``StoreForbidden``: the Role does not name it), no such Secret
            (``ResourceNotFound``), or the API server is unreachable.
    """

    def read() -> dict[str, str]:
        with settings.api_client() as api_client:
            try:
                secret = client.CoreV1Api(api_client).read_namespaced_secret(
                    name, namespace, _request_timeout=settings.request_timeout
                )
            except ApiException as exc:
                what = f"get Secret {namespace}/{name}"
                raise from_api_error(exc.status, exc.body, what, "Secret", name) from exc
            except (HTTPError, OSError) as exc:
                raise StoreError(f"get Secret {name}: {exc}") from exc
        out = {}
        for key, raw in (secret.data or {}).items():
            with contextlib.suppress(binascii.Error, UnicodeDecodeError):
                out[str(key)] = base64.b64decode(raw, validate=True).decode("utf-8")
        return out

    return await asyncio.to_thread(read)
