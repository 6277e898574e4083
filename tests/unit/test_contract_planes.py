"""The services serve the planes the contract describes: same queue groups, same operations.

``schemas/subjects.json`` (generated from ``sandpod_contract.catalogue``) tells other-language
clients who answers what; these tests keep the services' wiring and that table in step.
"""

from __future__ import annotations

import pytest

from sandpod_contract.catalogue import DATA, EVENTS, LIFECYCLE, NODE, POOL
from sandpod_contract.messages.node import NODE_PLANE
from sandpod_contract.messages.pools import POOL_PLANE
from sandpod_contract.messages.sandboxes import CONTROL_PLANE, NetworkEvent, SandboxEvent
from sandpod_contract.subjects import Subjects


@pytest.fixture(scope="session")
def _session_daemons() -> None:
    """No nats-server or execd: nothing here talks to NATS."""


def test_queue_groups_are_the_services_own() -> None:
    """Each plane's queue group is the one its service subscribes in."""
    from sandpod_execd.service import QUEUE_GROUP as EXECD
    from sandpod_lifecycle.service import QUEUE_GROUP as LIFECYCLE_GROUP
    from sandpod_pool.service import QUEUE_GROUP as POOL_GROUP

    assert (DATA.queue, LIFECYCLE.queue, POOL.queue) == (EXECD, LIFECYCLE_GROUP, POOL_GROUP)
    assert NODE.queue is None  # one execd per node id: a plain subscription


def test_planes_hold_the_tables_the_services_serve() -> None:
    """The lifecycle, pool and node planes are the tables the services route by."""
    assert LIFECYCLE.operations is CONTROL_PLANE
    assert POOL.operations is POOL_PLANE
    assert NODE.operations is NODE_PLANE
    kinds = {op.family for op in (*CONTROL_PLANE, *POOL_PLANE)}
    assert kinds == {"sandboxes", "templates", "snapshots", "volumes", "pools", "claims"}


def test_plane_subjects_are_what_the_builders_build() -> None:
    """Each plane's subject pattern, filled in, is what ``Subjects`` builds for that verb."""
    acme = Subjects("acme")
    fill = {"<prefix>": "acme", "<sandbox>": "demo", "<node>": "n1"}

    def filled(pattern: str) -> str:
        for key, value in fill.items():
            pattern = pattern.replace(key, value)
        return pattern

    for op in DATA.operations:
        assert filled(DATA.subject_of(op)) == acme.sandbox("demo", op.family, op.verb)
    for plane in (LIFECYCLE, POOL):
        for op in plane.operations:
            assert filled(plane.subject_of(op)) == acme.api(op.family, op.verb)
    for op in NODE.operations:
        assert filled(NODE.subject_of(op)) == acme.node("n1", op.family, op.verb)


def test_lifecycle_events_are_the_contract_events() -> None:
    """The lifecycle publishes SandboxEvent and NetworkEvent (and SandboxEvents of volumes) on
    the stream the contract names."""
    from sandpod_lifecycle import events

    sandbox, network, volume = EVENTS
    assert (sandbox.message, network.message, volume.message) == (
        SandboxEvent,
        NetworkEvent,
        SandboxEvent,
    )
    for stream in (sandbox, network, volume):
        assert stream.stream.replace("<storage>", "sandpod") == events.STREAM
        subject = stream.subject.replace("<prefix>", "acme").replace("<name>", "demo")
        for event_type in stream.types:
            assert subject.replace("<type>", event_type) == Subjects("acme").event(
                stream.kind, "demo", event_type
            )
