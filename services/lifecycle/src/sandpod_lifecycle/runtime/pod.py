"""The ``kubernetes`` runtime: a Pod per Sandbox, execd inside it, on the API server.

Everything Kubernetes goes through :mod:`sandpod_kube` (``PodApi`` sends, ``podspec`` renders);
this module maps the reconciler's verbs onto it:

    ensure   -> apply the template's NetworkPolicy, create the Pod (owned by the Sandbox: its uid
                in ``ownerReferences``), wait until the Pod is Ready. The reconciler then pings
                execd over NATS: Ready = the Pod is Ready AND execd answers.
    inspect  -> the sandbox's live Pod (label ``sandpod.dev/sandbox``, this installation's label);
                none, or one that ended or is being deleted, means "no instance".
    destroy  -> delete the Pod explicitly. ownerReferences alone would let the garbage collector
                delete it once the Sandbox is gone -- but only where kube-controller-manager
                runs, and the reconciler must not depend on when that happens.
    list     -> sandbox ids of this installation's Pods (orphan cleanup after a crash).
    renew_credentials -> with per-sandbox NATS creds (a ``CredsPolicy``): re-mint the sandbox's
                JWT into its Secret when it gets old or the sandbox's lifetime grew
                (``podcreds`` says when); called by the reconciler on each pass over a live one.
    pause    -> unsupported: a Pod cannot be frozen through the API (no checkpoint yet); the
                call is logged (``pause_unsupported``) and the Pod keeps running.

Instance ids are Sandbox names (unique across namespaces); the Pod lives in its Sandbox's
namespace (an ownerReference cannot cross namespaces) under the same name.

NATS credentials: with a ``CredsPolicy`` (the account seed configured) ``ensure`` first writes the
Sandbox's own creds Secret (``<name>-nats-creds``, owned by the Sandbox) and the Pod mounts it for
execd; ``destroy`` deletes it with the Pod. The Secrets are written, never read (RBAC cannot limit
reads to ours): what was minted is remembered here; after a restart the next pass re-mints once.
A Secret whose namespace is unknown here (lifecycle restarted and the Pod is already gone) is left
to the garbage collector, through its ownerReference. Without a policy every Pod gets the shared
URL Secret, and ``protections()`` reports ``nats-credentials`` as shared, so the Sandbox's
``Isolated`` condition says Degraded.
"""

from __future__ import annotations

import contextlib
import time

import structlog

from sandpod_contract.errors import ResourceExists, ResourceNotFound, StoreError
from sandpod_contract.resources import SandboxSpec, SandboxTemplateSpec
from sandpod_kube.pods import PodApi, PodState
from sandpod_kube.podspec import (
    INSTALLATION_LABEL,
    SANDBOX_LABEL,
    PodSettings,
    SandboxPod,
    creds_secret_manifest,
    creds_secret_name,
    egress_policy,
    pod_manifest,
)
from sandpod_lifecycle.driver import Instance, Owner
from sandpod_lifecycle.objects import parse_time
from sandpod_lifecycle.runtime.base import RuntimeFailure
from sandpod_lifecycle.runtime.podcreds import CredsPolicy

__all__ = ["PodDriver"]

log = structlog.get_logger("sandpod.lifecycle.pods")

DEFAULT_TEMPLATE = "default"  # template label of sandboxes without a templateRef


