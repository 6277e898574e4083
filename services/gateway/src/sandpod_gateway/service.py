"""Gateway wiring: the key store, the upstream, the ASGI app and uvicorn, owned by one
supervisor and run through the shared ``serve()`` loop.

uvicorn runs inside our event loop on a socket bound here (so port 0 works and the port is known
before the first request); its own signal handling is disabled: ``serve()`` owns SIGTERM, and
``stop()`` asks uvicorn to finish in-flight requests within the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import time
from collections.abc import Callable, Generator

import structlog
import uvicorn
from prometheus_client import CollectorRegistry

from sandpod_bus import Bus
from sandpod_contract.subjects import Subjects
from sandpod_gateway import redact
from sandpod_gateway.app import build_app
from sandpod_gateway.context import Context
from sandpod_gateway.front import FastPath, FrontProtocol
from sandpod_gateway.keys import KeyStore
from sandpod_gateway.links import LinkSigner
from sandpod_gateway.metrics import GatewayMetrics
from sandpod_gateway.native import NativeFront, find_front, with_front_peer
from sandpod_gateway.proxy import ConnectionPool
from sandpod_gateway.quotas import Quotas
from sandpod_gateway.ratelimit import RateLimiter
from sandpod_gateway.settings import GatewaySettings
from sandpod_gateway.targets import Targets
from sandpod_gateway.tickets import TicketStore
from sandpod_gateway.upstream import Upstream
from sandpod_service import Supervisor
from sandpod_service.memory import Trimmer

__all__ = ["GatewayService"]

log = structlog.get_logger("sandpod.gateway")


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # serve() owns the signals


class GatewayService:
    name = "gateway"

    def __init__(
        self,
        settings: GatewaySettings,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``clock``: wall-clock seconds for preview links' expiry (tests pass a fake one)."""
        self.settings = settings
        self.clock = clock
        self.ctx: Context | None = None
        self.registry = registry or CollectorRegistry()
        self.supervisor = Supervisor("gateway", 8)
        self._stopping = asyncio.Event()
        self.port = 0
        self._server: _Server | None = None
        self._sock: socket.socket | None = None
        self._trimmer: Trimmer | None = None
        self._fast: FastPath | None = None
        self.native: NativeFront | None = None

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.port}"

    async def start(self, bus: Bus) -> None:
        s = self.settings
        redact.install()  # uvicorn logs handshake paths: no key or ticket may reach the log
        keys = await KeyStore.open(bus, s.bucket_base, s.key_cache)
        metrics = GatewayMetrics(self.registry)
        quotas = Quotas(s.max_streams, s.tenant_max_streams, s.tenant_max_execs)
        trimmer = Trimmer()

        def on_stream(delta: int) -> None:
            metrics.streams.inc(delta)
            if delta < 0:
                trimmer.soon()  # a closed stream's buffers go back to the kernel, not the heap

        quotas.on_stream = on_stream
        self._trimmer = trimmer
        upstream = Upstream(bus, Subjects(s.prefix), s.request_timeout)
        ctx = Context(
            settings=s,
            upstream=upstream,
            keys=keys,
            limiter=RateLimiter(s.rate, s.burst, s.rate_keys),
            metrics=metrics,
            quotas=quotas,
            tickets=TicketStore(s.ticket_ttl),
            ready=asyncio.Event(),
            targets=Targets(upstream, s.preview_cache_ttl),
            signer=LinkSigner(await keys.secret("preview-links"), self.clock),
            preview_pool=ConnectionPool(s.preview_connect_timeout),
        )
        self.ctx = ctx
        self.native = native = self._native(ctx)
        self._fast = FastPath(ctx, native)
        app = build_app(ctx)
        config = uvicorn.Config(
            with_front_peer(app) if native is not None else app,
            loop="none",
            # previews on the fast path; every other request goes on to uvicorn's httptools
            http=functools.partial(FrontProtocol, fast=self._fast)  # type: ignore[arg-type]
            if s.preview_fast_path
            else "httptools",
            ws="websockets-sansio",
            lifespan="off",
            log_config=None,
            access_log=False,
            ws_ping_interval=s.keepalive,
            ws_ping_timeout=max(s.keepalive, 20.0),
            ws_max_size=4 * 1024 * 1024,
            timeout_graceful_shutdown=int(max(s.grace, 1)),
            server_header=False,
        )
        self._server = _Server(config)
        family = socket.AF_INET6 if ":" in s.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((s.host, s.port))
        sock.listen(1024)
        sock.setblocking(False)
        self._sock = sock
        self.port = int(sock.getsockname()[1])
        served = sock if native is None else native.backend_socket()
        self.supervisor.spawn(self._server.serve(sockets=[served]), name="uvicorn")
        if native is not None:
            keys.on_change = ctx.targets.on_change = native.epoch.bump
            self.supervisor.spawn(native.run(sock, self._stopping), name="front")
        self.supervisor.spawn(keys.follow(self._stopping), name="key-watch")
        ctx.ready.set()
        log.info("gateway_listening", url=self.url)

    def _native(self, ctx: Context) -> NativeFront | None:
        """sandpod-front in front of uvicorn when it is on and installed (see native.py)."""
        s = self.settings
        if not (s.preview_front and s.preview_fast_path):
            return None
        binary = find_front()
        if binary is None:
            log.info(
                "front_not_installed",
                hint="previews relay in Python; `make install` builds sandpod-front (needs cargo)",
            )
            return None
        return NativeFront(ctx, binary)

    async def stop(self, grace: float) -> None:
        if self.native is not None:
            await self.native.stop(grace)  # first: it drains its requests through uvicorn
        if self._server is not None:
            self._server.should_exit = True
        self._stopping.set()
        await self.supervisor.close(grace)
        if self.ctx is not None:
            self.ctx.preview_pool.close()
        if self._fast is not None:
            self._fast.close()
        if self.native is not None:
            self.native.close()
        if self._trimmer is not None:
            self._trimmer.cancel()
        if self._sock is not None:
            self._sock.close()
