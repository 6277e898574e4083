"""The reconciler's view of the local runtime: a namespace jail plus an execd serving it.

``ensure`` creates the jail (:class:`LocalRuntime`) from the template's resources and env, then
starts an execd for the sandbox with ``SANDPOD_EXECD_JAIL`` pointing at the jail's file, so every
command runs inside. ``pause``/``resume`` freeze the jail's cgroup (daemons that left the process
tree included); ``destroy`` stops execd and removes every trace of the jail.
"""

from __future__ import annotations

import re
from pathlib import Path

from sandpod_contract.resources import SandboxSpec, SandboxTemplateSpec
from sandpod_lifecycle.driver import ExecdLauncher, Instance, Owner
from sandpod_lifecycle.node import NodeLauncher
from sandpod_lifecycle.runtime.base import CreateFailed, InstanceSpec, InstanceStatus, Resources
from sandpod_lifecycle.runtime.local import LocalRuntime
from sandpod_lifecycle.runtime.seccomp import mode_for

__all__ = ["LocalDriver", "parse_cpu", "parse_quantity"]

_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}  # fmt: skip
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
    )


class LocalDriver:
    name = "local"

    def __init__(self, runtime: LocalRuntime, launcher: ExecdLauncher | NodeLauncher) -> None:
        self._runtime = runtime
        self._launcher = launcher
        self._protections: dict[str, str] = {}

    def protections(self) -> dict[str, str]:
        return dict(self._protections) or {"jail": "active"}

    def _instance(self, sandbox_id: str, status: InstanceStatus) -> Instance:
        return Instance(sandbox_id, running=status.running, paused=status.paused,
                        pid=self._launcher.pid(sandbox_id), detail=status.detail,
                        protections=dict(status.protections) or None)  # fmt: skip

    async def ensure(
        self,
        sandbox_id: str,
        spec: SandboxSpec,
        template: SandboxTemplateSpec,
        owner: Owner | None = None,  # host instances belong to no API object
    ) -> Instance:
        status = await self._runtime.inspect(sandbox_id)
        if not status.exists:
            env = {e.name: e.value for e in (*template.env, *spec.env)}
            status = await self._runtime.create(
                InstanceSpec(
                    sandbox_id=sandbox_id,
                    rootfs=Path(template.rootfs) if template.rootfs else None,
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

    async def inspect(self, sandbox_id: str) -> Instance | None:
        status = await self._runtime.inspect(sandbox_id)
        if not status.exists or not status.running or self._launcher.pid(sandbox_id) is None:
            return None
        return self._instance(sandbox_id, status)

    async def pause(self, sandbox_id: str) -> None:
        await self._runtime.pause(sandbox_id)

    async def resume(self, sandbox_id: str) -> None:
        await self._runtime.resume(sandbox_id)

    async def destroy(self, sandbox_id: str) -> None:
        await self._launcher.stop(sandbox_id)
        await self._runtime.destroy(sandbox_id)

    async def list(self) -> list[str]:
        return sorted(set(await self._runtime.list()) | set(self._launcher.known()))
