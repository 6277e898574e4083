"""JetStream without room for what the platform reserves: a typed error that says what to do.

Each test runs its own nats-server whose JetStream file store is tiny (``max_file_store:
64MB``), far below the 256 MiB a lifecycle's event stream reserves by default.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import NatsServer, wait_until
from sandpod_bus import Bus, BusSettings
from sandpod_bus.natsauth import operator_setup, server_config, user_creds
from sandpod_contract.errors import InsufficientStorage
from sandpod_contract.subjects import Subjects
from sandpod_lifecycle.bus_users import embedded_users
from svcprocs import ServiceProc

MiB = 1 << 20
TINY_STORE = "jetstream { max_file_store: 64MB }\n"  # nats-server reads MB as MiB


@pytest.fixture
def tiny_nats(tmp_path: Path) -> Iterator[NatsServer]:
    config = tmp_path / "tiny-js.conf"
    config.write_text(TINY_STORE)
    server = NatsServer(tmp_path / "nats", config)
    server.start()
    yield server
    server.stop()


def _start_failure(log: Path) -> dict[str, Any]:
    """The ``service_start_failed`` line of a service's JSON log."""
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{") and '"service_start_failed"' in line:
            entry: dict[str, Any] = json.loads(line)
            return entry
    raise AssertionError(f"no service_start_failed line in {log}:\n{log.read_text()}")


async def test_a_stream_beyond_the_file_store_is_a_typed_error_with_sizes_and_remedies(
    tiny_nats: NatsServer,
) -> None:
    """A stream reserving more than the server's file store holds raises InsufficientStorage
    naming the stream, its size, the account's figures and the remedies (the caller's size
    setting among them), not nats-py's bare "insufficient storage resources available"."""
    bus = await Bus.connect(BusSettings(url=tiny_nats.url))
    try:
        with pytest.raises(InsufficientStorage) as refused:
            await bus.ensure_stream(
                "big", ["big.>"], 3600, max_bytes=256 * MiB, size_setting="BIG_MAX_BYTES"
            )
    finally:
        await bus.close()
    err = refused.value
    assert err.code == "store.insufficient_storage" and not err.retryable
    assert err.details["stream"] == "big" and err.details["reserve_bytes"] == 256 * MiB
    assert err.details["account_reserved_bytes"] == 0
    assert err.details["account_limit_bytes"] == -1  # no account limit: the server's is short
    assert err.details["setting"] == "BIG_MAX_BYTES"
    for said in ("stream big", "256 MiB", "max_file_store is below 256 MiB", "free disk space"):
        assert said in err.message, (said, err.message)
    assert "jetstream { max_file_store: ... }" in err.message
    assert "lower BIG_MAX_BYTES (now 268435456 bytes" in err.message


async def test_buckets_on_a_fully_reserved_file_store_are_typed_errors(
    tiny_nats: NatsServer,
) -> None:
    """Once streams reserve the whole file store, making a KV or an object bucket (they
    reserve nothing themselves) raises InsufficientStorage naming the bucket's stream and what
    the account reserves."""
    bus = await Bus.connect(BusSettings(url=tiny_nats.url))
    try:
        await bus.ensure_stream("fill", ["fill.>"], 3600, max_bytes=64 * MiB)
        with pytest.raises(InsufficientStorage) as kv:
            await bus.kv("leases")
        with pytest.raises(InsufficientStorage) as objects:
            await bus.objects("blobs")
    finally:
        await bus.close()
    assert kv.value.details["stream"] == "KV_leases"
    assert objects.value.details["stream"] == "OBJ_blobs"
    for err, what in ((kv.value, "KV bucket leases"), (objects.value, "object store blobs")):
        assert err.details["account_reserved_bytes"] == 64 * MiB
        assert err.details["reserve_bytes"] == 0 and "setting" not in err.details
        assert f"no room for {what}" in err.message and "reserve 64 MiB" in err.message
        assert "max_file_store is all reserved" in err.message


def test_a_lifecycle_without_room_for_its_events_exits_saying_what_to_do(
    tiny_nats: NatsServer, tmp_path: Path
) -> None:
    """A lifecycle whose event stream (256 MiB by default) does not fit the server's file store
    exits 2 with one log line, no traceback: code store.insufficient_storage, the stream, the
    sizes and the remedies; lowering SANDPOD_EVENTS_MAX_BYTES as it says lets the next one
    start on the same server."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    refused = ServiceProc("sandpod_lifecycle", tiny_nats, tmp_path, prefix, "r0")
    try:
        assert refused.proc.wait(60) == 2, refused.tail()
    finally:
        refused.stop()
    assert "Traceback" not in refused.log.read_text(errors="replace"), refused.tail()
    line = _start_failure(refused.log)
    assert line["code"] == "store.insufficient_storage", line
    assert line["details"]["stream"] == f"{prefix}-events"
    assert line["details"]["reserve_bytes"] == 256 * MiB
    said = line["error"]
    for part in (f"stream {prefix}-events", "256 MiB", "max_file_store", "free disk space"):
        assert part in said, (part, said)
    assert "lower SANDPOD_EVENTS_MAX_BYTES" in said

    smaller = ServiceProc(
        "sandpod_lifecycle",
        tiny_nats,
        tmp_path,
        prefix,
        "r1",
        SANDPOD_EVENTS_MAX_BYTES=str(16 * MiB),
    )
    try:
        wait_until(
            lambda: (
                "service_started" in smaller.log.read_text(errors="replace")
                or smaller.proc.poll() is not None
            ),
            60,
            "the lifecycle with a 16 MiB event stream to start",
        )
        assert smaller.exited() is None, smaller.exited()
    finally:
        smaller.stop()


def test_in_operator_mode_the_lifecycle_reports_the_accounts_figures(tmp_path: Path) -> None:
    """With least-privilege credentials (``sandpod up``'s operator mode) the lifecycle may read
    its account's JetStream figures, so the refusal still says what the account reserves and
    holds instead of "figures unavailable"."""
    setup = operator_setup(int(time.time()))
    config = tmp_path / "operator.conf"
    config.write_text(server_config(setup, extra=[TINY_STORE]))
    nats = NatsServer(tmp_path / "nats", config)
    prefix = f"t{uuid.uuid4().hex[:8]}"
    perms = embedded_users(Subjects(prefix), "node-1")["lifecycle"]
    creds = tmp_path / "lifecycle.creds"
    creds.write_text(user_creds(setup.app.key, "lifecycle", perms, now=int(time.time())))
    nats.start()
    try:
        refused = ServiceProc(
            "sandpod_lifecycle",
            nats,
            tmp_path,
            prefix,
            "r0",
            SANDPOD_NATS_CREDS=str(creds),
            SANDPOD_NODE="node-1",
        )
        try:
            assert refused.proc.wait(60) == 2, refused.tail()
        finally:
            refused.stop()
    finally:
        nats.stop()
    line = _start_failure(refused.log)
    assert line["code"] == "store.insufficient_storage", line
    assert line["details"]["account_streams"] >= 1  # its resources bucket, made before
    assert line["details"]["account_limit_bytes"] == -1, line
    assert "figures are unavailable" not in line["error"], line["error"]
