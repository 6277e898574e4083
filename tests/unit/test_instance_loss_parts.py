"""The parts that keep a lost instance from flooding: per-object event rate limits, a bounded
event stream, status writes and events only on real transitions, and the local driver's
reading of a dead jail (terminal, OOMKilled or InstanceLost)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from test_reconciler import Events as RecordedEvents
from test_reconciler import FakeDriver, _reconciler, _sandbox

from sandpod_contract.resources import SandboxSpec, SandboxTemplateSpec
from sandpod_contract.subjects import Subjects
from sandpod_lifecycle import events as events_module
from sandpod_lifecycle.driver import Instance
from sandpod_lifecycle.events import EventLimits, Events, RateLimiter
from sandpod_lifecycle.reconciler import Outcome
from sandpod_lifecycle.runtime.base import InstanceStatus, InstanceUnhealthy
from sandpod_lifecycle.runtime.local_driver import LocalDriver
from sandpod_lifecycle.settings import LifecycleSettings
from sandpod_service.env import SettingsError
from sandpod_store import MemoryStore


@pytest.fixture(scope="session")
def _session_daemons() -> None:
    """No nats-server or execd: fakes only."""


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeBus:
    def __init__(self) -> None:
        self.published: list[str] = []
        self.streams: list[tuple[str, list[str], float, dict[str, int | str | None]]] = []

    async def ensure_stream(
        self, name: str, subjects: list[str], max_age: float, **bounds: int | str | None
    ) -> None:
        self.streams.append((name, subjects, max_age, bounds))

    async def js_publish(self, subject: str, payload: bytes) -> int:
        self.published.append(subject)
        return len(self.published)


def test_the_rate_limiter_allows_a_burst_then_the_refill_rate() -> None:
    """Each key gets ``burst`` at once, then ``rate`` per second; refusals are counted in a row
    (so the caller logs the first only); other keys are not affected."""
    clock = Clock()
    limiter = RateLimiter(burst=3, rate=1.0, clock=clock)
    assert [limiter.allow("a") for _ in range(5)] == [
        (True, 0),
        (True, 0),
        (True, 0),
        (False, 1),
        (False, 2),
    ]
    assert limiter.allow("b") == (True, 0)
    clock.now += 1.0
    assert limiter.allow("a") == (True, 0)
    assert limiter.allow("a") == (False, 1)
    assert limiter.dropped == 3


def test_the_rate_limiter_remembers_a_bounded_number_of_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past MAX_TRACKED keys the least recently used is forgotten (memory stays bounded)."""
    monkeypatch.setattr(events_module, "MAX_TRACKED", 4)
    limiter = RateLimiter(burst=1, rate=0.001, clock=Clock())
    for key in "abcdef":
        assert limiter.allow(key) == (True, 0)
    assert len(limiter._buckets) == 4
    assert limiter.allow("a") == (True, 0)  # forgotten: a fresh bucket
    assert limiter.allow("f") == (False, 1)


async def test_events_bound_the_stream_and_drop_a_flood_per_object() -> None:
    """setup() asks for a stream bounded in bytes, age and per subject (naming the setting of
    its size, for the error if JetStream has no room); a flood of one object's events
    publishes ``burst`` of them, another object's still get through."""
    bus, clock = FakeBus(), Clock()
    limits = EventLimits(max_bytes=8 << 20, max_age=3600, max_msgs_per_subject=10, burst=5)
    events = Events(bus, Subjects("t"), stream="t-events", limits=limits, clock=clock)  # type: ignore[arg-type]
    await events.setup()
    assert bus.streams == [
        (
            "t-events",
            ["t.events.>"],
            3600,
            {
                "max_bytes": 8 << 20,
                "max_msgs_per_subject": 10,
                "size_setting": "SANDPOD_EVENTS_MAX_BYTES",
            },
        )
    ]
    for _ in range(500):
        await events.publish(name="flappy", namespace="default", type_="ready", phase="Running")
    await events.publish(name="calm", namespace="default", type_="ready", phase="Running")
    assert bus.published.count("t.events.sandbox.flappy.ready") == 5
    assert bus.published[-1] == "t.events.sandbox.calm.ready"


