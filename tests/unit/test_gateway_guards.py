"""Gateway guards without a server: log redaction, WebSocket tickets, tenant quotas, JSON depth."""

from __future__ import annotations

import json
import logging

import pytest

from sandpod_contract.errors import Busy
from sandpod_gateway import jsonbody, redact
from sandpod_gateway.errors import JsonTooDeep, QuotaExceeded, http_status
from sandpod_gateway.keys import ApiKey
from sandpod_gateway.quotas import Quotas
from sandpod_gateway.tickets import TicketStore

KEY = "spk_0123456789ab_" + "f" * 48


@pytest.mark.parametrize(
    "line",
    [
        f'127.0.0.1:5 - "WebSocket /v1/sandboxes/x/pty?cols=80&token={KEY}" 403',
        f'"WebSocket /v1/sandboxes/x/exec/ws?ticket=spt_{"a" * 48}&rows=2" [accepted]',
        f"Authorization: Bearer {KEY}",
        f'{{"authorization": "Bearer {KEY}"}}',
        f"x-api-key={KEY}",
        f"sec-websocket-protocol: sandpod, sandpod.key.{KEY}",
        f"key {KEY} in free text",
    ],
)
def test_redaction_removes_every_secret_shape(line: str) -> None:
    clean = redact.redact(line)
    assert "f" * 48 not in clean and "a" * 48 not in clean, clean
    assert "[redacted]" in clean


def test_redacting_filter_rewrites_records_with_args() -> None:
    record = logging.LogRecord(
        "uvicorn.error",
        logging.INFO,
        __file__,
        1,
        '%s - "WebSocket %s" [accepted]',
        ("127.0.0.1:1", f"/v1/x?token={KEY}"),
        None,
    )
    assert redact.RedactingFilter().filter(record)
    assert "f" * 48 not in record.getMessage() and "/v1/x?token=[redacted]" in record.getMessage()


def test_tickets_are_single_use_expire_and_are_bounded() -> None:
    now = [100.0]
    store = TicketStore(ttl=30, capacity=2, clock=lambda: now[0])
    key = ApiKey("0123456789ab", "acme", "d", 0.0)
    t = store.issue(key)
    assert t.startswith("spt_") and store.redeem(t) == key
    assert store.redeem(t) is None  # used
    late = store.issue(key)
    now[0] += 31
    assert store.redeem(late) is None  # expired
    first, second, third = store.issue(key), store.issue(key), store.issue(key)
    assert len(store) == 2 and store.redeem(first) is None  # the oldest was evicted
    assert store.redeem(second) == key and store.redeem(third) == key
    assert store.redeem("spt_" + "0" * 48) is None


def test_quotas_are_per_tenant_and_released_once() -> None:
    q = Quotas(max_streams=3, tenant_streams=2, tenant_execs=1)
    a1, a2 = q.stream("a"), q.stream("a")
    with pytest.raises(QuotaExceeded) as full:
        q.stream("a")
    assert http_status(full.value.code) == 429
    assert full.value.details == {
        "quota": "streams",
        "limit": 2,
        "setting": "SANDPOD_GATEWAY_TENANT_MAX_STREAMS",
    }
    b = q.stream("b")  # another tenant is not affected by a's quota
    with pytest.raises(Busy) as replica:  # ... only by the replica's ceiling
        q.stream("c")
    assert not isinstance(replica.value, QuotaExceeded) and http_status(replica.value.code) == 503
    a1.release()
    a1.release()  # idempotent: one slot back, not two
    assert q.held("streams", "a") == 1
    both = q.streaming_exec("a")
    with pytest.raises(QuotaExceeded):  # the exec quota is full: no stream slot taken either
        q.streaming_exec("a")
    assert q.held("execs", "a") == 1 and q.held("streams", "a") == 2
    for slot in (both, a2, b):
        slot.release()
    assert q.held("execs", "a") == q.held("streams", "a") == q.held("streams", "b") == 0


def test_json_depth_is_capped_without_recursion() -> None:
    assert jsonbody.loads(b"[" * 64 + b"]" * 64)
    for doc in (
        b"[" * 65 + b"]" * 65,
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a":' * 70 + b"1" + b"}" * 70,
    ):
        with pytest.raises(JsonTooDeep) as info:
            jsonbody.loads(doc)
        assert http_status(info.value.code) == 400
    with pytest.raises(json.JSONDecodeError):
        jsonbody.loads(b"{nope")


def test_one_tenant_cannot_evict_another_tenants_tickets() -> None:
    store = TicketStore(ttl=30, capacity=100, per_tenant=3)
    a, b = ApiKey("0123456789ab", "a", "d", 0.0), ApiKey("ba9876543210", "b", "d", 0.0)
    mine = store.issue(b)
    flood = [store.issue(a) for _ in range(50)]  # a's oldest go, never b's
    assert len(store) == 4
    assert store.redeem(mine) == b
    assert [store.redeem(t) for t in flood[-3:]] == [a, a, a]
    assert store.redeem(flood[0]) is None
