"""Whether the nats-server ``sandpod up`` starts will have JetStream room for the platform.

The platform reserves JetStream file storage at start: the lifecycle's event stream reserves its
whole size (``SANDPOD_EVENTS_MAX_BYTES``), and the KV and object buckets need the store not to
be fully reserved. ``sandpod up`` writes a nats.conf without ``max_file_store``, so nats-server
gives JetStream 75% of the free space where it stores (nats-server >= 2.14 adds 75% of what its
recovered streams hold back, so a restart keeps what it had). :func:`room_problem` computes that
the same way before the server starts and, when the event stream would not fit, says so with
the sizes and what to do; the supervisor raises it as its ``StartupError``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from sandpod_bus.capacity import human_bytes

__all__ = ["EVENTS_MAX_BYTES", "MIN_EVENTS_BYTES", "jetstream_file_store", "room_problem"]

EVENTS_MAX_BYTES = 256 << 20  # the event stream's size (the lifecycle's default too)
MIN_EVENTS_BYTES = 1 << 20  # the smallest the lifecycle accepts


def jetstream_file_store(store: Path) -> tuple[int, int]:
    """(the file store nats-server's JetStream gets on ``store`` when its config sets no
    ``max_file_store``, the free space there): 75% of what is free plus 75% of what its
    streams hold already (an older nats-server gives less; the lifecycle's own error then
    says so)."""
    free = shutil.disk_usage(store).free
    held = 0
    for root, _, files in os.walk(store):
        for name in files:
            with contextlib.suppress(OSError):  # gone meanwhile: it holds nothing
                held += os.stat(os.path.join(root, name)).st_size
    return free // 4 * 3 + held // 4 * 3, free


def room_problem(store: Path, reserve: int) -> str | None:
    """Why a nats-server storing in ``store`` could not hold an event stream of ``reserve``
    bytes, with the sizes and the fixes; None when it could."""
    room, free = jetstream_file_store(store)
    if room > reserve:  # more than: KV and object buckets need the store not all reserved
        return None
    fixes = ["free disk space there", "put the state dir on a larger one (--state-dir)"]
    suggest = room // 2 // MIN_EVENTS_BYTES * MIN_EVENTS_BYTES  # half: the rest for state
    if suggest >= MIN_EVENTS_BYTES:
        fixes.append(
            f"give the event stream less: SANDPOD_EVENTS_MAX_BYTES={suggest} "
            f"({human_bytes(suggest)}; at least {MIN_EVENTS_BYTES})"
        )
    fixes.append("pass --nats-url to use a NATS server of your own")
    return (
        f"JetStream would not have room for Sandpod's event stream: it reserves "
        f"{human_bytes(reserve)} (SANDPOD_EVENTS_MAX_BYTES={reserve}), and nats-server "
        f"would give JetStream about {human_bytes(room)} (75% of the {human_bytes(free)} "
        f"free on the filesystem of {store}, and of what its streams hold there). "
        "To fix it: " + "; or ".join(fixes) + "."
    )
