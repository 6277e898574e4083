"""Gateway WebSockets: PTY (bytes, resize, replay on reconnect, several viewers, keepalive) and
exec with streaming stdin."""

from __future__ import annotations

import json
import uuid

import pytest
from gateway_harness import Gateway, gateway, mint_key, start_gateway  # noqa: F401
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus
from websockets.typing import Subprotocol

from conftest import Execd

__all__: list[str] = []


def _ws(gw: Gateway, path: str) -> str:
    return gw.url.replace("http://", "ws://") + path


def _key_protocols(key: str) -> list[Subprotocol]:
    """The browser-compatible way to send a key on a WebSocket (no header, no URL)."""
    return [Subprotocol("sandpod"), Subprotocol(f"sandpod.key.{key}")]


async def _until(ws: ClientConnection, needle: bytes, limit: int = 500) -> bytes:
    """Terminal bytes received until ``needle`` shows up (control frames skipped)."""
    seen = b""
    for _ in range(limit):
        msg = await ws.recv()
        if isinstance(msg, bytes):
            seen += msg
            if needle in seen:
                return seen
    raise AssertionError(f"{needle!r} never arrived; got {seen[-300:]!r}")


async def _control(ws: ClientConnection, kind: str) -> dict[str, object]:
    for _ in range(500):
        msg = await ws.recv()
        if isinstance(msg, str) and json.loads(msg)["type"] == kind:
            return json.loads(msg)  # type: ignore[no-any-return]
    raise AssertionError(f"no {kind} frame")


async def test_pty_echo_resize_replay_and_viewers(gateway: Gateway, shared_execd: Execd) -> None:
    """Typing into the PTY echoes; resize applies; a second viewer and a reconnect both get the
    earlier output replayed; exit is reported with its code."""
    key = await mint_key(gateway, "default")
    pty_id = f"t{uuid.uuid4().hex[:8]}"
    url = _ws(gateway, f"/v1/sandboxes/shared/pty?pty_id={pty_id}&shell=sh")
    async with connect(url, subprotocols=_key_protocols(key)) as ws:
        assert ws.subprotocol == "sandpod"
        ready = await _control(ws, "ready")
        assert ready["pty_id"] == pty_id
        await ws.send(b"echo hi-$((40+2))\n")
        await _until(ws, b"hi-42")
        await ws.send(json.dumps({"type": "resize", "cols": 100, "rows": 30}))
        await ws.send(b"stty size\n")
        await _until(ws, b"30 100")
        # a second viewer sees the history and new output
        async with connect(url, subprotocols=_key_protocols(key)) as viewer:
            await _control(viewer, "ready")
            await _until(viewer, b"hi-42")
            await ws.send(b"echo both\n")
            await _until(viewer, b"both")
    # reconnect: the replay buffer redraws what happened
    async with connect(url, subprotocols=_key_protocols(key)) as again:
        await _until(again, b"hi-42")
        await again.send(b"exit 5\n")
        assert (await _control(again, "exit"))["exit_code"] == 5


async def test_pty_keepalive_frames(gateway: Gateway, shared_execd: Execd) -> None:
    """An idle terminal socket gets {"type": "keepalive"} frames at the configured interval."""
    key = await mint_key(gateway, "default")
    url = _ws(gateway, "/v1/sandboxes/shared/pty?shell=sh")
    async with connect(url, subprotocols=_key_protocols(key)) as ws:
        ready = await _control(ws, "ready")
        assert (await _control(ws, "keepalive"))["type"] == "keepalive"
        await ws.send(b"exit\n")
        await _control(ws, "exit")
    assert ready["pty_id"]


async def test_ws_refused_without_key(gateway: Gateway) -> None:
    """A WebSocket without a key is refused before the handshake with the JSON 401."""
    with pytest.raises(InvalidStatus) as info:
        async with connect(_ws(gateway, "/v1/sandboxes/shared/pty")):
            pass
    assert info.value.response.status_code == 401
    assert json.loads(info.value.response.body or b"{}")["code"] == "auth.unauthenticated"


async def test_exec_ws_streams_stdin_and_output(gateway: Gateway, shared_execd: Execd) -> None:
    """exec over WebSocket: stdin frames reach the command, output comes tagged, exit last."""
    key = await mint_key(gateway, "default")
    url = _ws(gateway, "/v1/sandboxes/shared/exec/ws")
    async with connect(url, additional_headers={"authorization": f"Bearer {key}"}) as ws:
        await ws.send(json.dumps({"argv": ["sh", "-c", "tr a-z A-Z; echo err >&2; exit 4"]}))
        assert (await _control(ws, "started"))["exec_id"]
        await ws.send(b"hello ")
        await ws.send(b"world\n")
        await ws.send(json.dumps({"type": "eof"}))
        out, err = b"", b""
        while True:
            msg = await ws.recv()
            if isinstance(msg, bytes):
                if msg[0] == 1:
                    out += msg[1:]
                else:
                    err += msg[1:]
            elif json.loads(msg)["type"] == "exit":
                assert json.loads(msg)["exit_code"] == 4
                break
    assert (out, err) == (b"HELLO WORLD\n", b"err\n")


async def test_exec_ws_bad_first_frame(gateway: Gateway, shared_execd: Execd) -> None:
    """A first frame that is not a command gets an error frame and a policy close."""
    key = await mint_key(gateway, "default")
    url = _ws(gateway, "/v1/sandboxes/shared/exec/ws")
    async with connect(url, subprotocols=_key_protocols(key)) as ws:
        await ws.send("not json")
        err = await _control(ws, "error")
        assert err["code"] == "bad_request"
