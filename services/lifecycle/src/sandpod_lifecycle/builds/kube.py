"""Template builds in Kubernetes mode: a builder Pod per build, the image pushed to a registry.

Why this mechanism: a cluster node's image store is not ours, and a Pod can only run an image,
so a built template must become an OCI image in a registry the nodes pull from
(``SANDPOD_BUILD_REGISTRY=host[:port]/prefix``). The build itself runs as a Pod
(``sandpod_kube.buildpod``) executing Sandpod's own builder entry point
(``builds.podmain``) rather than kaniko or buildkit: it is the same cache-key, commit and
export code as a local build, so one template means the same layers in both modes, it needs no
second build tool or image, and it speaks the same progress events. The price is the Pod's
privileges (root with a handful of capabilities, AppArmor unconfined: mounts for the overlay of
a ``run`` step); ``sandpod_kube.buildpod`` lists them and why.

Data flow of :meth:`PodBuilds.build` (the lifecycle's ``TemplateBuilds`` loop calls it for a
template generation that is not built):

1. no registry configured -> ``template.build_unsupported`` naming ``SANDPOD_BUILD_REGISTRY``
   (terminal: the template is Failed at once, it never waits silently);
2. the base is pinned here: ``from: {image}`` and ``from: {}`` (the Pod runtime's default
   image) are resolved to their platform manifest digest (the key a local build gives the same
   image: ``cache.base_key``); ``from: {template}`` is that template's result and pushed image;
3. every step's key is computed (``cache.step_key``: nothing runs for that), the last is the
   result key; the image's tag is ``<SANDPOD_BUILD_REGISTRY>/<template>:build-<key prefix>``
   (``podwire.image_tag``), and each step's result is pushed under its own key's tag too;
4. if the registry has the result's tag already, it is the build (a cache hit: no Pod, no
   push); else the longest prefix of steps whose result is there becomes the Pod's base, so a
   changed step rebuilds only from there, as locally;
5. else the builder Pod ``<template>-build-<key>`` is created (owned by the template), waited
   for until it ends, its termination message read (``podwire.BuildOutcome``: the image by
   digest, or the typed error with the failing step), and the Pod is deleted (unless this
   replica is stopping: the next leader adopts the running Pod and reads its result). A Pod
   that cannot start (unschedulable, its image not pulled) fails the build with that reason
   once it has waited ``SANDPOD_POD_START_DEADLINE`` seconds (said in the build log
   meanwhile), never leaving the template Building in silence.

Registry access here (the tag check) uses the lifecycle's own credentials file
(``SANDPOD_IMAGE_AUTH_FILE``, Docker ``config.json``); the Pod gets the Secret
``SANDPOD_BUILD_REGISTRY_SECRET`` mounted for its push. A refused credential is
``image.auth_failed`` in the template's ``Built`` condition. With NATS in operator mode each
builder Pod connects as a user of its own (``builds.buildcreds``: the build's event subject and
the build-context bucket only), its Secret deleted with the Pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from sandpod_contract.errors import (
    BuildFailed,
    BuildUnsupported,
    ImageAuthFailed,
    ImageError,
    ImageNotFound,
    InternalError,
    ResourceExists,
    ResourceInvalid,
    ResourceNotFound,
    SandpodError,
)
from sandpod_contract.resources import SandboxTemplateSpec
from sandpod_contract.times import from_rfc3339
from sandpod_image.auth import AuthFile
from sandpod_image.manifest import host_platform
from sandpod_image.reference import parse_reference
from sandpod_image.registry import Registry
from sandpod_image.sources import open_source
from sandpod_kube.buildpod import (
    BuildPod,
    BuildPodSettings,
    build_creds_secret_manifest,
    build_pod_manifest,
    build_pod_name,
)
from sandpod_kube.pods import PodApi, PodState
from sandpod_lifecycle.builds.buildcreds import mint_builder_creds
from sandpod_lifecycle.builds.cache import base_key, step_key
from sandpod_lifecycle.builds.podwire import BuildOutcome, BuildRequest, image_tag
from sandpod_lifecycle.builds.results import BuildOwner, BuildResult, BuiltRef, Log
from sandpod_lifecycle.runtime.base import RuntimeFailure
from sandpod_lifecycle.runtime.podcreds import CredsPolicy

__all__ = ["NO_REGISTRY", "PodBuilds", "validate_registry"]

log = structlog.get_logger("sandpod.lifecycle.builds")

NO_REGISTRY = (
    "Kubernetes mode pushes a built template as an image: set SANDPOD_BUILD_REGISTRY on the "
    "lifecycle (host[:port]/prefix of a registry the cluster's nodes pull from; credentials "
    "in SANDPOD_IMAGE_AUTH_FILE, and the Secret SANDPOD_BUILD_REGISTRY_SECRET for the builder "
    "Pod)"
)


def validate_registry(registry: str) -> str:
    """``SANDPOD_BUILD_REGISTRY`` normalised (no trailing slash). Raises ValueError."""
    value = registry.strip().rstrip("/")
    try:
        ref = parse_reference(f"{value}/template:{image_tag('0' * 64)}")
    except SandpodError as exc:  # InvalidReference
        raise ValueError(f"SANDPOD_BUILD_REGISTRY={registry!r}: {exc.message}") from exc
    if "/" not in value and "." not in value and ":" not in value and value != "localhost":
        raise ValueError(f"SANDPOD_BUILD_REGISTRY={registry!r}: name a registry host first")
    if not ref.registry or not value.startswith(ref.registry):
        raise ValueError(f"SANDPOD_BUILD_REGISTRY={registry!r}: name a registry host first")
    return value


class PodBuilds:
    """Builds templates as builder Pods (see the module docstring)."""

    def __init__(
        self,
        *,
        pods: PodApi,
        settings: BuildPodSettings,
        registry: str | None,
        installation: str,
        default_image: str,
        nats_secret: str,
        start_deadline: float = 300.0,
        creds: CredsPolicy | None = None,
        auth: AuthFile | None = None,
        insecure: frozenset[str] = frozenset(),
        transport: Any = None,
    ) -> None:
        self._pods = pods
        self._settings = settings
        self._registry = registry
        self._installation = installation
        self._default_image = default_image
        self._nats_secret = nats_secret
        self._start_deadline = start_deadline
        self._creds = creds  # operator mode: each builder Pod gets its own NATS user
        self._auth = auth
        self._insecure = insecure
        self._transport = transport  # httpx transport for the registry checks (tests)
        self.pods_made = 0  # builder Pods created (tests count them)

    async def forget(self, name: str) -> None:
        """Nothing is held on the lifecycle's node in this mode (the registry keeps images)."""

    async def build(
        self,
        name: str,
        template: SandboxTemplateSpec,
        template_result: Callable[[str], Awaitable[BuiltRef]],
        emit: Log,
        owner: BuildOwner | None = None,
    ) -> BuildResult:
        """Build ``template`` into an image in the build registry.

        Raises:
            BuildUnsupported: no registry is configured, or no owner was given.
            BuildFailed: a step failed (details name it), or the builder Pod failed.
            ImageAuthFailed, ImageNotFound: the registry refused the credentials, or the base
                image does not exist.
            SandpodError, RuntimeFailure: a passing failure (the API server, the registry).
        """
        build = template.build
        if build is None or owner is None:
            raise BuildUnsupported(
                "a Kubernetes build needs the template and its owner", what="template"
            )
        if not self._registry:
            raise BuildUnsupported(NO_REGISTRY, what="registry", setting="SANDPOD_BUILD_REGISTRY")
        base, base_image = await self._base(name, template, template_result)
        keys = [base]
        for step in build.steps:
            keys.append(step_key(keys[-1], step))
        key = keys[-1]
        repo = f"{self._registry}/{name}"
        done, present = await self._longest_pushed(repo, keys)
        if done == len(keys) - 1 and present is not None:
            # a builder Pod of this result may be left over (its replica stopped): it is done
            pod_name = build_pod_name(name, key)
            await self._cleanup(
                owner.namespace, pod_name, f"{pod_name}-nats" if self._creds else None
            )
            await emit(f"cached: {present} is in the registry (no builder Pod)")
            return BuildResult(key=key, layers=tuple(keys), ran=0, image=present)
        if present is not None:  # resume after the longest prefix already pushed
            await emit(f"steps 1-{done} cached: {present}")
            base, base_image = keys[done], present
        request = BuildRequest(
            template=name,
            build={**build.to_dict(), "steps": [s.to_dict() for s in build.steps[done:]]},
            base_key=base,
            base_image=base_image,
            key=key,
            target=f"{repo}:{image_tag(key)}",
            steps_before=done,
        )
        outcome = await self._run_pod(owner, template, request, emit)
        return BuildResult(key=key, layers=tuple(keys), ran=outcome.ran, image=outcome.image)

    async def _base(
        self,
        name: str,
        template: SandboxTemplateSpec,
        template_result: Callable[[str], Awaitable[BuiltRef]],
    ) -> tuple[str, str]:
        """(the chain's first key, the base image pinned by digest)."""
        build = template.build
        if build is not None and build.base.template is not None:
            other = await template_result(build.base.template)
            if not other.image:
                raise ResourceInvalid(
                    f"the base template {build.base.template!r} has no pushed image",
                    field="spec.build.from.template",
                )
            return other.key, other.image
        ref = (build.base.image if build else None) or template.image or self._default_image
        try:
            digest = await self._resolve(ref)
        except ImageAuthFailed as exc:  # stays typed: the credentials are what to fix
            raise ImageAuthFailed(
                f"the base image {ref}: {exc.message}", **{**exc.details, "step": 0}
            ) from exc
        except ImageError as exc:
            if exc.retryable:
                raise
            raise BuildFailed(
                f"cannot resolve the base image {ref}: {exc.message}",
                template=name,
                step=0,
                instruction=f"from image {ref}",
                cause=exc.code,
            ) from exc
        return base_key({"image": digest}), f"{parse_reference(ref).name}@{digest}"

    async def _resolve(self, ref: str) -> str:
        """The platform manifest digest ``ref`` names (what a local pull keys on)."""
        parsed = parse_reference(ref)
        source = open_source(
            ref,
            auth=self._auth.lookup(parsed.registry) if self._auth else None,
            insecure=parsed.registry in self._insecure,
            transport=self._transport,
        )
        try:
            return (await source.resolve(host_platform())).digest
        finally:
            await source.aclose()

    async def _longest_pushed(self, repo: str, keys: list[str]) -> tuple[int, str | None]:
        """(n, image): the first ``n`` steps' result is pushed as ``image`` (by digest), the
        largest such n; (0, None) when no step's result is in the registry."""
        for done in range(len(keys) - 1, 0, -1):
            present = await self._pushed(f"{repo}:{image_tag(keys[done])}")
            if present is not None:
                return done, present
        return 0, None

    async def _pushed(self, target: str) -> str | None:
        """``registry/repo@digest`` of ``target`` when the registry has it, else None.

        Raises:
            ImageAuthFailed: the registry refused the credentials; ImageError: unreachable.
        """
        ref = parse_reference(target)
        registry = Registry(
            ref.api_host,
            auth=self._auth.lookup(ref.registry) if self._auth else None,
            insecure=ref.registry in self._insecure,
            transport=self._transport,
        )
        async with registry:
            try:
                _, _, digest = await registry.get_manifest(ref.repository, ref.target)
            except ImageNotFound:
                return None
        return f"{ref.name}@{digest}"

    async def _run_pod(
        self,
        owner: BuildOwner,
        template: SandboxTemplateSpec,
        request: BuildRequest,
        emit: Log,
    ) -> BuildOutcome:
        pod = BuildPod(
            template=owner.name,
            namespace=owner.namespace,
            owner_uid=owner.uid,
            key=request.key,
            installation=self._installation,
            request=json.loads(request.to_json()),
            nats_secret=self._nats_secret,
            runtime_class_name=template.runtime_class_name,
            cpu=template.resources.cpu,
            memory=template.resources.memory,
            insecure_registries=tuple(sorted(self._insecure)),
        )
        name = build_pod_name(owner.name, request.key)
        minted = None
        if self._creds is not None:
            minted = mint_builder_creds(
                self._creds, owner.name, self._settings.deadline, time.time()
            )
            pod = dataclasses.replace(pod, creds_secret=f"{name}-nats", inbox_prefix=minted.inbox)
        manifest = build_pod_manifest(pod, self._settings)
        secret = build_creds_secret_manifest(pod, minted.creds, minted.expires) if minted else None
        stopping = False
        try:
            await self._start(owner, manifest, secret)
            await emit(f"builder Pod {owner.namespace}/{name} started ({self._settings.image})")
            state = await self._wait(owner, name, emit)
        except TimeoutError:
            raise BuildFailed(
                f"the builder Pod {owner.namespace}/{name} did not finish within "
                f"{self._settings.deadline + 60} s",
                template=owner.name,
                step=0,  # not a step's failure: the build as a whole
            ) from None
        except ResourceNotFound as exc:  # deleted under us: build again on the next pass
            raise RuntimeFailure(f"builder Pod {name}: {exc}") from exc
        except asyncio.CancelledError:  # this replica stops: the next leader adopts the Pod
            stopping = True
            log.info("build_pod_left_to_the_next_leader", template=owner.name, pod=name)
            raise
        finally:
            if not stopping:
                await self._cleanup(owner.namespace, name, pod.creds_secret)
        outcome = _outcome(state, owner.name)
        log.info("build_pod_finished", template=owner.name, pod=name, ok=outcome.ok)
        if not outcome.ok:
            outcome.raise_error()
        if outcome.key != request.key or not outcome.image:
            raise InternalError(f"the builder Pod {name} reported another result")
        return outcome

    async def _cleanup(self, namespace: str, name: str, secret: str | None) -> None:
        """Delete the builder Pod and its creds Secret (never raises: the owner reference's
        garbage collection is the fallback)."""
        with contextlib.suppress(Exception):
            await self._pods.delete(namespace, name, grace_seconds=0)
        if secret:
            with contextlib.suppress(Exception):
                await self._pods.delete_secret(namespace, secret)

    async def _wait(self, owner: BuildOwner, name: str, emit: Log) -> PodState:
        """The Pod once it ended. Meanwhile, every ``poll`` seconds: a Pod held back by a
        problem (Unschedulable, ImagePullFailed...) is said in the log, and fails the build
        after the start deadline.

        Raises:
            BuildFailed: the Pod did not start within the start deadline.
            TimeoutError: it did not end within the build deadline.
            ResourceNotFound: it was deleted.
        """
        namespace = owner.namespace
        poll = max(min(10.0, self._start_deadline / 2), 0.5)
        total = self._settings.deadline + 60.0
        waited = 0.0
        while True:
            try:
                return await self._pods.wait_finished(namespace, name, poll)
            except TimeoutError:
                waited += poll
            state = await self._pods.get(namespace, name)
            if state is None:
                raise ResourceNotFound(f"Pod {namespace}/{name} is gone", kind="Pod", name=name)
            problem = state.problem
            if problem is not None and not state.ready and state.pending:
                await emit(f"builder Pod waiting: {problem.reason}: {problem.message}")
                if _age(state.created) >= self._start_deadline:
                    raise BuildFailed(
                        f"the builder Pod {namespace}/{name} did not start within "
                        f"{self._start_deadline:g} s: {problem.reason}: {problem.message}",
                        pod_reason=str(problem.reason),
                        template=owner.name,
                        step=0,
                    )
            if waited >= total:
                raise TimeoutError(f"builder Pod {namespace}/{name}")

    async def _start(
        self, owner: BuildOwner, manifest: dict[str, Any], secret: dict[str, Any] | None
    ) -> None:
        """Create the builder Pod (its creds ``secret`` first), adopting a live one of the same
        build (a restarted lifecycle: its mounted creds and inbox prefix are left as they are)
        and replacing one that ended or belongs to an older template object."""
        name = manifest["metadata"]["name"]
        old = await self._pods.get(owner.namespace, name)
        if old is not None and (old.terminal or old.deleting or old.owner_uid != owner.uid):
            await self._pods.delete(owner.namespace, name, grace_seconds=0)
            old = None
        if old is None:
            if secret is not None:
                await self._pods.apply_secret(secret)
            with contextlib.suppress(ResourceExists):
                await self._pods.create(manifest)
                self.pods_made += 1
                log.info("build_pod_created", template=owner.name, pod=name)


def _age(created: str) -> float:
    """Seconds since an RFC 3339 creation time (0 when unknown)."""
    return time.time() - from_rfc3339(created) if created else 0.0


def _outcome(state: PodState, template: str) -> BuildOutcome:
    """What the builder Pod reported, or why it said nothing (killed, never started)."""
    if state.message:
        try:
            return BuildOutcome.from_json(state.message)
        except ValueError:
            pass
    if state.exit_code is not None:
        why = f"exit code {state.exit_code}"
    else:
        why = state.problem.message if state.problem else "no reason given"
    # not the result's JSON: the end of the builder's log (FallbackToLogsOnError), e.g. a
    # traceback's last line
    said = [line.strip() for line in state.message.splitlines() if line.strip()]
    if said:
        why += f": {said[-1][:1000]}"
    return BuildOutcome.failed(
        BuildFailed(
            f"the builder Pod {state.name} ended {state.phase} without a result: {why}",
            template=template,
            step=0,
        )
    )
