"""Gateway: exec over HTTP (JSON and SSE), request ids, health, metrics, error shapes."""

from __future__ import annotations

import json

import httpx
from gateway_harness import Gateway, gateway, mint_key, start_gateway  # noqa: F401

from conftest import Execd

__all__: list[str] = []


def parse_sse(text: str) -> list[tuple[str, object]]:
    """(event, data) pairs of an SSE body, keepalive comments skipped."""
    out: list[tuple[str, object]] = []
    for block in text.split("\n\n"):
        event, data = "message", None
        for line in block.splitlines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
        if data is not None:
            out.append((event, data))
    return out


async def test_exec_oneshot_returns_output_and_exit_code(
    gateway: Gateway, shared_execd: Execd
) -> None:
    """POST /exec runs the command and returns stdout, stderr and the exit code as JSON."""
    key = await mint_key(gateway, "default")
    async with gateway.client(key) as c:
        r = await c.post(
            "/v1/sandboxes/shared/exec", json={"shell": "echo out; echo err >&2; exit 3"}
        )
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["stdout"], body["stderr"], body["exit_code"]) == ("out\n", "err\n", 3)
    assert len(r.headers["x-request-id"]) >= 16


async def test_exec_oneshot_large_output_is_complete(gateway: Gateway, shared_execd: Execd) -> None:
    """Output larger than one NATS message is fetched in parts and returned whole."""
    key = await mint_key(gateway, "default")
    async with gateway.client(key) as c:
        r = await c.post(
            "/v1/sandboxes/shared/exec",
            json={"argv": ["head", "-c", "3000000", "/dev/zero"], "encoding": "base64"},
        )
    import base64

    assert len(base64.b64decode(r.json()["stdout"])) == 3_000_000


async def test_exec_stream_is_sse_ending_with_exit_event(
    gateway: Gateway, shared_execd: Execd
) -> None:
    """POST /exec/stream answers text/event-stream: stdout/stderr events, then exit with code."""
    key = await mint_key(gateway, "default")
    async with gateway.client(key) as c:
        r = await c.post(
            "/v1/sandboxes/shared/exec/stream", json={"shell": "echo a; echo b >&2; echo c; exit 7"}
        )
    assert r.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(r.text)
    assert events[-1][0] == "exit" and events[-1][1]["exit_code"] == 7  # type: ignore[index]
    out = "".join(d["data"] for e, d in events if e == "stdout")  # type: ignore[index]
    err = "".join(d["data"] for e, d in events if e == "stderr")  # type: ignore[index]
    assert (out, err) == ("a\nc\n", "b\n")


async def test_sse_keepalive_comments_on_idle_stream(gateway: Gateway, shared_execd: Execd) -> None:
    """An idle SSE stream gets ': keepalive' comments at the configured interval (0.2 s here)."""
    key = await mint_key(gateway, "default")
    async with (
        gateway.client(key) as c,
        c.stream(
            "POST", "/v1/sandboxes/shared/exec/stream", json={"shell": "sleep 1; echo done"}
        ) as r,
    ):
        seen = ""
        async for text in r.aiter_text():
            seen += text
            if "keepalive" in seen:
                break
    assert ": keepalive" in seen


async def test_request_id_is_echoed(gateway: Gateway) -> None:
    """A sane X-Request-Id from the client is echoed back, on errors too."""
    async with gateway.client() as c:
        r = await c.get("/v1/sandboxes", headers={"x-request-id": "abc-123"})
    assert r.status_code == 401
    assert r.headers["x-request-id"] == "abc-123"


async def test_unknown_sandbox_is_404_with_wire_code(gateway: Gateway) -> None:
    """A sandbox nobody serves answers 404 {code: sandbox.not_found} without internal subjects."""
    key = await mint_key(gateway, "default")
    async with gateway.client(key) as c:
        r = await c.post("/v1/sandboxes/nobody-here/exec", json={"argv": ["true"]})
    assert r.status_code == 404
    assert r.json() == {
        "code": "sandbox.not_found",
        "message": "sandbox 'nobody-here' not found",
        "retryable": False,
    }


async def test_command_not_found_maps_to_422(gateway: Gateway, shared_execd: Execd) -> None:
    """execd's typed error crosses HTTP with its code and a 4xx status."""
    key = await mint_key(gateway, "default")
    async with gateway.client(key) as c:
        r = await c.post("/v1/sandboxes/shared/exec", json={"argv": ["no-such-cmd-xyz"]})
    assert r.status_code == 422
    assert r.json()["code"] == "exec.command_not_found"


async def test_health_ready_and_metrics(gateway: Gateway) -> None:
    """/healthz and /readyz answer without a key; /metrics (admin key) exposes
    sandpod_gateway_* series."""
    admin = await mint_key(gateway, "ops", admin=True)
    async with gateway.client() as c:
        assert (await c.get("/healthz")).status_code == 200
        assert (await c.get("/readyz")).json()["status"] == "ready"
    async with gateway.client(admin) as c:
        metrics = (await c.get("/metrics")).text
    assert "sandpod_gateway_requests_total" in metrics
    assert 'route="/healthz"' in metrics


async def test_malformed_bodies_are_400(gateway: Gateway, shared_execd: Execd) -> None:
    """Bad JSON, a non-object, wrong field types and a missing command are clean 400s."""
    key = await mint_key(gateway, "default")
    async with gateway.client(key) as c:
        for content in (
            b"{not json",
            b"[1,2]",
            b'{"argv": "ls"}',
            b"{}",
            b'{"argv": [1]}',
            b'{"shell": "x", "timeout": -1}',
            b"\xff\xfe",
        ):
            r = await c.post(
                "/v1/sandboxes/shared/exec",
                content=content,
                headers={"content-type": "application/json"},
            )
            assert r.status_code == 400, (content, r.text)
            assert r.json()["code"].startswith("bad_request")


async def test_oversized_body_and_headers_rejected(gateway: Gateway) -> None:
    """A JSON body over the cap is 413; headers over the cap are 431; the gateway keeps serving."""
    key = await mint_key(gateway, "default")
    async with gateway.client(key) as c:
        r = await c.post(
            "/v1/sandboxes/shared/exec",
            content=b"{" + b" " * (2 << 20) + b"}",
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 413
        r = await c.get("/v1/sandboxes", headers={"x-big": "a" * 20000})
        assert r.status_code == 431
        assert r.json()["code"] == "bad_request.headers_too_large"
        try:
            r = await c.get("/healthz", headers={"x-huge": "a" * 300_000})
            assert r.status_code in (400, 431)
        except httpx.RemoteProtocolError:
            pass  # the HTTP parser may drop the connection: also a clean refusal
        assert (await c.get("/healthz")).status_code == 200
