"""`sandpod up` checks that its nats-server's JetStream has room for the event stream first."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sandpod._jetstream_room import EVENTS_MAX_BYTES, MIN_EVENTS_BYTES, jetstream_file_store
from sandpod.supervisor import PlatformConfig, StartupError, Supervisor
from sandpod_lifecycle.events import EventLimits

PiB = 1 << 50


def test_the_embedded_event_stream_is_sized_as_the_lifecycle_sizes_it() -> None:
    """What `sandpod up` checks and passes on is the lifecycle's own default, and its floor
    is the lifecycle's (a smaller size would be refused there)."""
    assert EventLimits().max_bytes == EVENTS_MAX_BYTES
    EventLimits(max_bytes=MIN_EVENTS_BYTES)
    with pytest.raises(ValueError, match="max_bytes >= 1 MiB"):
        EventLimits(max_bytes=MIN_EVENTS_BYTES - 1)


def test_jetstream_gets_three_quarters_of_the_free_space_and_of_what_it_holds(
    tmp_path: Path,
) -> None:
    """nats-server's default max_file_store: 75% of the free space where it stores, plus 75%
    of what its streams hold there already (they are recovered at its start)."""
    (tmp_path / "jetstream" / "s1").mkdir(parents=True)
    (tmp_path / "jetstream" / "s1" / "1.blk").write_bytes(b"x" * 4096)
    (tmp_path / "jetstream" / "meta.inf").write_bytes(b"y" * 1000)
    room, free = jetstream_file_store(tmp_path)
    assert 0 < free <= shutil.disk_usage(tmp_path).total
    assert room == free // 4 * 3 + 5096 // 4 * 3


def test_a_disk_without_room_for_the_event_stream_refuses_to_start_saying_what_to_do(
    tmp_path: Path,
) -> None:
    """An event stream larger than JetStream would get here is a StartupError naming the
    sizes, the setting and the fixes (with a size that fits), before anything starts."""
    sup = Supervisor(PlatformConfig(state_dir=tmp_path, events_max_bytes=PiB), lambda _: None)
    with pytest.raises(StartupError) as refused:
        sup._check_jetstream_room()
    said = str(refused.value)
    room, _ = jetstream_file_store(tmp_path / "nats")
    assert "reserves 1024 TiB (SANDPOD_EVENTS_MAX_BYTES=1125899906842624)" in said
    assert str(tmp_path / "nats") in said and "free disk space there" in said
    assert "--state-dir" in said and "--nats-url" in said
    suggested = room // 2 // MIN_EVENTS_BYTES * MIN_EVENTS_BYTES
    assert f"SANDPOD_EVENTS_MAX_BYTES={suggested} " in said
    assert sup.children == []
    fits = PlatformConfig(state_dir=tmp_path, events_max_bytes=suggested)
    Supervisor(fits, lambda _: None)._check_jetstream_room()
