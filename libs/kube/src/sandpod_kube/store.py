"""The cluster-mode resource store: Sandpod's ``Store`` over the ``sandpod.dev`` CRDs.

The API server already has the semantics the store contract asks for (it is where they come from):
uid/generation/creationTimestamp on create, optimistic concurrency on ``resourceVersion``,
generation bumps on spec changes only, status as a subresource, label selectors, and watches that
resume from a list's ``resourceVersion``. So this adapter mostly translates:

    Resource --to_dict--> CustomObjectsApi call (in a worker thread) --dict--> Resource.from_dict
    ApiException (status + Status.reason) --errors.from_api_error--> ResourceNotFound/Exists/...

The ``kubernetes`` client is synchronous: every call runs on this store's own bounded thread pool
(``KubeSettings.max_workers``), watches on their own threads (``watch.WatchStream``).
With ``KubeSettings.namespace`` set, "all namespaces" (``namespace=None``) means that one.
Revisions are etcd revisions, exposed by the API server as ``resourceVersion`` strings holding
integers; the store treats them as integers, as the interface does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import functools
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from sandpod_contract.errors import ResourceConflict, StoreError
from sandpod_kube.config import KubeSettings
from sandpod_kube.errors import from_api_error
from sandpod_kube.kinds import KindInfo, resolve
from sandpod_kube.watch import WatchStream
from sandpod_store import EventType, Resource, WatchEvent, parse_selector
from sandpod_store.model import validate_name

__all__ = ["KubeStore"]

_UNCONDITIONAL_RETRIES = 5  # updates without a resourceVersion retry this often on a 409
_SERVER_SET = ("resourceVersion", "uid", "generation", "creationTimestamp")


def _selector_string(selector: str | Mapping[str, str] | None) -> str | None:
    parse_selector(selector)  # the same syntax check (and ResourceInvalid) as the other stores
    if selector is None or isinstance(selector, str):
        return selector or None
    return ",".join(f"{key}={value}" for key, value in selector.items())


def _revision(raw: Mapping[str, Any]) -> int:
    return int((raw.get("metadata") or {}).get("resourceVersion") or 0)


class KubeStore:
    """``Store`` on a real API server. Create with :meth:`connect`; :meth:`close` when done."""

    def __init__(self, settings: KubeSettings) -> None:
        self._settings = settings
        self._client = settings.api_client()
        self._api = client.CustomObjectsApi(self._client)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=settings.max_workers, thread_name_prefix="sandpod-kube"
        )
        self._watches: set[WatchStream] = set()

    @classmethod
    async def connect(cls, settings: KubeSettings) -> KubeStore:
        return cls(settings)

    async def close(self) -> None:
        """Stop open watches, wait for in-flight calls, close connections (idempotent)."""
        for stream in list(self._watches):
            await stream.close()
        await asyncio.to_thread(self._pool.shutdown, wait=True)
        self._client.close()  # type: ignore[no-untyped-call]  # the client leaves close untyped

    async def _call(
        self,
        what: str,
        kind: str,
        name: str | None,
        fn: Callable[..., object],
        *args: Any,
        **kw: Any,
    ) -> dict[str, Any]:
        """Run one blocking client call on the pool; its JSON answer, or a typed StoreError."""
        call = functools.partial(fn, *args, _request_timeout=self._settings.request_timeout, **kw)
        try:
            raw = await asyncio.get_running_loop().run_in_executor(self._pool, call)
        except ApiException as exc:
            raise from_api_error(exc.status, exc.body, what, kind, name) from exc
        except (HTTPError, OSError) as exc:
            raise StoreError(f"{what}: API server unreachable: {exc}", kind=kind) from exc
        if not isinstance(raw, dict):
            raise StoreError(f"{what}: the API server answered {type(raw).__name__}, not an object")
        return raw

    # -- reads ---------------------------------------------------------------------------------

    async def _get_raw(self, info: KindInfo, namespace: str, name: str) -> dict[str, Any]:
        validate_name("metadata.namespace", namespace)
        validate_name("metadata.name", name)
        return await self._call(
            f"get {info.kind} {namespace}/{name}",
            info.kind,
            name,
            self._api.get_namespaced_custom_object,
            info.group,
            info.version,
            namespace,
            info.plural,
            name,
        )

    async def get(self, kind: str, namespace: str, name: str) -> Resource:
        return Resource.from_dict(await self._get_raw(resolve(kind), namespace, name))

    async def list(
        self,
        kind: str,
        namespace: str | None = None,
        selector: str | Mapping[str, str] | None = None,
    ) -> tuple[list[Resource], int]:
        info = resolve(kind)
        label_selector = _selector_string(selector)
        what = f"list {info.kind}"
        namespace = namespace or self._settings.namespace  # a scoped store's "all"
        if namespace is None:
            raw = await self._call(
                what,
                kind,
                None,
                self._api.list_cluster_custom_object,
                info.group,
                info.version,
                info.plural,
                label_selector=label_selector,
            )
        else:
            validate_name("metadata.namespace", namespace)
            raw = await self._call(
                what,
                kind,
                None,
                self._api.list_namespaced_custom_object,
                info.group,
                info.version,
                namespace,
                info.plural,
                label_selector=label_selector,
            )
        items = [Resource.from_dict(item) for item in raw.get("items") or []]
        items.sort(key=lambda r: (r.metadata.namespace, r.metadata.name))
        return items, _revision(raw)

    # -- writes --------------------------------------------------------------------------------

    async def create(self, obj: Resource) -> Resource:
        obj.validate()
        info = resolve(obj.kind, obj.api_version)
        body = obj.to_dict()
        body["apiVersion"] = info.api_version
        body.pop("status", None)  # a subresource: what create carries is dropped anyway
        for key in _SERVER_SET:
            body["metadata"].pop(key, None)
        kind, ns, name = obj.key
        raw = await self._call(
            f"create {kind} {ns}/{name}",
            kind,
            name,
            self._api.create_namespaced_custom_object,
            info.group,
            info.version,
            ns,
            info.plural,
            body,
        )
        return Resource.from_dict(raw)

    async def update(self, obj: Resource) -> Resource:
        obj.validate()
        info = resolve(obj.kind, obj.api_version)
        kind, ns, name = obj.key
        for attempt in range(_UNCONDITIONAL_RETRIES):
            # Start from the stored object so metadata the model does not carry (finalizers)
            # survives the PUT; the caller's resourceVersion guards the write.
            body = copy.deepcopy(await self._get_raw(info, ns, name))
            meta = body["metadata"]
            meta["labels"] = dict(obj.metadata.labels)
            meta["annotations"] = dict(obj.metadata.annotations)
            owners = [o.to_dict() for o in obj.metadata.owner_references]
            if owners:
                meta["ownerReferences"] = owners
            else:
                meta.pop("ownerReferences", None)
            meta["resourceVersion"] = obj.metadata.resource_version or meta["resourceVersion"]
            meta.pop("managedFields", None)
            body["spec"] = dict(obj.spec)
            try:
                raw = await self._call(
                    f"update {kind} {ns}/{name}",
                    kind,
                    name,
                    self._api.replace_namespaced_custom_object,
                    info.group,
                    info.version,
                    ns,
                    info.plural,
                    name,
                    body,
                )
            except ResourceConflict:
                if obj.metadata.resource_version or attempt == _UNCONDITIONAL_RETRIES - 1:
                    raise
                continue
            return Resource.from_dict(raw)
        raise AssertionError("unreachable")  # pragma: no cover

    async def update_status(self, obj: Resource) -> Resource:
        info = resolve(obj.kind, obj.api_version)
        kind, ns, name = obj.key
        for attempt in range(_UNCONDITIONAL_RETRIES):
            version = obj.metadata.resource_version
            if not version:
                version = str(_revision(await self._get_raw(info, ns, name)))
            # The status subresource ignores everything but status (and the version guard).
            body = {
                "apiVersion": info.api_version,
                "kind": kind,
                "metadata": {"name": name, "namespace": ns, "resourceVersion": version},
                "status": dict(obj.status),
            }
            try:
                raw = await self._call(
                    f"update status of {kind} {ns}/{name}",
                    kind,
                    name,
                    self._api.replace_namespaced_custom_object_status,
                    info.group,
                    info.version,
                    ns,
                    info.plural,
                    name,
                    body,
                )
            except ResourceConflict:
                if obj.metadata.resource_version or attempt == _UNCONDITIONAL_RETRIES - 1:
                    raise
                continue
            return Resource.from_dict(raw)
        raise AssertionError("unreachable")  # pragma: no cover

    async def delete(
        self, kind: str, namespace: str, name: str, resource_version: str | None = None
    ) -> None:
        info = resolve(kind)
        validate_name("metadata.namespace", namespace)
        validate_name("metadata.name", name)
        options = client.V1DeleteOptions(
            preconditions=client.V1Preconditions(resource_version=resource_version)
            if resource_version
            else None
        )
        await self._call(
            f"delete {kind} {namespace}/{name}",
            kind,
            name,
            self._api.delete_namespaced_custom_object,
            info.group,
            info.version,
            namespace,
            info.plural,
            name,
            body=options,
        )

    # -- watch ---------------------------------------------------------------------------------

    def _opener(self, info: KindInfo, namespace: str | None) -> Callable[[str | None], Any]:
        timeouts = (self._settings.request_timeout, self._settings.watch_timeout + 30.0)

        def open_watch(version: str | None) -> Any:
            common: dict[str, Any] = {
                "watch": True,
                "allow_watch_bookmarks": True,
                "resource_version": version,
                "timeout_seconds": self._settings.watch_timeout,
                "_preload_content": False,
                "_request_timeout": timeouts,
            }
            if namespace is None:
                return self._api.list_cluster_custom_object(
                    info.group, info.version, info.plural, **common
                )
            return self._api.list_namespaced_custom_object(
                info.group, info.version, namespace, info.plural, **common
            )

        return open_watch

    async def watch(
        self,
        kind: str,
        namespace: str | None = None,
        from_revision: int = 0,
        name: str | None = None,
    ) -> AsyncIterator[WatchEvent]:
        """Every change after ``from_revision``; 0 means the current objects (as ADDED) and on.

        Raises:
            ResourceExpired: ``from_revision`` was compacted away (list again, watch from there).
        """
        info = resolve(kind)
        namespace = namespace or self._settings.namespace  # a scoped store's "all"
        if namespace is not None:
            validate_name("metadata.namespace", namespace)
        stream = WatchStream(
            self._opener(info, namespace), str(from_revision) if from_revision else None, kind
        )
        self._watches.add(stream)
        try:
            async for event in stream:
                resource = Resource.from_dict(event["object"])
                if name is not None and resource.metadata.name != name:
                    continue  # one object's changes only (filtered here, not by the API server)
                etype = EventType(event["type"])
                yield WatchEvent(
                    etype,
                    kind,
                    resource.metadata.namespace,
                    resource.metadata.name,
                    int(resource.metadata.resource_version or 0),
                    None if etype is EventType.DELETED else resource,
                )
        finally:
            self._watches.discard(stream)
            await stream.close()
