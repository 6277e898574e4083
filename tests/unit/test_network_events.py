"""The network events (``event.network``): ``updated`` and ``denied`` on their subjects, in
the contract's shape, denials rate-limited on a bucket of their own."""

from __future__ import annotations

import pytest
from test_instance_loss_parts import Clock, FakeBus

from sandpod_contract.codec import decode
from sandpod_contract.messages.sandboxes import NetworkEvent
from sandpod_contract.subjects import Subjects
from sandpod_lifecycle.events import EventLimits, Events


@pytest.fixture(scope="session")
def _session_daemons() -> None:
    """No nats-server or execd: fakes only."""


class PayloadBus(FakeBus):
    """Keeps the payloads too."""

    def __init__(self) -> None:
        super().__init__()
        self.payloads: list[bytes] = []

    async def js_publish(self, subject: str, payload: bytes) -> int:
        self.payloads.append(payload)
        return await super().js_publish(subject, payload)


async def test_updated_and_denied_events_have_the_contract_shape() -> None:
    """Both decode as event.network with their fields, on <prefix>.events.network.<name>.*."""
    bus = PayloadBus()
    events = Events(bus, Subjects("t"), clock=Clock())  # type: ignore[arg-type]
    policy = {"mode": "deny-all", "allow": [], "deny": []}
    await events.publish_network(
        name="s1",
        namespace="default",
        type_="updated",
        generation=3,
        policy=policy,
        enforced=False,
        reason="process runtime: not enforced",
    )
    sent = await events.publish_denied(
        name="s1",
        namespace="default",
        kind="connect",
        destination="169.254.169.254",
        port=80,
        rule="metadata",
        count=2,
    )
    assert sent and bus.published == ["t.events.network.s1.updated", "t.events.network.s1.denied"]
    updated, denied = (decode(NetworkEvent, p) for p in bus.payloads)
    assert (updated.type, updated.generation, updated.policy, updated.enforced) == (
        "updated",
        3,
        policy,
        False,
    )
    assert (denied.kind, denied.destination, denied.port, denied.rule, denied.count) == (
        "connect",
        "169.254.169.254",
        80,
        "metadata",
        2,
    )


async def test_a_flood_of_denials_is_bounded_and_leaves_lifecycle_events_alone() -> None:
    """Past the burst denials are refused (the caller is told, to count them into the next);
    the same sandbox's lifecycle events still go out."""
    bus = PayloadBus()
    events = Events(bus, Subjects("t"), limits=EventLimits(burst=3), clock=Clock())  # type: ignore[arg-type]
    sent = [
        await events.publish_denied(
            name="s1", namespace="default", kind="dns", destination="x.test", port=None, rule="r"
        )
        for _ in range(50)
    ]
    assert sent.count(True) == 3 and not any(sent[3:])
    await events.publish(name="s1", namespace="default", type_="ready", phase="Running")
    assert bus.published[-1] == "t.events.sandbox.s1.ready"
