"""One execd per host serving every local sandbox (node mode): a sandbox is a subscription in a
running daemon, not a new interpreter, so creating one takes milliseconds and costs a few hundred
KiB instead of ~35 MiB.

:class:`NodeLauncher` has the launcher surface the drivers use (``start``/``stop``/``pid``/
``known``): ``start`` makes sure the node's execd runs (a pid file in the state dir, so replicas
on one host share it and a restarted lifecycle adopts it) and asks it to ``serve`` the sandbox;
``stop`` asks it to ``release``. If the node execd is replaced, what it served is forgotten and
the reconciler's next pass serves it again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping

from sandpod_contract.codec import Message
from sandpod_contract.errors import SandpodError
from sandpod_contract.messages.common import Empty
from sandpod_contract.messages.node import NodeSandboxes, Release, Serve
from sandpod_lifecycle.driver import ExecdLauncher, LauncherBusy

__all__ = ["NodeLauncher"]

Request = Callable[[str, Message], Awaitable[NodeSandboxes]]  # verb, message -> reply
START_TIMEOUT = 30.0


class NodeLauncher:
    def __init__(
        self, processes: ExecdLauncher, node: str, request: Request, *, jails: str | None = None
    ) -> None:
        """``jails``: the jail file of every sandbox (``{sandbox_id}`` in it), handed to the
        node's execd as its configuration (``SANDPOD_EXECD_JAIL``); None: the process runtime.
        """
        self._processes = processes
        self._jails = jails
        self.node = node
        self._key = f"node-{node}"
        self._request = request
        self._served: set[str] = set()
        self._node_pid: int | None = None
        self._listed: int | None = None  # the node execd whose list ``_served`` holds
        self._lock = asyncio.Lock()

    def _alive(self) -> int | None:
        pid = self._processes.pid(self._key)
        if pid != self._node_pid:  # a new (or no) node execd: it serves nothing we know of
            self._served.clear()
            self._node_pid = pid
        return pid

    async def _ensure_node(self) -> int:
        pid = self._alive()
        if pid is not None and pid == self._listed:  # running, and its list is known: no lock,
            return pid  # no round trip (creates at once do not queue behind each other here)
        async with self._lock:
            pid = self._alive()
            deadline = time.monotonic() + START_TIMEOUT
            env = {"SANDPOD_EXECD_NODE": self.node, "SANDPOD_SANDBOX_ID": ""}
            if self._jails:
                env["SANDPOD_EXECD_JAIL"] = self._jails
            while pid is None:
                try:
                    await self._processes.start(self._key, env)  # ours, or adopted
                except LauncherBusy:  # another replica on this host is starting it right now
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.05)
                    continue
                pid = self._alive()
                break
            while True:
                try:
                    self._served = set((await self._request("list", Empty())).sandbox_ids)
                    break
                except SandpodError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.02)
            if pid is None:  # started, answered, but its record is gone: someone stopped it
                raise LauncherBusy(f"the node execd of {self.node!r} exited while starting")
            self._listed = pid
            return pid

    async def start(self, sandbox_id: str, env: Mapping[str, str]) -> int:
        pid = await self._ensure_node()
        reply = await self._request("serve", Serve(sandbox_id=sandbox_id))
        self._served = set(reply.sandbox_ids)
        return pid

    async def stop(self, sandbox_id: str, grace: float = 5.0, *, drain: float = 0.0) -> None:
        """Stop serving ``sandbox_id`` (``drain``: let its running commands finish that long)."""
        if self._alive() is None:
            self._served.discard(sandbox_id)
            return
        try:
            release = Release(sandbox_id=sandbox_id, drain=drain)
            self._served = set((await self._request("release", release)).sandbox_ids)
        except SandpodError:
            self._served.discard(sandbox_id)

    def pid(self, sandbox_id: str) -> int | None:
        pid = self._alive()
        return pid if pid is not None and sandbox_id in self._served else None

    def known(self) -> list[str]:
        self._alive()
        return sorted(self._served)

    async def shutdown(self) -> None:
        """Stop the node's execd (``sandpod up`` leaving nothing behind)."""
        await self._processes.stop(self._key)
