"""The reconciler's view of the local runtime: a namespace jail plus an execd serving it.

``ensure`` creates the jail (:class:`LocalRuntime`) from the template's resources and env, then
starts an execd for the sandbox with ``SANDPOD_EXECD_JAIL`` pointing at the jail's file, so every
command runs inside. ``pause``/``resume`` freeze the jail's cgroup (daemons that left the process
tree included); ``destroy`` stops execd and removes every trace of the jail.

A jail whose holder died (its sandbox's OOM killer, or a kill from the host) is *lost*: every
command would fail, and a new jail would silently hand the agent an empty workspace, so
``inspect`` reports it as a terminal problem -- ``OOMKilled`` when the memory cgroup's OOM
killer could pick the holder and did kill, else ``InstanceLost`` -- and the reconciler fails the
Sandbox. It learns at once: each running holder is watched through a pidfd on the event loop
(no polling), whose exit calls the ``on_lost`` callback; the reconciler's periodic pass is the
backstop (a holder that died while no lifecycle ran).

The base of a jail's root (its overlay's read-only lower layer) comes from the template, and is
never the host's own root unless the template says so:

    template rootfs: /        the host root, as asked -- flagged: ``protections["rootfs"]`` is
                              :data:`HOST_ROOT`, so the Isolated condition, ``sandpod get`` and
                              ``sandpod up``'s banner say it (read back from the jail file, so a
                              template edited later cannot hide it)
    template rootfs: <dir>    that directory
    no rootfs (image or not)  the default base (``SANDPOD_DEFAULT_ROOTFS``: a tree made by
                              ``sandpod_image.debian``); none prepared: :class:`NoDefaultRootfs`

(``image:`` is not served by this runtime yet: such a template gets the default base too.)
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import structlog

from sandpod_contract.errors import ImageError
from sandpod_contract.network import NetworkPolicy, Rule, effective_policy
from sandpod_contract.resources import ConditionReason, SandboxSpec, SandboxTemplateSpec
from sandpod_image import debian
from sandpod_image.store import ImageStore
from sandpod_lifecycle.builds.cache import BuildCache, ImageConfig
from sandpod_lifecycle.driver import ExecdLauncher, Instance, Owner
from sandpod_lifecycle.network.egress import Egress
from sandpod_lifecycle.network.nft import NftError
from sandpod_lifecycle.node import NodeLauncher
from sandpod_lifecycle.runtime.base import (
    CreateFailed,
    InstanceNotFound,
    InstanceSpec,
    InstanceStatus,
    InstanceUnhealthy,
    NetworkEnforcement,
    NetworkNotSupported,
    Resources,
    RuntimeFailure,
    SnapshotLayer,
    VolumeBind,
)
from sandpod_lifecycle.runtime.images import ImageRoot, image_root, unhealthy
from sandpod_lifecycle.runtime.local import LocalRuntime
from sandpod_lifecycle.runtime.seccomp import mode_for
from sandpod_service import jailfile

__all__ = ["HOST_ROOT", "LocalDriver", "NoDefaultRootfs", "parse_cpu", "parse_quantity"]

HOST_ROOT = "host root (template rootfs: /): sandbox code reads every world-readable host file"
PREPARE_HINT = (
    "`sandpod up` prepares one (in <state dir>/rootfs); or build it with "
    "`python -m sandpod_image.debian <dir>` and set SANDPOD_DEFAULT_ROOTFS to the path it "
    "prints; a template may also name its own `rootfs:` (`/`: the host root, flagged)"
)

log = structlog.get_logger("sandpod.lifecycle.local_driver")

_UNITS = {
    "": 1,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}
_QUANTITY = re.compile(r"([0-9]+)(Ki|Mi|Gi|Ti|K|M|G|T)?")


def parse_quantity(value: str) -> int:
    """Bytes of a Kubernetes quantity such as ``512Mi`` or ``1G``."""
    m = _QUANTITY.fullmatch(value)
    if m is None:
        raise ValueError(f"{value!r} is not a quantity")
    return int(m.group(1)) * _UNITS[m.group(2) or ""]


def parse_cpu(value: str) -> int:
    """Millicores of a CPU quantity such as ``500m`` or ``1.5``."""
    return int(value[:-1]) if value.endswith("m") else round(float(value) * 1000)


def _resources(template: SandboxTemplateSpec) -> Resources:
    res, base = template.resources, Resources()
    return Resources(
        memory_bytes=parse_quantity(res.memory) if res.memory else base.memory_bytes,
        cpu_millicores=parse_cpu(res.cpu) if res.cpu else base.cpu_millicores,
        pids=res.pids or base.pids,
        disk_bytes=parse_quantity(res.disk) if res.disk else None,  # None: the driver's default
    )


class Restored(Protocol):
    @property
    def root(self) -> SandboxTemplateSpec: ...

    @property
    def layers(self) -> tuple[SnapshotLayer, ...]: ...


class RestoreSource(Protocol):
    """Which snapshot a new instance starts from (``sandpod_lifecycle.snapshots.restore``)."""

    async def resolve(
        self, owner: Owner, sandbox_id: str, spec: SandboxSpec, template: SandboxTemplateSpec
    ) -> Restored | None: ...

    def forget(self, sandbox_id: str) -> None:
        """The instance is gone: drop what was kept to snapshot it again."""


class NoDefaultRootfs(CreateFailed):
    """A template names no ``rootfs`` and this service has no usable default base."""

    retryable = False


class NetworkApplyFailed(RuntimeFailure):
    """nftables refused a policy swap; the previous policy is still in force (retried)."""

    retryable = True


class LocalDriver:
    name = "local"

    def __init__(
        self,
        runtime: LocalRuntime,
        launcher: ExecdLauncher | NodeLauncher,
        default_rootfs: Path | None = None,
        images: ImageStore | None = None,
        builds: BuildCache | None = None,
        *,
        always_allowed: Sequence[Rule] = (),
        restores: RestoreSource | None = None,
    ) -> None:
        self._runtime = runtime
        self.restores = restores  # set by the service once the store is open
        # the platform's rules in every sandbox's effective policy (SANDPOD_NET_ALWAYS_ALLOW):
        # the same the reconciler's egress step applies, so a new jail starts under it
        self._always_allowed = tuple(always_allowed)
        self.builds = builds  # the template build cache whose layers built templates stack
        self._launcher = launcher
        self._default_rootfs = default_rootfs
        self._images = images  # the node's image store: templates naming an ``image``
        self._protections: dict[str, str] = {}
        self._watched: dict[str, int] = {}  # sandbox id -> pidfd of its holder (on the loop)
        self._on_lost: Callable[[str], None] | None = None
        self._namespaces: dict[str, str] = {}  # sandbox id -> its object's namespace
        self._owners: dict[str, Owner] = {}  # sandbox id -> its object (namespace, uid)

    def protections(self) -> dict[str, str]:
        return dict(self._protections) or {"jail": "active"}

    @property
    def runtime(self) -> LocalRuntime:
        """The namespace-jail runtime under this driver (snapshots freeze and read its jails)."""
        return self._runtime

    def on_lost(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(sandbox_id)`` as soon as a running jail's holder exits."""
        self._on_lost = callback

    def _instance(self, sandbox_id: str, status: InstanceStatus) -> Instance:
        if status.lost:
            return Instance(
                sandbox_id,
                running=False,
                paused=False,
                pid=self._launcher.pid(sandbox_id),
                detail=_lost_message(status),
                reason=_lost_reason(status),
                terminal=True,
            )
        self._watch(sandbox_id, status.holder_pid)
        return Instance(
            sandbox_id,
            running=status.running,
            paused=status.paused,
            pid=self._launcher.pid(sandbox_id),
            detail=status.detail,
            protections=_protections(status) or None,
            address=status.address,
        )

    def _watch(self, sandbox_id: str, holder: int | None) -> None:
        """Watch the holder's pidfd (once per jail): readable when the holder exits."""
        if holder is None or sandbox_id in self._watched:
            return
        try:
            fd = os.pidfd_open(holder)
        except OSError:
            return  # already gone: the next inspect says so
        self._watched[sandbox_id] = fd
        asyncio.get_running_loop().add_reader(fd, self._lost, sandbox_id)

    def _unwatch(self, sandbox_id: str) -> None:
        fd = self._watched.pop(sandbox_id, None)
        if fd is not None:
            asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)

    def _lost(self, sandbox_id: str) -> None:
        self._unwatch(sandbox_id)
        log.warning("jail_holder_exited", sandbox=sandbox_id)
        if self._on_lost is not None:
            self._on_lost(sandbox_id)

    async def close(self) -> None:
        """Stop watching holders (the jails themselves are left alone)."""
        for sandbox_id in list(self._watched):
            self._unwatch(sandbox_id)

    async def ensure(
        self,
        sandbox_id: str,
        spec: SandboxSpec,
        template: SandboxTemplateSpec,
        owner: Owner | None = None,  # host instances belong to no API object
    ) -> Instance:
        if owner is not None:
            self._namespaces[sandbox_id] = owner.namespace
            self._owners[sandbox_id] = owner
        status = await self._runtime.inspect(sandbox_id)
        if status.lost:  # never serve a dead jail (nor replace it: its workspace is its state)
            raise InstanceUnhealthy(
                _lost_message(status), reason=_lost_reason(status), terminal=True
            )
        if not status.exists:
            status = await self._create(sandbox_id, spec, template)
        self._protections = _protections(status)
        if self._launcher.pid(sandbox_id) is None:
            if status.jail_file is None:  # traces without a jail file: not an instance to serve
                raise CreateFailed(
                    f"sandbox {sandbox_id!r} has {status.detail or 'no jail file'} on this host "
                    "(a create that crashed half-way); they are removed and the create retried",
                    sandbox_id=sandbox_id,
                )
            await self._launcher.start(sandbox_id, {"SANDPOD_EXECD_JAIL": str(status.jail_file)})
        return self._instance(sandbox_id, status)

    async def _create(
        self, sandbox_id: str, spec: SandboxSpec, template: SandboxTemplateSpec
    ) -> InstanceStatus:
        """A new jail: on the template's image (pulled once per node), else its base; restored
        from a snapshot, on the base of the template the snapshot was taken on."""
        restore = None
        if self.restores is not None:
            owner = self._owners.get(sandbox_id) or Owner("default", "")
            restore = await self.restores.resolve(owner, sandbox_id, spec, template)
        elif spec.snapshot_ref or template.snapshot_ref:
            raise CreateFailed("this node cannot restore snapshots (the local runtime as root can)")
        root = template if restore is None else restore.root
        image = await self._image(sandbox_id, root)
        namespace = self._namespaces.get(sandbox_id, "default")
        instance = InstanceSpec(
            volumes=await self._volume_binds(namespace, spec),
            sandbox_id=sandbox_id,
            resources=_resources(template),
            env={e.name: e.value for e in (*template.env, *spec.env)},
            egress=bool(template.egress),
            network=effective_policy(template.network, spec.network, self._always_allowed),
            seccomp=mode_for(
                template.security.seccomp, template.security.allow_nested_user_namespaces
            ),
            snapshot=() if restore is None else restore.layers,
        )
        if root.build is not None:
            rootfs, layers, config = self._built(root)
            return await self._runtime.create(
                dataclasses.replace(
                    instance,
                    rootfs=rootfs,
                    layers=layers,
                    workdir=config.workdir or None,
                    env={**dict(config.env), **instance.env},
                )
            )
        if image is None:
            return await self._runtime.create(
                dataclasses.replace(instance, rootfs=self._base(root))
            )
        try:
            return await self._runtime.create(
                dataclasses.replace(
                    instance,
                    layers=image.layers,
                    image=image.image,
                    workdir=image.workdir,
                    shell=image.shell,
                    env={**image.env, **instance.env},  # the template's and sandbox's own win
                )
            )
        except BaseException:
            await self._release(sandbox_id)
            raise

    async def _volume_binds(self, namespace: str, spec: SandboxSpec) -> tuple[VolumeBind, ...]:
        """The Sandbox's volumes (the API resolved its template's into ``spec.volumes`` and
        claimed them) as binds of their filesystems on this node. Raises CreateFailed."""
        binds = []
        for vol in spec.volumes:
            try:
                source = await asyncio.to_thread(self._runtime.volumes.source, namespace, vol.name)
            except OSError as exc:
                raise CreateFailed(f"SandboxVolume {vol.name!r}: {exc}", volume=vol.name) from exc
            binds.append(VolumeBind(source, vol.mount_path, vol.read_only, (namespace, vol.name)))
        return tuple(binds)

    @property
    def images(self) -> ImageStore | None:
        """The node's image store (template builds pull their ``from: {image}`` through it)."""
        return self._images

    async def _image(self, sandbox_id: str, template: SandboxTemplateSpec) -> ImageRoot | None:
        """The template's image as layers (None: it names none, or a ``rootfs`` wins)."""
        if not template.image or template.rootfs or template.build or self._images is None:
            return None
        log.info("image_resolving", sandbox_id=sandbox_id, image=template.image)
        try:
            return await image_root(self._images, template.image, sandbox_id)
        except ImageError as exc:
            raise unhealthy(exc, template.image) from exc

    async def _release(self, sandbox_id: str) -> None:
        if self._images is not None:
            await asyncio.to_thread(self._images.release, sandbox_id)

    def _base(self, template: SandboxTemplateSpec) -> Path:
        """The jail's base for ``template`` (see the module's docstring).

        Raises:
            NoDefaultRootfs: no ``rootfs`` named and no usable default base.
        """
        if template.rootfs:
            return Path(template.rootfs)
        if self._default_rootfs is None:
            raise NoDefaultRootfs(
                "this template names no rootfs and no default sandbox root filesystem is "
                f"configured (SANDPOD_DEFAULT_ROOTFS): {PREPARE_HINT}"
            )
        try:
            debian.check(self._default_rootfs)
        except debian.RootfsInvalid as exc:
            raise NoDefaultRootfs(
                f"the default sandbox root filesystem (SANDPOD_DEFAULT_ROOTFS) is unusable: "
                f"{exc.message}; {PREPARE_HINT}",
                rootfs=str(self._default_rootfs),
            ) from exc
        return self._default_rootfs

    def _built(
        self, template: SandboxTemplateSpec
    ) -> tuple[Path | None, tuple[Path, ...], ImageConfig]:
        """(base, layers, config) of a built template's root: its chain in the build cache."""
        build = template.build
        if build is None or not build.result or self.builds is None:
            raise CreateFailed(
                "the template is not built yet (its build is running or failed: see "
                "sandpod template get)",
            )
        chain = self.builds.chain(build.result)
        return chain.rootfs, chain.layers, chain.config

    async def inspect(self, sandbox_id: str) -> Instance | None:
        status = await self._runtime.inspect(sandbox_id)
        if status.lost:
            return self._instance(sandbox_id, status)
        if not status.exists or not status.running or self._launcher.pid(sandbox_id) is None:
            return None
        return self._instance(sandbox_id, status)

    @property
    def egress(self) -> Egress | None:
        """The node's sandbox network (None: loopback only): the resolver and the proxy use
        its ``gateway``, ``sandbox_by_address``, ``policy`` and ``add_resolved``."""
        return self._runtime.egress

    async def apply_network(self, sandbox_id: str, policy: NetworkPolicy) -> NetworkEnforcement:
        """Put ``policy`` in force for the running sandbox at once (one nftables batch: new
        and open connections follow it, nothing restarts); idempotent. Not enforced (and
        why): a node without egress (rootless, SANDPOD_NET=off: loopback only), a sandbox
        created before its node had egress, header injections (the egress proxy's).

        Raises:
            NetworkApplyFailed: nftables refused it; the previous policy is still in force.
        """
        try:
            await self._runtime.apply_network(sandbox_id, policy)
        except NetworkNotSupported as exc:
            return NetworkEnforcement(False, f"the sandbox has loopback only: {exc.message}")
        except InstanceNotFound:
            return NetworkEnforcement(
                False,
                "the sandbox has no network link on this node (created before the node had "
                "egress): loopback only; recreate it for its policy to apply",
            )
        except NftError as exc:
            raise NetworkApplyFailed(f"cannot apply the network policy: {exc}") from exc
        if policy.inject and self._runtime.trust is None:  # set only while a proxy runs
            return NetworkEnforcement(
                False, "header injections need the egress proxy, which this node does not run"
            )
        return NetworkEnforcement(True)

    async def pause(self, sandbox_id: str) -> None:
        await self._runtime.pause(sandbox_id)

    async def resume(self, sandbox_id: str) -> None:
        await self._runtime.resume(sandbox_id)

    async def writable_layer(self, sandbox_id: str) -> tuple[Path, int, int]:
        """(upper dir, uid, gid) of a live instance: what a template build commits.

        Raises:
            InstanceNotFound: no such instance.
        """
        status = await self._runtime.inspect(sandbox_id)
        if status.upper_dir is None or status.uid is None or status.gid is None:
            raise InstanceNotFound(f"sandbox {sandbox_id!r} has no instance", sandbox_id=sandbox_id)
        return status.upper_dir, status.uid, status.gid

    def namespace_of(self, sandbox_id: str) -> str | None:
        """The namespace of the Sandbox an instance serves (None: not ensured by this run)."""
        return self._namespaces.get(sandbox_id)

    async def stop_serving(self, sandbox_id: str, drain: float = 0.0) -> None:
        """Stop the instance's execd (requests then find no responder, and wake it again),
        letting commands already running finish for up to ``drain`` seconds (their callers
        get their answers); the jail and its processes stay until :meth:`destroy`."""
        if isinstance(self._launcher, NodeLauncher):
            await self._launcher.stop(sandbox_id, drain=drain)
        else:
            await self._launcher.stop(sandbox_id)

    async def destroy(self, sandbox_id: str) -> None:
        self._namespaces.pop(sandbox_id, None)
        self._owners.pop(sandbox_id, None)
        self._unwatch(sandbox_id)
        await self._launcher.stop(sandbox_id)
        await self._runtime.destroy(sandbox_id)
        await self._release(sandbox_id)  # its image's layers may go at the next prune
        if self.restores is not None:
            self.restores.forget(sandbox_id)

    async def list(self) -> list[str]:
        return sorted(set(await self._runtime.list()) | set(self._launcher.known()))


def _protections(status: InstanceStatus) -> dict[str, str]:
    """The instance's protections, ``rootfs`` flagged if its base is the host root (as its
    jail file records: the runtime itself reports what it mounted, not what was meant)."""
    protections = dict(status.protections)
    if status.jail_file is None or "rootfs" not in protections:
        return protections
    try:
        record = jailfile.decode(status.jail_file.read_bytes())
    except (OSError, jailfile.JailFileInvalid):
        return protections  # gone meanwhile: the next inspect says so
    if isinstance(record, jailfile.JailFile) and os.path.realpath(record.rootfs) == "/":
        protections["rootfs"] = HOST_ROOT
    return protections


def _lost_reason(status: InstanceStatus) -> ConditionReason:
    return ConditionReason.OOM_KILLED if status.oom_killed else ConditionReason.INSTANCE_LOST


def _lost_message(status: InstanceStatus) -> str:
    why = (
        "its memory cgroup's OOM killer took it: give the template more memory"
        if status.oom_killed
        else "it was killed from outside the sandbox, or the host ran out of memory"
    )
    return (
        f"the sandbox's jail is gone (its holder process exited: {why}); its processes and "
        "files are lost -- delete this sandbox and create a new one"
    )
