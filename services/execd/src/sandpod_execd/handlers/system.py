"""``sys`` family: ping and info."""

from __future__ import annotations

import os
import socket
import time

from sandpod_contract.catalogue import DATA_PLANE, PROTOCOL_VERSION
from sandpod_contract.messages.common import Empty
from sandpod_contract.messages.system import Info, Pong
from sandpod_execd import __version__
from sandpod_execd.handlers import Deps, Route
from sandpod_execd.sandbox import SandboxContext

__all__ = ["SystemHandlers"]

RUNTIME = "process"
ISOLATION = "none"  # commands run on the host as execd's user; the jail comes with `local`


class SystemHandlers:
    def __init__(self, deps: Deps) -> None:
        self._settings = deps.settings
        self._max_payload = deps.max_payload
        self._started = time.time()
        self._families = tuple(sorted({op.family for op in DATA_PLANE}))

    def routes(self) -> dict[tuple[str, str], Route]:
        return {
            ("sys", "ping"): Route(self.ping, inline=True, quiet=True, activity=False),
            ("sys", "info"): Route(self.info, activity=False),
        }

    async def close(self) -> None:
        """Nothing held."""

    async def ping(self, sbx: SandboxContext, _: Empty) -> Pong:
        return Pong(sandbox_id=sbx.sandbox_id, time=time.time())

    async def info(self, sbx: SandboxContext, _: Empty) -> Info:
        s = self._settings
        return Info(
            sandbox_id=sbx.sandbox_id,
            execd_version=__version__,
            protocol_version=PROTOCOL_VERSION,
            runtime=RUNTIME,
            isolation=ISOLATION,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            started_at=self._started,
            workspace=str(sbx.workspace),
            max_request_bytes=s.max_request_bytes,
            max_payload=self._max_payload,
            default_window=s.default_window,
            max_window=s.max_window,
            default_max_output=s.default_max_output,
            families=self._families,
        )