def test_event_limits_are_settings_with_safe_defaults() -> None:
    """SANDPOD_EVENTS_* set the stream's bounds; unset, they are bounded; nonsense is refused."""
    default = LifecycleSettings.from_env({}).events
    assert default.max_bytes > 0 and default.max_age > 0 and default.max_msgs_per_subject > 0
    env = {
        "SANDPOD_EVENTS_MAX_BYTES": str(2 << 20),
        "SANDPOD_EVENTS_MAX_AGE": "600",
        "SANDPOD_EVENTS_MAX_PER_SUBJECT": "7",
        "SANDPOD_EVENTS_BURST": "3",
        "SANDPOD_EVENTS_RATE": "0.5",
    }
    assert LifecycleSettings.from_env(env).events == EventLimits(
        max_bytes=2 << 20, max_age=600, max_msgs_per_subject=7, burst=3, rate=0.5
    )
    for name, bad in (
        ("SANDPOD_EVENTS_MAX_BYTES", "-1"),
        ("SANDPOD_EVENTS_MAX_AGE", "0"),
        ("SANDPOD_EVENTS_BURST", "x"),
    ):
        with pytest.raises(SettingsError, match=name):
            LifecycleSettings.from_env({name: bad})


class VanishingDriver(FakeDriver):
    """Today's shape of a dead jail: inspect() finds no instance while ensure() finds the old
    one (and its execd answers), so every pass "creates" it again."""

    async def inspect(self, sid: str) -> Instance | None:
        return None


async def test_a_pass_that_changes_nothing_writes_nothing_and_publishes_nothing() -> None:
    """Fifty passes over an instance that keeps looking new: one ``ready`` event and one
    status write, not fifty (each write's watch event would start the next pass)."""
    store, driver, events = MemoryStore(), VanishingDriver(), RecordedEvents()
    rec = _reconciler(store, driver, events)
    await _sandbox(store)
    assert await rec.reconcile("s1") is Outcome.DONE
    first = await store.get("Sandbox", "default", "s1")
    for _ in range(50):
        assert await rec.reconcile("s1") is Outcome.DONE
    assert events.types == ["ready"]
    after = await store.get("Sandbox", "default", "s1")
    assert after.metadata.resource_version == first.metadata.resource_version


class Runtime:
    def __init__(self, status: InstanceStatus) -> None:
        self.status = status

    async def inspect(self, sandbox_id: str) -> InstanceStatus:
        return self.status


class Launcher:
    def pid(self, sandbox_id: str) -> int | None:
        return 4242


@pytest.mark.parametrize(("oom", "reason"), [(True, "OOMKilled"), (False, "InstanceLost")])
async def test_a_dead_jail_is_a_terminal_instance_with_a_stable_reason(
    oom: bool, reason: str
) -> None:
    """The local driver reports a jail whose holder exited as terminal (OOMKilled when its
    memory cgroup's OOM killer could pick the holder and killed; else InstanceLost) and never
    serves it again through ensure()."""
    lost = InstanceStatus(
        sandbox_id="s1",
        exists=True,
        jail_file=Path("/nonexistent"),
        detail="holder exited",
        lost=True,
        oom_killed=oom,
    )
    driver = LocalDriver(Runtime(lost), Launcher())  # type: ignore[arg-type]
    instance = await driver.inspect("s1")
    assert instance is not None and instance.terminal and instance.reason == reason
    assert "create a new one" in instance.detail
    with pytest.raises(InstanceUnhealthy) as caught:
        await driver.ensure("s1", SandboxSpec(), SandboxTemplateSpec())
    assert caught.value.terminal and caught.value.reason == reason
    alive = dataclasses.replace(lost, running=True, lost=False, oom_killed=False, holder_pid=None)
    driver = LocalDriver(Runtime(alive), Launcher())  # type: ignore[arg-type]
    instance = await driver.inspect("s1")
    assert instance is not None and instance.running and not instance.terminal
