"""The core objects the Pod runtime touches: Pods, NetworkPolicies and the sandboxes' NATS creds
Secrets, over the same seam.

Data flow mirrors :class:`~sandpod_kube.store.KubeStore`: every blocking ``kubernetes`` call runs
on this object's bounded thread pool; answers are read as JSON (``_preload_content=False``, no
generated models) and returned as :class:`PodState` (or raw manifests where the caller renders
them: :mod:`sandpod_kube.podspec`); ``ApiException`` becomes the contract's typed store errors
here (:func:`sandpod_kube.errors.from_api_error`). Waiting for a Pod uses a watch on that one Pod
(field selector), read by :class:`~sandpod_kube.watch.WatchStream` through a bounded queue.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import json
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from sandpod_contract.errors import ResourceNotFound, StoreError
from sandpod_kube.config import KubeSettings
from sandpod_kube.errors import from_api_error
from sandpod_kube.podhealth import PodProblem, diagnose
from sandpod_kube.watch import WatchStream

__all__ = ["PodApi", "PodState"]

FIELD_MANAGER = "sandpod-lifecycle"
TERMINAL = ("Succeeded", "Failed")
PENDING = "Pending"


@dataclasses.dataclass(frozen=True, slots=True)
class PodState:
    """What the runtime needs to know about one Pod."""

    name: str
    namespace: str
    uid: str
    phase: str  # Pending, Running, Succeeded, Failed, Unknown
    ready: bool  # condition Ready=True
    deleting: bool  # deletionTimestamp set
    labels: Mapping[str, str]
    owner_uid: str = ""  # uid of the controlling ownerReference
    resource_version: str = ""
    created: str = ""  # metadata.creationTimestamp (RFC 3339)
    problem: PodProblem | None = None  # why it is not serving (sandpod_kube.podhealth)
    pod_ip: str = ""  # status.podIP: where the gateway reaches the sandbox's ports
    # The first container's end, once it terminated: exit code and termination message.
    exit_code: int | None = None
    message: str = ""

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL

    @property
    def pending(self) -> bool:
        """Not started yet: unscheduled, pulling its image, or its container being created."""
        return self.phase == PENDING

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> PodState:
        meta = raw.get("metadata") or {}
        status = raw.get("status") or {}
        conditions = status.get("conditions") or []
        owners = [o for o in meta.get("ownerReferences") or [] if o.get("controller")]
        statuses = status.get("containerStatuses") or [{}]
        ended = (statuses[0].get("state") or {}).get("terminated") or {}
        return cls(
            name=str(meta.get("name", "")),
            namespace=str(meta.get("namespace", "")),
            uid=str(meta.get("uid", "")),
            phase=str(status.get("phase") or "Pending"),
            ready=any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions),
            deleting=bool(meta.get("deletionTimestamp")),
            labels=dict(meta.get("labels") or {}),
            owner_uid=str(owners[0].get("uid", "")) if owners else "",
            resource_version=str(meta.get("resourceVersion") or ""),
            created=str(meta.get("creationTimestamp") or ""),
            problem=diagnose(raw),
            pod_ip=str(status.get("podIP") or ""),
            exit_code=int(ended["exitCode"]) if "exitCode" in ended else None,
            message=str(ended.get("message") or ""),
        )


class PodApi:
    """Pods and NetworkPolicies on one API server; :meth:`close` when done."""

    def __init__(self, settings: KubeSettings) -> None:
        self._settings = settings
        self._client = settings.api_client()
        self._core = client.CoreV1Api(self._client)
        self._net = client.NetworkingV1Api(self._client)
        self._rbac = client.RbacAuthorizationV1Api(self._client)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=settings.max_workers, thread_name_prefix="sandpod-kube-pods"
        )
        self._watches: set[WatchStream] = set()

    async def close(self) -> None:
        """Stop watches, wait for in-flight calls, close connections (idempotent)."""
        for stream in list(self._watches):
            await stream.close()
        await asyncio.to_thread(self._pool.shutdown, wait=True)
        self._client.close()  # type: ignore[no-untyped-call]  # the client leaves close untyped

    async def _call(
        self, what: str, kind: str, name: str | None, fn: Callable[..., Any], *args: Any, **kw: Any
    ) -> dict[str, Any]:
        """One blocking call on the pool; its JSON answer, or a typed StoreError."""
        call = functools.partial(
            fn,
            *args,
            _request_timeout=self._settings.request_timeout,
            _preload_content=False,
            **kw,
        )
        try:
            response = await asyncio.get_running_loop().run_in_executor(self._pool, call)
            raw = json.loads(response.data or b"{}")
        except ApiException as exc:
            raise from_api_error(exc.status, exc.body, what, kind, name) from exc
        except (HTTPError, OSError) as exc:
            raise StoreError(f"{what}: API server unreachable: {exc}", kind=kind) from exc
        if not isinstance(raw, dict):
            raise StoreError(f"{what}: the API server answered {type(raw).__name__}")
        return raw

    async def _apply(
        self, kind: str, patch: Callable[..., Any], manifest: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Server-side apply ``manifest`` (a ``kind``) with ``patch``, the lifecycle's field
        manager forcing its fields."""
        meta = manifest["metadata"]
        return await self._call(
            f"apply {kind} {meta['namespace']}/{meta['name']}",
            kind,
            meta["name"],
            patch,
            meta["name"],
            meta["namespace"],
            dict(manifest),
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type="application/apply-patch+yaml",
        )

    # -- Pods ----------------------------------------------------------------------------------

    async def create(self, manifest: Mapping[str, Any]) -> PodState:
        """Create a Pod. Raises ResourceExists when one of that name exists."""
        meta = manifest["metadata"]
        raw = await self._call(
            f"create Pod {meta['namespace']}/{meta['name']}",
            "Pod",
            meta["name"],
            self._core.create_namespaced_pod,
            meta["namespace"],
            dict(manifest),
        )
        return PodState.of(raw)

    async def get(self, namespace: str, name: str) -> PodState | None:
        """The Pod, or None when there is none."""
        try:
            raw = await self._call(
                f"get Pod {namespace}/{name}",
                "Pod",
                name,
                self._core.read_namespaced_pod,
                name,
                namespace,
            )
        except ResourceNotFound:
            return None
        return PodState.of(raw)

    async def list(self, selector: str, namespace: str | None = None) -> list[PodState]:
        """Pods matching the label ``selector`` in ``namespace`` (None: all namespaces)."""
        if namespace is None:
            raw = await self._call(
                "list Pods",
                "Pod",
                None,
                self._core.list_pod_for_all_namespaces,
                label_selector=selector,
            )
        else:
            raw = await self._call(
                "list Pods",
                "Pod",
                None,
                self._core.list_namespaced_pod,
                namespace,
                label_selector=selector,
            )
        return [PodState.of(item) for item in raw.get("items") or []]

    async def delete(self, namespace: str, name: str, grace_seconds: int | None = None) -> None:
        """Delete the Pod (idempotent: a missing Pod is fine)."""
        body = client.V1DeleteOptions(grace_period_seconds=grace_seconds)
        try:
            await self._call(
                f"delete Pod {namespace}/{name}",
                "Pod",
                name,
                self._core.delete_namespaced_pod,
                name,
                namespace,
                body=body,
            )
        except ResourceNotFound:
            return

    async def replace_status(self, namespace: str, name: str, raw: Mapping[str, Any]) -> PodState:
        """PUT ``pods/status`` (what a kubelet does). ``raw`` is the whole Pod, as read."""
        out = await self._call(
            f"update status of Pod {namespace}/{name}",
            "Pod",
            name,
            self._core.replace_namespaced_pod_status,
            name,
            namespace,
            dict(raw),
        )
        return PodState.of(out)

    def _opener(self, namespace: str | None, field_selector: str | None) -> Any:
        timeouts = (self._settings.request_timeout, self._settings.watch_timeout + 30.0)

        def open_watch(version: str | None) -> Any:
            common: dict[str, Any] = {
                "watch": True,
                "allow_watch_bookmarks": True,
                "resource_version": version,
                "timeout_seconds": self._settings.watch_timeout,
                "field_selector": field_selector,
                "_preload_content": False,
                "_request_timeout": timeouts,
            }
            if namespace is None:
                return self._core.list_pod_for_all_namespaces(**common)
            return self._core.list_namespaced_pod(namespace, **common)

        return open_watch

    async def watch(
        self, namespace: str | None = None, field_selector: str | None = None
    ) -> AsyncGenerator[tuple[str, dict[str, Any]], None]:
        """``(type, raw Pod)`` for the current Pods (ADDED) and every change after."""
        stream = WatchStream(self._opener(namespace, field_selector), None, "Pod")
        self._watches.add(stream)
        try:
            async for event in stream:
                yield str(event["type"]), dict(event["object"])
        finally:
            self._watches.discard(stream)
            await stream.close()

    async def wait_ready(self, namespace: str, name: str, timeout: float) -> PodState:
        """Wait until the Pod is Ready, or reports a problem (``PodState.problem``: the caller
        decides whether to give up or wait again), whichever comes first.

        Raises:
            TimeoutError: neither within ``timeout`` seconds.
            ResourceNotFound: the Pod was deleted meanwhile.
        """
        events = self.watch(namespace, f"metadata.name={name}")
        async with asyncio.timeout(timeout), contextlib.aclosing(events):
            async for etype, raw in events:
                state = PodState.of(raw)
                if etype == "DELETED":
                    raise ResourceNotFound(
                        f"Pod {namespace}/{name} was deleted before it was Ready",
                        kind="Pod",
                        name=name,
                    )
                if state.ready or state.problem is not None or state.terminal:
                    return state
        raise TimeoutError(f"Pod {namespace}/{name}: watch ended")  # pragma: no cover

    async def wait_finished(self, namespace: str, name: str, timeout: float) -> PodState:
        """Wait until the Pod ended (phase Succeeded or Failed: a run-to-completion Pod), or
        reports a terminal problem (an invalid image: it never will).

        Raises:
            TimeoutError: it did not end within ``timeout`` seconds.
            ResourceNotFound: the Pod was deleted meanwhile.
        """
        events = self.watch(namespace, f"metadata.name={name}")
        async with asyncio.timeout(timeout), contextlib.aclosing(events):
            async for etype, raw in events:
                if etype == "DELETED":
                    raise ResourceNotFound(
                        f"Pod {namespace}/{name} was deleted before it ended",
                        kind="Pod",
                        name=name,
                    )
                state = PodState.of(raw)
                if state.terminal or (state.problem is not None and state.problem.terminal):
                    return state
        raise TimeoutError(f"Pod {namespace}/{name}: watch ended")  # pragma: no cover

    # -- NetworkPolicies -----------------------------------------------------------------------

    async def apply_network_policy(self, manifest: Mapping[str, Any]) -> None:
        """Server-side apply (create or update; a no-op when unchanged)."""
        await self._apply("NetworkPolicy", self._net.patch_namespaced_network_policy, manifest)

    # -- Secrets (a sandbox's NATS creds) ------------------------------------------------------
    # Write-only on purpose: RBAC cannot scope get/list of Secrets to ours, and reading every
    # Secret of a namespace is more than the lifecycle needs (it remembers what it wrote).

    async def apply_secret(self, manifest: Mapping[str, Any]) -> None:
        """Server-side apply a Secret (create, or replace its data on renewal)."""
        await self._apply("Secret", self._core.patch_namespaced_secret, manifest)

    async def delete_secret(self, namespace: str, name: str) -> None:
        """Delete the Secret (idempotent: a missing one is fine)."""
        try:
            await self._call(
                f"delete Secret {namespace}/{name}",
                "Secret",
                name,
                self._core.delete_namespaced_secret,
                name,
                namespace,
            )
        except ResourceNotFound:
            return

    # -- SandboxVolumes' claims (sandpod_kube.volumes) ------------------------------------------

    async def apply_pvc(self, manifest: Mapping[str, Any]) -> None:
        """Server-side apply a PersistentVolumeClaim (idempotent)."""
        await self._apply(
            "PersistentVolumeClaim", self._core.patch_namespaced_persistent_volume_claim, manifest
        )

    async def get_pvc(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The claim as the API server has it; None when there is none."""
        try:
            return await self._call(
                f"get PersistentVolumeClaim {namespace}/{name}",
                "PersistentVolumeClaim",
                name,
                self._core.read_namespaced_persistent_volume_claim,
                name,
                namespace,
            )
        except ResourceNotFound:
            return None

    async def delete_pvc(self, namespace: str, name: str) -> None:
        """Delete the claim (idempotent); its PersistentVolume follows its reclaim policy."""
        try:
            await self._call(
                f"delete PersistentVolumeClaim {namespace}/{name}",
                "PersistentVolumeClaim",
                name,
                self._core.delete_namespaced_persistent_volume_claim,
                name,
                namespace,
            )
        except ResourceNotFound:
            return

    # -- the network guard's access (sandpod_kube.guardpod) ---------------------------------

    async def apply_guard_access(self, manifests: Sequence[Mapping[str, Any]]) -> None:
        """Server-side apply the guard's ServiceAccount, Role, RoleBinding (in that order: the
        Pod names the ServiceAccount, the binding the Role) and report ConfigMap (no data:
        the guard's own writes to it stay)."""
        patch = {
            "ServiceAccount": self._core.patch_namespaced_service_account,
            "Role": self._rbac.patch_namespaced_role,
            "RoleBinding": self._rbac.patch_namespaced_role_binding,
            "ConfigMap": self._core.patch_namespaced_config_map,  # its refusal report
        }
        for manifest in manifests:
            kind = str(manifest["kind"])
            await self._apply(kind, patch[kind], manifest)

    async def delete_guard_access(self, namespace: str, name: str) -> None:
        """Delete the guard's RoleBinding, Role, ServiceAccount and report ConfigMap ``name``
        (idempotent)."""
        for kind, delete in (
            ("ConfigMap", self._core.delete_namespaced_config_map),
            ("RoleBinding", self._rbac.delete_namespaced_role_binding),
            ("Role", self._rbac.delete_namespaced_role),
            ("ServiceAccount", self._core.delete_namespaced_service_account),
        ):
            with contextlib.suppress(ResourceNotFound):
                await self._call(
                    f"delete {kind} {namespace}/{name}", kind, name, delete, name, namespace
                )
