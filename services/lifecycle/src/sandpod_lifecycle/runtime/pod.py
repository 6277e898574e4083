"""The ``kubernetes`` runtime: a Pod per Sandbox, execd inside it, on the API server.

Everything Kubernetes goes through :mod:`sandpod_kube` (``PodApi`` sends, ``podspec`` renders);
this module maps the reconciler's verbs onto it:

    ensure   -> (a built template: its image is the one its build pushed, by digest; not built
                yet: ``CreateFailed``, retried) apply the template's NetworkPolicy, create the
                Pod (owned by the Sandbox: its uid in ``ownerReferences``), wait until the Pod
                is Ready. The reconciler then pings execd over NATS: Ready = the Pod is Ready
                AND execd answers. A Pod that is not Ready says why
                (:mod:`sandpod_kube.podhealth`): ``InstanceUnhealthy`` carries that reason --
                terminal (OOMKilled, ExecdExited, Evicted, InvalidImage...: the Sandbox is
                Failed) or transient (Unschedulable, ImagePullFailed...: the Pod is kept and
                waited for, never deleted and re-created, until ``start_deadline`` seconds
                after its creation). A Sandbox that already ran (``Owner.started``) and has no
                Pod any more lost it: ``PodDeleted``, terminal -- a new Pod would silently hand
                the agent an empty sandbox under the same name.
    inspect  -> the sandbox's live Pod (label ``sandpod.dev/sandbox``, this installation's label);
                none, or one that ended or is being deleted, means "no instance". A live Pod
                with a terminal problem (CrashLoopBackOff) is reported on the Instance.
    destroy  -> delete the Pod explicitly. ownerReferences alone would let the garbage collector
                delete it once the Sandbox is gone -- but only where kube-controller-manager
                runs, and the reconciler must not depend on when that happens.
    list     -> sandbox ids of this installation's Pods (orphan cleanup after a crash).
    apply_network -> re-render the sandbox's template's NetworkPolicy from the template's
                current ``spec.network`` (:mod:`sandpod_kube.netpolicy`) and apply it. What it
                cannot express (names, limits...) is reported as not enforced; so is a
                sandbox's *own* policy: the per-template NetworkPolicy selects every Pod of the
                template and policies are additive, so one sandbox's policy is never rendered
                into it (that would widen its neighbours' egress). With the network guard
                (``PodSettings.netguard``) names, deny ports, the connection limit and the
                sandbox's own policy are enforced in the Pod: the guard watches its Sandbox and
                applies the ``status.network.policy`` the reconciler writes from this call's
                result (the NetworkPolicy stays the outer bound: it can only narrow further).
    renew_credentials -> with per-sandbox NATS creds (a ``CredsPolicy``): re-mint the sandbox's
                JWT into its Secret when it gets old or the sandbox's lifetime grew
                (``podcreds`` says when); called by the reconciler on each pass over a live one.
    restore  -> (``restores`` set: snapshots are on) a Sandbox that has not run yet and starts
                from a snapshot (its own ``snapshotRef``, its template's, or the one it
                hibernated into) gets the snapshot's files streamed into the new Pod's
                /workspace once the Pod is Ready, before ``ensure`` returns (so before the
                Sandbox is Ready): ``podsnap.PodSnapshots.restore_into``, once per Pod uid.
    stop_serving -> (hibernation) freeze the commands through execd: new commands are refused
                while the files are captured and the Pod deleted.
    pause    -> a Pod cannot be frozen through the API, but execd is the parent of every command
                it starts: ``sys.freeze`` (execd stops its commands' trees; see
                ``sandpod_execd.freezer``), ``sys.thaw`` on resume. ``inspect`` asks execd
                (``sys.freezer``) whether it is frozen, so a restarted replica sees the truth.

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
from collections.abc import Awaitable, Callable
from typing import Protocol

import structlog

from sandpod_contract.errors import ResourceExists, ResourceNotFound, SandpodError, StoreError
from sandpod_contract.messages.system import FreezeState
from sandpod_contract.network import NetworkPolicy, effective_policy
from sandpod_contract.resources import ConditionReason, SandboxSpec, SandboxTemplateSpec
from sandpod_contract.times import from_rfc3339
from sandpod_kube.guardpod import guard_access_manifests, guard_account_name, injected_secrets
from sandpod_kube.guardtrust import trust_env
from sandpod_kube.netpolicy import egress_policy, unenforceable
from sandpod_kube.podhealth import PodProblem
from sandpod_kube.pods import PodApi, PodState
from sandpod_kube.podspec import (
    INSTALLATION_LABEL,
    SANDBOX_LABEL,
    TEMPLATE_LABEL,
    PodSettings,
    SandboxPod,
    creds_secret_manifest,
    creds_secret_name,
    labels_of,
    owner_reference,
    pod_manifest,
)
from sandpod_lifecycle.driver import Instance, Owner
from sandpod_lifecycle.network.secretstore import placeholder_env
from sandpod_lifecycle.runtime.base import (
    CreateFailed,
    InstanceUnhealthy,
    NetworkEnforcement,
    RuntimeFailure,
)
from sandpod_lifecycle.runtime.podcreds import CredsPolicy

__all__ = ["PodDriver"]

log = structlog.get_logger("sandpod.lifecycle.pods")

DEFAULT_TEMPLATE = "default"  # template label of sandboxes without a templateRef
MECHANISMS = {"cgroup": ConditionReason.CGROUP_FROZEN, "signals": ConditionReason.SIGNAL_STOPPED}

# (sandbox id, verb: "freeze" | "thaw" | "freezer") -> execd's answer; raises SandpodError
Freezer = Callable[[str, str], Awaitable[FreezeState]]
# (namespace, template name or None for the built-in one) -> its spec; raises SandpodError
Templates = Callable[[str, str | None], Awaitable[SandboxTemplateSpec]]


class PodRestores(Protocol):
    """Restores a new Pod's files from the snapshot its Sandbox starts from (``wiring``)."""

    async def restore(
        self, sandbox_id: str, owner: Owner, spec: SandboxSpec, template: SandboxTemplateSpec
    ) -> None:
        """Raises InstanceUnhealthy (SnapshotPending / SnapshotUnavailable), RuntimeFailure."""

    def forget(self, sandbox_id: str) -> None: ...


