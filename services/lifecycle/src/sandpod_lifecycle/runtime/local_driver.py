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
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable
from pathlib import Path

import structlog

from sandpod_contract.resources import ConditionReason, SandboxSpec, SandboxTemplateSpec
from sandpod_lifecycle.builds.cache import BuildCache
from sandpod_lifecycle.driver import ExecdLauncher, Instance, Owner
from sandpod_lifecycle.node import NodeLauncher
from sandpod_lifecycle.runtime.base import (
    CreateFailed,
    InstanceNotFound,
    InstanceSpec,
    InstanceStatus,
    InstanceUnhealthy,
    Resources,
)
from sandpod_lifecycle.runtime.local import LocalRuntime
from sandpod_lifecycle.runtime.seccomp import mode_for

__all__ = ["LocalDriver", "parse_cpu", "parse_quantity"]

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


class LocalDriver:
    name = "local"

    def __init__(
        self,
        runtime: LocalRuntime,
        launcher: ExecdLauncher | NodeLauncher,
        builds: BuildCache | None = None,
    ) -> None:
        self._runtime = runtime
        self.builds = builds  # the template build cache whose layers built templates stack
        self._launcher = launcher
        self._protections: dict[str, str] = {}
        self._watched: dict[str, int] = {}  # sandbox id -> pidfd of its holder (on the loop)
        self._on_lost: Callable[[str], None] | None = None

    def protections(self) -> dict[str, str]:
        return dict(self._protections) or {"jail": "active"}

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
            protections=dict(status.protections) or None,
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
        status = await self._runtime.inspect(sandbox_id)
        if status.lost:  # never serve a dead jail (nor replace it: its workspace is its state)
            raise InstanceUnhealthy(
                _lost_message(status), reason=_lost_reason(status), terminal=True
            )
        if not status.exists:
            rootfs, layers, base_env = self._root(template)
            env = {**base_env, **{e.name: e.value for e in (*template.env, *spec.env)}}
            status = await self._runtime.create(
                InstanceSpec(
                    sandbox_id=sandbox_id,
                    rootfs=rootfs,
                    layers=layers,
                    resources=_resources(template),
                    env=env,
                    egress=bool(template.egress),
                    seccomp=mode_for(
                        template.security.seccomp, template.security.allow_nested_user_namespaces
                    ),
                )
            )
        self._protections = dict(status.protections)
        if self._launcher.pid(sandbox_id) is None:
            if status.jail_file is None:  # traces without a jail file: not an instance to serve
                raise CreateFailed(
                    f"sandbox {sandbox_id!r} has {status.detail or 'no jail file'} on this host "
                    "(a create that crashed half-way); they are removed and the create retried",
                    sandbox_id=sandbox_id,
                )
            await self._launcher.start(sandbox_id, {"SANDPOD_EXECD_JAIL": str(status.jail_file)})
        return self._instance(sandbox_id, status)

    def _root(
        self, template: SandboxTemplateSpec
    ) -> tuple[Path | None, tuple[Path, ...], dict[str, str]]:
        """(base, layers, env) of the template's root: a built template's chain from the
        build cache (its config's env under the template's own), else its ``rootfs``."""
        build = template.build
        if build is None:
            return (Path(template.rootfs) if template.rootfs else None), (), {}
        if not build.result or self.builds is None:
            raise CreateFailed(
                "the template is not built yet (its build is running or failed: see "
                "sandpod template get)",
            )
        chain = self.builds.chain(build.result)
        return chain.rootfs, chain.layers, dict(chain.config.env)

    async def inspect(self, sandbox_id: str) -> Instance | None:
        status = await self._runtime.inspect(sandbox_id)
        if status.lost:
            return self._instance(sandbox_id, status)
        if not status.exists or not status.running or self._launcher.pid(sandbox_id) is None:
            return None
        return self._instance(sandbox_id, status)

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

    async def destroy(self, sandbox_id: str) -> None:
        self._unwatch(sandbox_id)
        await self._launcher.stop(sandbox_id)
        await self._runtime.destroy(sandbox_id)

    async def list(self) -> list[str]:
        return sorted(set(await self._runtime.list()) | set(self._launcher.known()))


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
