"""The bus is a transport: "no responders" is its own error, and each caller says what it means.

The bus raises :class:`NoResponders` (a transport error, no wire code) for every subject; the
protocol client maps it to ``sandbox.not_found`` for a sandbox's data plane (in its caller's
words), the SDK's control calls to "no lifecycle/pool service answers", the gateway to the
tenant's 404 without internal subjects (test_gateway_execd_loss.py).
"""

from __future__ import annotations

import uuid

import pytest

from conftest import NatsServer
from sandpod import AsyncSandbox
from sandpod.errors import SandboxError, SandboxNotFound
from sandpod_bus import Bus, BusSettings, NoResponders
from sandpod_client import Channel
from sandpod_contract.messages.common import Empty
from sandpod_contract.messages.system import Pong
from sandpod_contract.subjects import Subjects

__all__: list[str] = []


async def test_bus_raises_no_responders_not_a_domain_error(nats: NatsServer) -> None:
    """A request nobody serves raises NoResponders naming the subject, not SandboxNotFound."""
    bus = await Bus.connect(BusSettings(url=nats.url))
    try:
        with pytest.raises(NoResponders) as info:
            await bus.request(f"nobody.{uuid.uuid4().hex}", b"", 5)
        assert not isinstance(info.value, SandboxNotFound)
        assert info.value.subject.startswith("nobody.")
    finally:
        await bus.drain()


async def test_channel_maps_no_responders_to_its_callers_sandbox_not_found(
    nats: NatsServer,
) -> None:
    """The protocol client turns NoResponders on a sandbox subject into sandbox.not_found,
    worded by its caller (here: no subject, only the name given)."""
    bus = await Bus.connect(BusSettings(url=nats.url))
    try:
        ch = Channel(
            bus,
            Subjects(),
            f"gone-{uuid.uuid4().hex[:8]}",
            not_found=lambda _: SandboxNotFound("x"),
        )
        with pytest.raises(SandboxNotFound) as info:
            await ch.call("sys", "ping", Empty(), Pong, 5)
        assert info.value.message == "x" and isinstance(info.value.__cause__, NoResponders)
    finally:
        await bus.drain()


async def test_sdk_control_call_without_lifecycle_is_a_sandbox_error_with_a_hint(
    nats: NatsServer,
) -> None:
    """An SDK control-plane call nobody serves says which service is missing."""
    async with await AsyncSandbox.connect(
        "x", nats_url=nats.url, prefix=f"p{uuid.uuid4().hex[:8]}"
    ) as sbx:
        with pytest.raises(SandboxError) as info:
            await sbx.describe()
    assert "lifecycle service" in info.value.message
    assert not isinstance(info.value, NoResponders)
