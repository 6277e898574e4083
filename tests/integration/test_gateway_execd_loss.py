"""Gateway: an execd SIGKILLed mid-request ends every kind of request with a typed error within
seconds, also for a client that set no timeout of its own (the protocol client's liveness probes,
shared with the SDK, not the request's deadline, end the wait).

No assertion here is timed: the module's pytest timeout (well below the deadlines that ended
these requests before: the command's timeout plus the gateway's request timeout, an hour, for a
one-shot; execd's 60 s abandon time for streams; 60 s per file chunk) is what fails a hang.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from gateway_harness import Gateway, gateway, mint_key, start_gateway, unique_tenant  # noqa: F401
from test_gateway_exec import parse_sse
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosedError

from conftest import Execd

__all__: list[str] = []

pytestmark = pytest.mark.timeout(40)

BIG = 256 * 1024 * 1024  # a download that is still running when execd dies


async def _box(gateway: Gateway, start_execd: Callable[..., Execd]) -> tuple[Execd, str]:
    """A private execd serving a fresh tenant's sandbox ``box``, and that tenant's key."""
    tenant = unique_tenant()
    return start_execd(sandbox_id=f"{tenant}--box"), await mint_key(gateway, tenant)


def _client(gateway: Gateway, key: str) -> httpx.AsyncClient:
    """A client with no timeout at all: only the gateway can end a request."""
    return httpx.AsyncClient(
        base_url=gateway.url, headers={"authorization": f"Bearer {key}"}, timeout=None
    )


async def _file_appears(path: Path) -> None:
    while not path.exists():
        await asyncio.sleep(0.02)


async def _ws_frames_killing(ws: ClientConnection, execd: Execd, frames: list[object]) -> None:
    """Read the socket to its end, SIGKILLing execd at the first output; text frames kept."""
    async for msg in ws:
        if isinstance(msg, bytes):
            assert msg == b"\x01up\n"
            execd.kill()
            continue
        frames.append(json.loads(msg))


async def _download_killing(c: httpx.AsyncClient, execd: Execd, got: list[int]) -> None:
    """Read ``big.bin``'s body to its end, SIGKILLing execd at the first bytes."""
    async with c.stream(
        "GET", "/v1/sandboxes/box/files/content", params={"path": "/workspace/big.bin"}
    ) as resp:
        assert resp.status_code == 200
        async for part in resp.aiter_raw():
            got.append(len(part))
            if execd.proc.poll() is None:
                execd.kill()


async def test_execd_killed_during_http_exec_is_503_sandbox_unavailable(
    gateway: Gateway, start_execd: Callable[..., Execd], tmp_path: Path
) -> None:
    """POST /exec of a long command with no timeout: SIGKILL on execd answers 503
    sandbox.unavailable instead of waiting out an hour."""
    execd, key = await _box(gateway, start_execd)
    go = tmp_path / "go"
    async with _client(gateway, key) as c:
        call = asyncio.create_task(
            c.post("/v1/sandboxes/box/exec", json={"shell": f"touch {go}; exec sleep 300"})
        )
        await _file_appears(go)
        execd.kill()
        r = await call
    assert r.status_code == 503, r.text
    assert r.json()["code"] == "sandbox.unavailable"
    assert r.json()["retryable"] is True


async def test_execd_killed_during_sse_stream_ends_with_error_event(
    gateway: Gateway, start_execd: Callable[..., Execd]
) -> None:
    """POST /exec/stream: after SIGKILL on execd the event stream ends with an ``error`` event
    (sandbox.unavailable), not after execd's abandon time."""
    execd, key = await _box(gateway, start_execd)
    body = b""
    async with (
        _client(gateway, key) as c,
        c.stream(
            "POST", "/v1/sandboxes/box/exec/stream", json={"shell": "echo up; exec sleep 300"}
        ) as r,
    ):
        assert r.status_code == 200
        async for part in r.aiter_bytes():
            body += part
            if b"event: stdout" in body and execd.proc.poll() is None:
                execd.kill()
    events = parse_sse(body.decode())
    assert events[-1][0] == "error", events
    assert events[-1][1]["code"] == "sandbox.unavailable"  # type: ignore[index]


async def test_execd_killed_during_websocket_exec_sends_error_frame(
    gateway: Gateway, start_execd: Callable[..., Execd]
) -> None:
    """/exec/ws: after SIGKILL on execd the socket gets an ``error`` frame
    (sandbox.unavailable) and is closed."""
    execd, key = await _box(gateway, start_execd)
    url = gateway.url.replace("http://", "ws://") + "/v1/sandboxes/box/exec/ws"
    frames: list[object] = []
    async with connect(url, additional_headers={"authorization": f"Bearer {key}"}) as ws:
        await ws.send(json.dumps({"shell": "echo up; exec sleep 300"}))
        with pytest.raises(ConnectionClosedError):
            await _ws_frames_killing(ws, execd, frames)
    assert ws.close_code == 1011  # a retryable error
    errors = [f for f in frames if isinstance(f, dict) and f["type"] == "error"]
    assert errors and errors[0]["code"] == "sandbox.unavailable", frames


async def test_execd_killed_during_download_breaks_the_body_off(
    gateway: Gateway, start_execd: Callable[..., Execd]
) -> None:
    """GET /files of a large file: after SIGKILL on execd mid-body the response ends at once,
    short of its Content-Length (the status line went out before; the gateway's typed
    SandboxUnavailable ends the body), instead of waiting 60 s for each lost chunk."""
    execd, key = await _box(gateway, start_execd)
    async with _client(gateway, key) as c:
        r = await c.post(
            "/v1/sandboxes/box/exec",
            json={"argv": ["truncate", "-s", str(BIG), "big.bin"]},
        )
        assert r.json()["exit_code"] == 0, r.text
        got: list[int] = []
        with pytest.raises(httpx.RemoteProtocolError):
            await _download_killing(c, execd, got)
    assert 0 < sum(got) < BIG


async def test_gateway_sandbox_nobody_serves_is_a_404_without_subjects(gateway: Gateway) -> None:
    """Through the gateway, a sandbox nobody serves is the tenant's 404, no subject shown."""
    key = await mint_key(gateway, "default")
    async with _client(gateway, key) as c:
        r = await c.post("/v1/sandboxes/nobody-here/exec", json={"shell": "true"})
    assert r.status_code == 404, r.text
    assert r.json()["code"] == "sandbox.not_found"
    assert "sandpod." not in r.text