GUARD_BOUND = (
    "enforced in the Pod by the network guard; the template's NetworkPolicy still bounds what "
    "it allows (it can narrow, never widen)"
)
GUARD_IPV4_ONLY = "IPv4 egress only: the network guard refuses all IPv6 in the Pod"
OWN_POLICY = (
    "the sandbox's own policy is not enforced on Kubernetes: its template's NetworkPolicy "
    "applies (NetworkPolicies are additive, so one Pod's cannot be narrower than its template's)"
)


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
        freezer: Freezer | None = None,
        creds: CredsPolicy | None = None,
        templates: Templates | None = None,
    ) -> None:
        """``installation``: the subject prefix (labels this installation's Pods);
        ``namespace``: where Pods are listed (None: all namespaces); ``freezer``: sends
        ``sys.freeze``/``sys.thaw``/``sys.freezer`` to a sandbox's execd (None: pause is
        unsupported and logged); ``creds``: per-sandbox NATS credentials (None: every Pod
        shares the URL Secret's); ``templates``: reads a template's spec (``apply_network``
        re-renders the template's NetworkPolicy from it)."""
        self._api = api
        self._templates = templates
        self._freezer = freezer
        self._creds = creds
        self._issued: dict[str, tuple[str, int]] = {}  # sandbox -> (namespace, JWT exp)
        self._settings = settings
        self._installation = installation
        self._ready_timeout = ready_timeout
        self._namespace = namespace
        self.restores: PodRestores | None = None  # set by the snapshots' wiring
        self._restored: dict[str, str] = {}  # sandbox -> uid of the Pod its files went into
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
        elif creds.too_short_for():
            log.warning(
                "nats_creds_ttl_short",
                half_life=creds.ttl / 2,
                hint="a kubelet with the default syncFrequency (1m) may deliver a renewed creds "
                "file after the old JWT expired, and the server then drops the sandbox's execd: "
                "raise SANDPOD_NATS_CREDS_TTL to 190 s or more (default 86400)",
            )

    def protections(self) -> dict[str, str]:
        # Pause is not an isolation property: its absence is logged by pause(), not here.
        # Without the guard, what it would enforce is reported per policy in status.network
        # (names, own policies: "not enforced"), not as a degraded isolation of every sandbox.
        protections = {
            "pod-security": "active",  # non-root, no escalation, no capabilities, seccomp
            "network-policy": "active",  # enforced by the cluster's CNI, if it enforces any
            "nats-credentials": "active"
            if self._creds
            else ("shared by every sandbox Pod (set SANDPOD_NATS_ACCOUNT_SEED_FILE)"),
        }
        if self._settings.netguard:
            protections["network-guard"] = "active"
        return protections

    def _injecting(self, spec: SandboxSpec, template: SandboxTemplateSpec) -> NetworkPolicy | None:
        """The sandbox's policy at its start when the guard runs and it injects headers."""
        policy = effective_policy(template.network, spec.network)
        return policy if self._settings.netguard and policy.inject else None

    def _command_env(
        self, spec: SandboxSpec, template: SandboxTemplateSpec, injecting: NetworkPolicy | None
    ) -> dict[str, str]:
        """The default environment of the sandbox's commands: in a guarded Pod, the guard's
        trust bundle (``sandpod_kube.guardtrust``: the image's bundle alone until an injection,
        at the start or added later, puts the guard's authorities in it) and the placeholders
        of the secrets injected at the start, under the template's and the sandbox's own
        variables (as in the local runtime)."""
        env = {e.name: e.value for e in (*template.env, *spec.env)}
        if not self._settings.netguard:
            return env
        placeholders = placeholder_env(injecting) if injecting is not None else {}
        return {**placeholders, **trust_env(), **env}

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
        injecting = self._injecting(spec, template)
        pod = SandboxPod(
            name=sandbox_id,
            namespace=owner.namespace,
            owner_uid=owner.uid,
            template=spec.template_ref or DEFAULT_TEMPLATE,
            installation=self._installation,
            image=_image_of(template),
            runtime_class_name=template.runtime_class_name,
            cpu=template.resources.cpu,
            memory=template.resources.memory,
            disk=template.resources.disk,
            env=self._command_env(spec, template, injecting),
            creds_secret=creds_secret_name(sandbox_id) if self._creds else None,
            volumes=tuple((v.name, v.mount_path, v.read_only) for v in spec.volumes),
            trust_bundle=self._settings.netguard,  # an injection may be added while it runs
        )
        try:
            pods = await self._pods(sandbox_id)
            mine = [p for p in pods if p.owner_uid == owner.uid]
            live = [p for p in mine if not (p.terminal or p.deleting)]
            ended = [p for p in mine if p.terminal and p.problem is not None]
            if not live and ended:  # it ran and ended: say why, never start a second one
                raise _unhealthy(ended[0].problem, terminal=True)
            if not live and owner.started:  # deleted (or being deleted) under a running sandbox
                raise InstanceUnhealthy(
                    f"the Pod {owner.namespace}/{sandbox_id} was deleted while the sandbox ran",
                    reason=ConditionReason.POD_DELETED,
                    terminal=True,
                )
            if self._creds_due(sandbox_id, spec):  # a second pass keeps what the Pod mounted
                await self._write_creds(pod, spec)
            if not live:
                await self._create(pod, template, pods, owner)
            try:
                state = await self._api.wait_ready(pod.namespace, pod.name, self._ready_timeout)
            except TimeoutError:
                current = await self._api.get(pod.namespace, pod.name)
                if current is None:
                    raise
                state = current
        except ResourceNotFound as exc:  # deleted or ended while we waited: the next pass retries
            raise RuntimeFailure(str(exc)) from exc
        except StoreError as exc:
            raise RuntimeFailure(f"Pod of {sandbox_id}: {exc}") from exc
        if not state.ready:
            self._not_ready(sandbox_id, state)
        fresh = not owner.started and self._restored.get(sandbox_id) != state.uid
        if self.restores is not None and fresh:  # once per Pod (a failed one: again)
            await self.restores.restore(sandbox_id, owner, spec, template)
            self._restored[sandbox_id] = state.uid
        return self._instance(state)

    async def _guard_access(self, pod: SandboxPod, policy: NetworkPolicy) -> None:
        """The guard's ServiceAccount, Role (its Sandbox; the Secrets ``policy`` injects from)
        and RoleBinding. Raises StoreError."""
        manifests = guard_access_manifests(
            pod.namespace, pod.name, owner_reference(pod), labels_of(pod), injected_secrets(policy)
        )
        await self._api.apply_guard_access(manifests)

    async def _create(
        self, pod: SandboxPod, template: SandboxTemplateSpec, pods: list[PodState], owner: Owner
    ) -> None:
        """The template's NetworkPolicy, the guard's access (the Pod names its ServiceAccount),
        stale Pods of an older Sandbox of that name gone, then the Pod. Raises StoreError."""
        await self._apply_policy(pod, template)
        if self._settings.netguard:
            await self._guard_access(pod, template.network)
        for stale in pods:
            if stale.owner_uid != owner.uid or stale.terminal:  # an old Sandbox's
                log.info("stale_pod_deleted", sandbox=pod.name, phase=stale.phase)
                await self._api.delete(stale.namespace, stale.name, grace_seconds=0)
        with contextlib.suppress(ResourceExists):  # an earlier pass made it: wait below
            await self._api.create(pod_manifest(pod, self._settings))

    def _not_ready(self, sandbox_id: str, state: PodState) -> None:
        """Raise InstanceUnhealthy for a Pod that is not Ready: terminal for a terminal problem
        or once the start deadline passed, transient (keep the Pod, wait) otherwise."""
        problem = state.problem or PodProblem(
            ConditionReason.POD_PENDING,
            f"Pod {state.namespace}/{state.name} is {state.phase}"
            f" and not Ready after {self._ready_timeout:g}s",
        )
        age = _age(state.created)
        if not problem.terminal and age >= self._settings.start_deadline:
            message = (
                f"{problem.message} (not Ready {age:.0f}s after creation, deadline "
                f"{self._settings.start_deadline}s)"
            )
            raise _unhealthy(PodProblem(problem.reason, message), terminal=True)
        raise _unhealthy(problem, terminal=problem.terminal)

    async def _write_creds(self, pod: SandboxPod, spec: SandboxSpec) -> None:
        """Mint the sandbox's JWT into its Secret (create or replace). Raises StoreError."""
        if self._creds is None:
            return
        now = time.time()
        shutdown = from_rfc3339(spec.shutdown_time) if spec.shutdown_time else None
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
        shutdown = from_rfc3339(spec.shutdown_time) if spec.shutdown_time else None
        return issued is None or self._creds.stale(issued[1], shutdown, time.time())

    async def renew_credentials(self, sandbox_id: str, spec: SandboxSpec, owner: Owner) -> None:
        """Re-mint the sandbox's creds if they are stale (see ``podcreds``). Raises
        RuntimeFailure when the API server refused the write (the next pass tries again)."""
        if not self._creds_due(sandbox_id, spec):
            return
        pod = SandboxPod(
            name=sandbox_id,
            namespace=owner.namespace,
            owner_uid=owner.uid,
            template=spec.template_ref or DEFAULT_TEMPLATE,
            installation=self._installation,
        )
        try:
            await self._write_creds(pod, spec)
        except StoreError as exc:
            raise RuntimeFailure(f"NATS creds of {sandbox_id}: {exc}") from exc

    async def _apply_policy(self, pod: SandboxPod, template: SandboxTemplateSpec) -> list[str]:
        """Render and apply the template's NetworkPolicy; what it cannot enforce."""
        manifest, unenforceable = egress_policy(
            pod.namespace, pod.template, template.network, self._settings
        )
        if unenforceable:
            log.warning("egress_not_enforceable", template=pod.template, entries=unenforceable)
        await self._api.apply_network_policy(manifest)
        return unenforceable

    async def apply_network(self, sandbox_id: str, policy: NetworkPolicy) -> NetworkEnforcement:
        """The template's NetworkPolicy re-rendered and applied (see the module docstring).

        Raises:
            RuntimeFailure: no live Pod, the template cannot be read, or the API server refused.
        """
        live = [p for p in await self._pods(sandbox_id) if not (p.terminal or p.deleting)]
        if not live:
            raise RuntimeFailure(f"no live Pod of {sandbox_id} to apply its network policy to")
        state = live[0]
        name = state.labels.get(TEMPLATE_LABEL, DEFAULT_TEMPLATE)
        if self._templates is None:
            return NetworkEnforcement(False, "the Pod runtime was given no template reader")
        try:
            ref = None if name == DEFAULT_TEMPLATE else name
            template = await self._templates(state.namespace, ref)
            pod = SandboxPod(sandbox_id, state.namespace, state.owner_uid, name, self._installation)
            notes = await self._apply_policy(pod, template)
        except SandpodError as exc:
            raise RuntimeFailure(f"NetworkPolicy of {sandbox_id}: {exc.message}") from exc
        if self._settings.netguard:  # the guard enforces the sandbox's policy itself
            try:  # the Secrets its injections name, readable by its guard only
                await self._guard_access(pod, policy)
            except SandpodError as exc:
                raise RuntimeFailure(f"guard access of {sandbox_id}: {exc.message}") from exc
            gaps = unenforceable(policy, guard=True)
            bound = [GUARD_BOUND] if policy != template.network else []
            return NetworkEnforcement(not gaps, "; ".join([*gaps, *bound, GUARD_IPV4_ONLY]))
        if policy != template.network:
            notes.insert(0, OWN_POLICY)
        return NetworkEnforcement(not notes, "; ".join(notes))

    def _instance(self, state: PodState, paused: bool = False) -> Instance:
        problem = state.problem
        where = f"pod {state.namespace}/{state.name} {state.phase}"
        return Instance(
            state.name,
            running=state.ready,
            paused=paused,
            detail=problem.message if problem else where,
            reason=problem.reason if problem else None,
            terminal=problem.terminal if problem else False,
            address=state.pod_ip or None,
        )

    async def inspect(self, sandbox_id: str) -> Instance | None:
        live = [p for p in await self._pods(sandbox_id) if not (p.terminal or p.deleting)]
        if not live:
            return None
        paused = False
        if self._freezer is not None and live[0].ready:
            with contextlib.suppress(SandpodError):  # unreachable: the ready probe says so
                paused = (await self._freezer(sandbox_id, "freezer")).frozen
        return self._instance(live[0], paused)

    async def pause(self, sandbox_id: str) -> ConditionReason | None:
        """Freeze the sandbox's commands through its execd; the mechanism's ConditionReason.

        Raises:
            RuntimeFailure: execd did not freeze them (unreachable, or a process would not stop).
        """
        if self._freezer is None:
            log.warning("pause_unsupported", sandbox=sandbox_id, runtime=self.name)
            return None
        try:
            state = await self._freezer(sandbox_id, "freeze")
        except SandpodError as exc:
            raise RuntimeFailure(f"freeze {sandbox_id}: {exc.message}") from exc
        log.info(
            "pod_frozen", sandbox=sandbox_id, mechanism=state.mechanism, processes=state.processes
        )
        return MECHANISMS.get(state.mechanism)

    async def resume(self, sandbox_id: str) -> None:
        if self._freezer is None:
            return  # never paused (see pause)
        try:
            await self._freezer(sandbox_id, "thaw")
        except SandpodError as exc:
            raise RuntimeFailure(f"thaw {sandbox_id}: {exc.message}") from exc

    async def stop_serving(self, sandbox_id: str, drain: float = 0.0) -> None:
        """Hibernation's first step: freeze the commands (new ones are refused with
        ``sandbox.paused``) while the files are captured; ``drain`` is not waited for (a
        Pod's commands cannot outlive it). Raises RuntimeFailure (see :meth:`pause`)."""
        await self.pause(sandbox_id)

    async def destroy(self, sandbox_id: str) -> None:
        self._restored.pop(sandbox_id, None)
        if self.restores is not None:
            self.restores.forget(sandbox_id)
        namespaces = set()
        for pod in await self._pods(sandbox_id):
            await self._api.delete(pod.namespace, pod.name, self._settings.grace_seconds)
            namespaces.add(pod.namespace)
            log.info("pod_deleted", sandbox=sandbox_id, namespace=pod.namespace)
            if self._settings.netguard:
                await self._api.delete_guard_access(pod.namespace, guard_account_name(sandbox_id))
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


def _image_of(template: SandboxTemplateSpec) -> str | None:
    """The Pod's image: a built template's pushed image (by digest), else the template's own.

    Raises:
        CreateFailed: the template has a build that has not pushed an image yet (retryable:
            the sandbox waits for its build, as in the local runtime).
    """
    if template.build is None:
        return template.image
    if not template.build.image:
        raise CreateFailed(
            "the template is not built yet (its build is running or failed: see "
            "sandpod template get)"
        )
    return template.build.image


def _unhealthy(problem: PodProblem | None, *, terminal: bool) -> InstanceUnhealthy:
    if problem is None:  # callers pass the problem of a Pod that has one
        return InstanceUnhealthy(
            "the Pod reports a problem without details",
            reason=ConditionReason.POD_FAILED,
            terminal=terminal,
        )
    return InstanceUnhealthy(problem.message, reason=problem.reason, terminal=terminal)


def _age(created: str) -> float:
    """Seconds since an RFC 3339 creation time (0 when unknown)."""
    if not created:
        return 0.0
    return time.time() - from_rfc3339(created)