class PodDriver:
    name = "kubernetes"

    def __init__(
        self,
        api: PodApi,
        settings: PodSettings,
        *,
        installation: str,
        ready_timeout: float,
        namespace: str | None = None,
        creds: CredsPolicy | None = None,
    ) -> None:
        """``installation``: the subject prefix (labels this installation's Pods);
        ``namespace``: where Pods are listed (None: all namespaces); ``creds``: per-sandbox
        NATS credentials (None: every Pod shares the URL Secret's)."""
        self._api = api
        self._creds = creds
        self._issued: dict[str, tuple[str, int]] = {}  # sandbox -> (namespace, JWT exp)
        self._settings = settings
        self._installation = installation
        self._ready_timeout = ready_timeout
        self._namespace = namespace
        if not settings.nats_pinned:
            log.warning(
                "nats_egress_not_pinned",
                hint="set SANDPOD_POD_NATS_NAMESPACE or SANDPOD_POD_NATS_CIDRS; until then the "
                "installation's own NetworkPolicy must allow sandbox Pods to reach NATS",
            )
        if creds is None:
            log.warning(
                "nats_credentials_shared",
                hint="every sandbox Pod connects with the one URL Secret: code in a sandbox can "
                "reach other sandboxes and the control plane. Set SANDPOD_NATS_ACCOUNT_SEED_FILE "
                "(NATS in operator mode) for per-sandbox credentials",
            )

    def protections(self) -> dict[str, str]:
        # Pause is not an isolation property: its absence is logged by pause(), not here.
        return {
            "pod-security": "active",  # non-root, no escalation, no capabilities, seccomp
            "network-policy": "active",  # enforced by the cluster's CNI, if it enforces any
            "nats-credentials": "active" if self._creds else (
                "shared by every sandbox Pod (set SANDPOD_NATS_ACCOUNT_SEED_FILE)"),
        }  # fmt: skip

    def _selector(self, sandbox_id: str | None = None) -> str:
        mine = f"{INSTALLATION_LABEL}={self._installation}"
        return f"{mine},{SANDBOX_LABEL}={sandbox_id}" if sandbox_id else mine

    async def _pods(self, sandbox_id: str) -> list[PodState]:
        # A StoreError (API server unreachable, forbidden) propagates: the reconciler retries
        # a pass (and a resync) that failed with one.
        return await self._api.list(self._selector(sandbox_id), self._namespace)

    async def ensure(
        self,
        sandbox_id: str,
        spec: SandboxSpec,
        template: SandboxTemplateSpec,
        owner: Owner | None = None,
    ) -> Instance:
        """Create the Pod unless a live one of this Sandbox exists; wait until it is Ready.

        Raises:
            RuntimeFailure: no owner given, or the API server refused a write.
            TimeoutError: the Pod was not Ready within the ready timeout.
        """
        if owner is None or not owner.uid:
            raise RuntimeFailure("the kubernetes runtime needs the Sandbox's namespace and uid")
        pod = SandboxPod(
            name=sandbox_id, namespace=owner.namespace, owner_uid=owner.uid,
            template=spec.template_ref or DEFAULT_TEMPLATE, installation=self._installation,
            image=template.image, runtime_class_name=template.runtime_class_name,
            cpu=template.resources.cpu, memory=template.resources.memory,
            disk=template.resources.disk,
            env={e.name: e.value for e in (*template.env, *spec.env)},
            creds_secret=creds_secret_name(sandbox_id) if self._creds else None,
        )  # fmt: skip
        try:
            await self._apply_policy(pod, template)
            if self._creds_due(sandbox_id, spec):  # a second pass keeps what the Pod mounted
                await self._write_creds(pod, spec)
            for stale in await self._pods(sandbox_id):
                if stale.terminal or stale.owner_uid != owner.uid:  # ended, or an old Sandbox's
                    log.info("stale_pod_deleted", sandbox=sandbox_id, phase=stale.phase)
                    await self._api.delete(stale.namespace, stale.name, grace_seconds=0)
            with contextlib.suppress(ResourceExists):  # an earlier pass made it: wait below
                await self._api.create(pod_manifest(pod, self._settings))
            state = await self._api.wait_ready(pod.namespace, pod.name, self._ready_timeout)
        except ResourceNotFound as exc:  # deleted or ended while we waited: the next pass retries
            raise RuntimeFailure(str(exc)) from exc
        except StoreError as exc:
            raise RuntimeFailure(f"Pod of {sandbox_id}: {exc}") from exc
        return self._instance(state)

    async def _write_creds(self, pod: SandboxPod, spec: SandboxSpec) -> None:
        """Mint the sandbox's JWT into its Secret (create or replace). Raises StoreError."""
        if self._creds is None:
            return
        now = time.time()
        shutdown = parse_time(spec.shutdown_time).timestamp() if spec.shutdown_time else None
        minted = self._creds.mint(pod.name, shutdown, now)
        await self._api.apply_secret(creds_secret_manifest(pod, minted.creds, minted.expires))
        self._issued[pod.name] = (pod.namespace, minted.expires)
        log.info("nats_creds_written", sandbox=pod.name, expires=minted.expires)

    def _creds_due(self, sandbox_id: str, spec: SandboxSpec) -> bool:
        """Whether the sandbox's creds must be (re-)minted: never issued by this replica, or
        stale (see ``podcreds``)."""
        if self._creds is None:
            return False
        issued = self._issued.get(sandbox_id)
        shutdown = parse_time(spec.shutdown_time).timestamp() if spec.shutdown_time else None
        return issued is None or self._creds.stale(issued[1], shutdown, time.time())

    async def renew_credentials(self, sandbox_id: str, spec: SandboxSpec, owner: Owner) -> None:
        """Re-mint the sandbox's creds if they are stale (see ``podcreds``). Raises
        RuntimeFailure when the API server refused the write (the next pass tries again)."""
        if not self._creds_due(sandbox_id, spec):
            return
        pod = SandboxPod(name=sandbox_id, namespace=owner.namespace, owner_uid=owner.uid,
                         template=spec.template_ref or DEFAULT_TEMPLATE,
                         installation=self._installation)  # fmt: skip
        try:
            await self._write_creds(pod, spec)
        except StoreError as exc:
            raise RuntimeFailure(f"NATS creds of {sandbox_id}: {exc}") from exc

    async def _apply_policy(self, pod: SandboxPod, template: SandboxTemplateSpec) -> None:
        manifest, unenforceable = egress_policy(
            pod.namespace, pod.template, template.egress, self._settings
        )
        if unenforceable:
            log.warning("egress_not_enforceable", template=pod.template, entries=unenforceable)
        await self._api.apply_network_policy(manifest)

    def _instance(self, state: PodState) -> Instance:
        return Instance(
            state.name, running=state.ready, paused=False,
            detail=f"pod {state.namespace}/{state.name} {state.phase}",
        )  # fmt: skip

    async def inspect(self, sandbox_id: str) -> Instance | None:
        live = [p for p in await self._pods(sandbox_id) if not (p.terminal or p.deleting)]
        return self._instance(live[0]) if live else None

    async def pause(self, sandbox_id: str) -> None:
        log.warning("pause_unsupported", sandbox=sandbox_id, runtime=self.name)

    async def resume(self, sandbox_id: str) -> None:
        return None  # never paused (see pause)

    async def destroy(self, sandbox_id: str) -> None:
        namespaces = set()
        for pod in await self._pods(sandbox_id):
            await self._api.delete(pod.namespace, pod.name, self._settings.grace_seconds)
            namespaces.add(pod.namespace)
            log.info("pod_deleted", sandbox=sandbox_id, namespace=pod.namespace)
        if self._creds is None:
            return
        issued = self._issued.pop(sandbox_id, None)
        namespaces |= {issued[0]} if issued else set()
        if not namespaces and self._namespace:
            namespaces.add(self._namespace)
        for namespace in namespaces:  # none known: the ownerReference's garbage collection
            await self._api.delete_secret(namespace, creds_secret_name(sandbox_id))
            log.info("nats_creds_deleted", sandbox=sandbox_id, namespace=namespace)

    async def list(self) -> list[str]:
        pods = await self._api.list(self._selector(), self._namespace)
        return sorted({p.labels[SANDBOX_LABEL] for p in pods if SANDBOX_LABEL in p.labels})
