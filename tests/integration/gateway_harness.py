"""Fixtures for the gateway tests: a real gateway (in this process, or as a subprocess) on a
free loopback port, talking to the session's nats-server, and API keys minted in its bucket.

Import the fixtures into a test module with ``from gateway_harness import *``-free explicit
names (pytest finds fixtures imported into the module).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import pytest

from conftest import NatsServer, free_port, wait_until
from sandpod_bus import Bus, BusSettings
from sandpod_gateway.keys import KeyStore
from sandpod_gateway.service import GatewayService
from sandpod_gateway.settings import GatewaySettings


@dataclasses.dataclass
class Gateway:
    service: GatewayService
    bus: Bus

    @property
    def url(self) -> str:
        return self.service.url

    def client(self, key: str | None = None, **kw: object) -> httpx.AsyncClient:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=60, **kw)  # type: ignore[arg-type]


GatewayFactory = Callable[..., Awaitable[Gateway]]


async def open_gateway(
    nats_url: str, *, clock: Callable[[], float] = time.time, **overrides: object
) -> Gateway:
    """A gateway in this process, on the running event loop (stop it with ``close_gateway``);
    keyword arguments override settings; ``clock``: the wall clock preview links expire by."""
    settings = dataclasses.replace(
        GatewaySettings(bus=BusSettings(url=nats_url, name="gateway-test"), port=0, grace=2.0),
        **overrides,  # type: ignore[arg-type]
    )
    bus = await Bus.connect(settings.bus)
    service = GatewayService(settings, clock=clock)
    await service.start(bus)
    return Gateway(service, bus)


async def close_gateway(gw: Gateway) -> None:
    await gw.service.stop(2.0)
    await gw.bus.drain()


@pytest.fixture
async def start_gateway(nats: NatsServer) -> AsyncIterator[GatewayFactory]:
    """Start in-process gateways (stopped at teardown); see ``open_gateway``."""
    started: list[Gateway] = []

    async def start(clock: Callable[[], float] = time.time, **overrides: object) -> Gateway:
        gw = await open_gateway(nats.url, clock=clock, **overrides)
        started.append(gw)
        return gw

    yield start
    for gw in started:
        await close_gateway(gw)


@pytest.fixture
async def gateway(start_gateway: GatewayFactory) -> Gateway:
    """One gateway with the default prefix and a short keepalive."""
    return await start_gateway(keepalive=0.2)


async def mint_key(
    gw: Gateway, tenant: str, *, admin: bool = False, permanent: bool = False
) -> str:
    """A fresh API key for ``tenant`` in the gateway's key bucket (``admin``: may read
    /metrics; ``permanent``: may create permanent sandboxes)."""
    store = await KeyStore.open(gw.bus, gw.service.settings.bucket_base)
    token, _ = await store.create(tenant, admin=admin, permanent=permanent)
    return token


def unique_tenant() -> str:
    return f"t{uuid.uuid4().hex[:8]}"


class GatewayProcess:
    """``python -m sandpod_gateway`` as a child process (for memory and replica tests)."""

    def __init__(self, nats_url: str, log: Path, **env: str) -> None:
        self.port = free_port()
        self.log = log
        full = {
            **os.environ,
            "SANDPOD_NATS_URL": nats_url,
            "SANDPOD_GATEWAY_PORT": str(self.port),
            "SANDPOD_LOG_LEVEL": "warning",
            **env,
        }
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sandpod_gateway"], env=full, stdout=out, stderr=out
            )
        wait_until(self._ready, 20, f"gateway on port {self.port}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            pytest.fail(f"gateway exited with {self.proc.returncode}:\n{self.log.read_text()}")
        try:
            return httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
                pytest.fail("gateway did not stop within 15s of SIGTERM")
        return self.proc.returncode


@pytest.fixture
def gateway_procs(nats: NatsServer, tmp_path: Path) -> Iterator[Callable[..., GatewayProcess]]:
    """Factory for gateway child processes, stopped (SIGTERM) at teardown."""
    started: list[GatewayProcess] = []

    def start(**env: str) -> GatewayProcess:
        gp = GatewayProcess(nats.url, tmp_path / f"gateway-{len(started)}.log", **env)
        started.append(gp)
        return gp

    yield start
    for gp in started:
        assert gp.stop() == 0, gp.log.read_text()


@pytest.fixture
def lifecycle_prefix(nats: NatsServer, tmp_path: Path) -> Iterator[str]:
    """A lifecycle replica (process runtime) on a private prefix; instances killed at teardown."""
    prefix = f"g{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "SANDPOD_NATS_URL": nats.url,
        "SANDPOD_PREFIX": prefix,
        "SANDPOD_STATE_DIR": str(tmp_path),
        "SANDPOD_RESYNC": "0.5",
        "SANDPOD_RUNTIME": "process",
        "SANDPOD_DESTROY_ON_EXIT": "true",
    }
    with (tmp_path / "lifecycle.log").open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sandpod_lifecycle"], env=env, stdout=out, stderr=out
        )
    yield prefix
    proc.terminate()
    proc.wait(30)


@pytest.fixture
def pool_service(nats: NatsServer, tmp_path: Path, lifecycle_prefix: str) -> Iterator[str]:
    """A pool-service replica next to ``lifecycle_prefix``'s lifecycle; yields the prefix."""
    env = {
        **os.environ,
        "SANDPOD_NATS_URL": nats.url,
        "SANDPOD_PREFIX": lifecycle_prefix,
        "SANDPOD_POOL_RESYNC": "0.3",
    }
    with (tmp_path / "pool.log").open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sandpod_pool"], env=env, stdout=out, stderr=out
        )
    yield lifecycle_prefix
    proc.terminate()
    proc.wait(30)
