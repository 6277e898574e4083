"""The ``process`` runtime: an execd per sandbox on the host, **no isolation**.

For hosts where the local jail is unavailable and for development. Every Sandbox it runs carries
``Isolated=False`` with reason ``NoIsolation``, and ``sandpod up`` says so.
"""

from __future__ import annotations

import json
import signal

from sandpod_contract.resources import ConditionReason, SandboxSpec, SandboxTemplateSpec
from sandpod_lifecycle.driver import (
    ExecdLauncher,
    Instance,
    LauncherBusy,
    NoNetworkEnforcement,
    Owner,
)
from sandpod_lifecycle.runtime.base import InstanceUnhealthy
from sandpod_service.procs import signal_tree

__all__ = ["HOST_ADDRESS", "ProcessDriver"]

# Commands run on the host, so a server a sandbox starts listens on the host's loopback: that
# is the address the gateway's preview URLs and port-forwards connect to.
HOST_ADDRESS = "127.0.0.1"


class ProcessDriver(NoNetworkEnforcement):
    """``apply_network`` reports the policy as not enforced: commands share the host's network."""

    name = "process"

    def __init__(self, launcher: ExecdLauncher) -> None:
        self._launcher = launcher
        self._paused: set[str] = set()

    def protections(self) -> dict[str, str]:
        reason = "process runtime: commands run on the host as execd's user"
        names = ("namespaces", "filesystem", "cgroups", "network")
        return dict.fromkeys(names, f"inactive ({reason})")

    async def ensure(
        self,
        sandbox_id: str,
        spec: SandboxSpec,
        template: SandboxTemplateSpec,
        owner: Owner | None = None,  # host instances belong to no API object
    ) -> Instance:
        pid = self._launcher.pid(sandbox_id)
        if pid is None:
            env = {e.name: e.value for e in (*template.env, *spec.env)}
            try:
                pid = await self._launcher.start(sandbox_id, {"SANDPOD_EXECD_ENV": json.dumps(env)})
            except LauncherBusy as exc:  # being started elsewhere: wait for it, destroy nothing
                raise InstanceUnhealthy(
                    exc.message, reason=ConditionReason.INSTANCE_STARTING, terminal=False
                ) from exc
        return Instance(
            sandbox_id,
            running=True,
            paused=sandbox_id in self._paused,
            pid=pid,
            address=HOST_ADDRESS,
        )

    async def inspect(self, sandbox_id: str) -> Instance | None:
        pid = self._launcher.pid(sandbox_id)
        if pid is None:
            return None
        return Instance(
            sandbox_id,
            running=True,
            paused=sandbox_id in self._paused,
            pid=pid,
            address=HOST_ADDRESS,
        )

    async def pause(self, sandbox_id: str) -> None:
        # Without cgroups, stopping execd (SIGSTOP) is the only freeze there is.
        pid = self._launcher.pid(sandbox_id)
        if pid is not None:
            signal_tree(pid, signal.SIGSTOP)  # execd and every command it started
            self._paused.add(sandbox_id)

    async def resume(self, sandbox_id: str) -> None:
        pid = self._launcher.pid(sandbox_id)
        if pid is not None:
            signal_tree(pid, signal.SIGCONT)
        self._paused.discard(sandbox_id)

    async def destroy(self, sandbox_id: str) -> None:
        await self.resume(sandbox_id)
        await self._launcher.stop(sandbox_id)

    async def list(self) -> list[str]:
        return [i for i in self._launcher.known() if self._launcher.pid(i) is not None]
