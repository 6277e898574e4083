"""The network guard's refusal report: a ConfigMap per Sandbox the guard writes and lifecycle
reads, so refusals inside a Pod become the sandbox's ``network.denied`` events.

Why this channel: the guard holds no NATS credential (the sandbox's own one reaches only
``sandpod.sbx.<id>.>`` and ``_INBOX.>``, which lifecycle does not read events from, and it sits
in the sandbox container's reach), but it holds a Kubernetes credential of its own. Its Role
(``guardpod.guard_access_manifests``) lets it get and patch exactly one ConfigMap,
``<sandbox>-netguard``, which lifecycle creates (owned by the Sandbox, labelled
:data:`~sandpod_kube.guardpod.REPORT_LABEL`). Lifecycle takes the sandbox from the ConfigMap's
*name*, which no patch can change, so a guard (or whoever stole its token) can report for its
own sandbox only; the sandbox container has no token at all.

    guard --patch data.report (JSON, at most once a second)--> ConfigMap <sandbox>-netguard
    lifecycle --watch configmaps -l sandpod.dev/netguard-report--> (namespace, sandbox, report)

Pure transport: the report's content is ``podguard/report.py``'s versioned dataclass.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from sandpod_contract.errors import StoreError
from sandpod_kube.config import KubeSettings
from sandpod_kube.errors import from_api_error
from sandpod_kube.guardpod import REPORT_LABEL, guard_account_name
from sandpod_kube.watch import WatchStream

__all__ = ["REPORT_KEY", "watch_reports", "write_report"]

REPORT_KEY = "report"
WRITE_TIMEOUT = 5.0  # seconds: a stuck write must not hold the guard's exit for long
_SUFFIX = guard_account_name("")  # "-netguard"


async def write_report(settings: KubeSettings, namespace: str, sandbox: str, text: str) -> None:
    """Replace the report of ``sandbox`` with ``text`` (a merge patch of one key).

    Raises:
        StoreError: refused (``StoreForbidden``: not this guard's ConfigMap), missing, or the
            API server is unreachable.
    """
    name = guard_account_name(sandbox)

    def patch() -> None:
        with settings.api_client() as api_client:
            try:
                client.CoreV1Api(api_client).patch_namespaced_config_map(
                    name,
                    namespace,
                    {"data": {REPORT_KEY: text}},
                    _request_timeout=min(settings.request_timeout, WRITE_TIMEOUT),
                )
            except ApiException as exc:
                what = f"patch ConfigMap {namespace}/{name}"
                raise from_api_error(exc.status, exc.body, what, "ConfigMap", name) from exc
            except (HTTPError, OSError) as exc:
                raise StoreError(f"patch ConfigMap {namespace}/{name}: {exc}") from exc

    await asyncio.to_thread(patch)


async def watch_reports(
    settings: KubeSettings, namespace: str | None
) -> AsyncIterator[tuple[str, str, str]]:
    """(namespace, sandbox, report text) for every guard report ConfigMap in ``namespace``
    (None: all namespaces) now and after each change; deleted ones and ones without a report
    are skipped. Runs until the caller stops iterating.

    Raises:
        StoreError: the API server refused or is unreachable for good (``ResourceExpired``:
            list again).
    """
    api_client = settings.api_client()
    core = client.CoreV1Api(api_client)
    timeouts = (settings.request_timeout, settings.watch_timeout + 30.0)

    def open_watch(version: str | None) -> Any:
        kwargs: dict[str, Any] = {
            "watch": True,
            "allow_watch_bookmarks": True,
            "resource_version": version,
            "label_selector": REPORT_LABEL,
            "timeout_seconds": settings.watch_timeout,
            "_preload_content": False,
            "_request_timeout": timeouts,
        }
        if namespace is None:
            return core.list_config_map_for_all_namespaces(**kwargs)
        return core.list_namespaced_config_map(namespace, **kwargs)

    stream = WatchStream(open_watch, None, "ConfigMap")
    try:
        async for event in stream:
            if event["type"] == "DELETED":
                continue
            obj = event["object"]
            meta = obj.get("metadata") or {}
            name = str(meta.get("name") or "")
            text = (obj.get("data") or {}).get(REPORT_KEY)
            if not name.endswith(_SUFFIX) or not isinstance(text, str):
                continue
            yield str(meta.get("namespace") or ""), name[: -len(_SUFFIX)], text
    finally:
        await stream.close()
        api_client.close()  # type: ignore[no-untyped-call]  # the client leaves close untyped
