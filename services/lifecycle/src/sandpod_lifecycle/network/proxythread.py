"""The egress proxy on its own event loop in a dedicated thread (why: see ``proxy.py``).

The lifecycle constructs an :class:`~.proxy.EgressProxy`, binds the listening sockets here
(in the calling thread, so a bind error is raised to the caller and the sockets belong to the
caller's network namespace), and stops it at shutdown: the loop's connection tasks are
cancelled, every socket closed, the thread joined.

How the lifecycle (local runtime, root) wires it, once per installation::

    ca = InterceptionCA(state_dir / "egress-ca", installation.id)
    secrets = FileSecretStore(state_dir / "secrets")
    proxy = EgressProxy(
        ProxySettings.from_env(os.environ),          # in LifecycleSettings, read once
        lookup=sandbox_lookup,                       # the SandboxLookup the resolver gets
        resolved_names=resolver.resolved_names,      # NodeResolver
        on_denied=report_denial,                     # the resolver's: Events.publish_denied
        forbidden=HardDenies([pool, *host_networks]),
        ca=ca, secrets=secrets,
        metrics=ProxyMetrics(registry, denied=network_metrics.denied),  # NetworkMetrics
        owner_loop=asyncio.get_running_loop(),       # lookups run on the lifecycle's loop
    )
    thread = ProxyThread(proxy, [listen(str(plan.gateway), port)])
    thread.start()   # the firewall's FirewallConfig.proxy_port = port
    ...
    thread.stop()    # at shutdown, after the firewall table is gone
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Sequence

from sandpod_lifecycle.network.proxy import EgressProxy

__all__ = ["ProxyThread", "listen"]


def listen(host: str, port: int = 0, backlog: int = 1024) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


class ProxyThread:
    def __init__(self, proxy: EgressProxy, listeners: Sequence[socket.socket]) -> None:
        self.proxy = proxy
        self.listeners = list(listeners)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sandpod-egress", daemon=True)
        self.error: BaseException | None = None

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [s.getsockname()[:2] for s in self.listeners]

    def start(self, timeout: float = 10.0) -> None:
        """Start serving. Raises RuntimeError when the loop did not come up in ``timeout``."""
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("egress proxy thread did not start")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving (idempotent): cancel connections, close sockets, join the thread."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and self._thread.is_alive():
            loop.call_soon_threadsafe(stop.set)
        if self._thread.is_alive():
            self._thread.join(timeout)
        for sock in self.listeners:
            sock.close()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported to the owner through ``error``
            self.error = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with asyncio.TaskGroup() as tg:
            serving = tg.create_task(self.proxy.serve(self.listeners))
            self._ready.set()
            await self._stop.wait()
            serving.cancel()
