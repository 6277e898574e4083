"""The MCP server: lists its tools and runs them against a real sandbox, in-process and over
stdio with the official SDK's own client."""

from __future__ import annotations

import socket
import subprocess
import sysconfig
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent

from conftest import Execd, NatsServer, free_port
from sandpod import AsyncSandbox
from sandpod.mcp_server import SandboxPool, build_server

SANDPOD = str(Path(sysconfig.get_path("scripts")) / "sandpod")
TOOLS = {
    "exec",
    "file_read",
    "file_write",
    "file_list",
    "file_search",
    "file_replace",
    "git_checkout",
    "process_start",
    "process_logs",
    "process_kill",
    "session_run",
}


def _text(result: CallToolResult) -> str:
    """The text of a tool result's first content block (Sandpod's tools answer in text)."""
    block = result.content[0]
    assert isinstance(block, TextContent), block
    return block.text


@pytest.fixture
def server(nats: NatsServer, shared_execd: Execd) -> MCPServer[Any]:
    return build_server(SandboxPool("shared", nats.url, None))


def _structured(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    data: dict[str, Any] = result.structured_content
    return data


async def test_lists_tools_with_descriptions_for_a_model(server: MCPServer[Any]) -> None:
    """Every tool has a description a model can act on and a JSON schema for its arguments."""
    async with Client(server) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == TOOLS
        for tool in tools.values():
            assert tool.description and len(tool.description) > 40
            assert tool.input_schema["type"] == "object"


async def test_exec_tool_returns_output_and_exit_code(server: MCPServer[Any]) -> None:
    """exec runs a shell command line in the sandbox with cwd, env, stdin and timeout."""
    async with Client(server) as client:
        out = _structured(
            await client.call_tool(
                "exec",
                {
                    "command": "cat; echo $GREETING; pwd; exit 3",
                    "env": {"GREETING": "hi"},
                    "stdin": "in\n",
                    "cwd": "/workspace",
                },
            )
        )
        assert out["exit_code"] == 3
        assert out["stdout"].startswith("in\nhi\n")
        timed = _structured(await client.call_tool("exec", {"command": "sleep 30", "timeout": 0.5}))
        assert timed["timed_out"] is True


async def test_exec_tool_caps_output_for_the_model(server: MCPServer[Any]) -> None:
    """Huge output is cut at 64 KiB and flagged, so it cannot flood the model's context."""
    async with Client(server) as client:
        out = _structured(
            await client.call_tool("exec", {"command": "head -c 1000000 /dev/zero | tr '\\0' a"})
        )
        assert len(out["stdout"]) == 64 * 1024 and out["stdout_truncated"] is True


async def test_tool_errors_are_readable_and_typed(server: MCPServer[Any]) -> None:
    """A failing tool call is an MCP error carrying the Sandpod error code."""
    async with Client(server) as client:
        result = await client.call_tool("exec", {"command": "true", "cwd": "/no/such/dir"})
        assert result.is_error
        assert "exec.invalid_cwd" in _text(result)
        result = await client.call_tool("exec", {"command": "true", "sandbox": "nobody-here"})
        assert result.is_error and "sandbox.not_found" in _text(result)


async def test_stdio_server_via_the_cli(nats: NatsServer, shared_execd: Execd) -> None:
    """`sandpod mcp` speaks MCP over stdio to the official client."""
    params = StdioServerParameters(
        command=SANDPOD, args=["mcp", "--sandbox", "shared", "--nats-url", nats.url]
    )
    async with Client(params) as c:
        names = {t.name for t in (await c.list_tools()).tools}
        assert "exec" in names
        out = _structured(await c.call_tool("exec", {"command": "echo over-stdio"}))
        assert out["stdout"] == "over-stdio\n"


async def test_streamable_http_server_via_the_cli(nats: NatsServer, shared_execd: Execd) -> None:
    """`sandpod mcp --transport streamable-http` serves the same tools to the official client
    over HTTP, and stops on SIGTERM."""
    port = free_port()
    server = subprocess.Popen(
        [
            SANDPOD,
            "mcp",
            "--sandbox",
            "shared",
            "--nats-url",
            nats.url,
            "--transport",
            "streamable-http",
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for_port(port, server)
        async with Client(f"http://127.0.0.1:{port}/mcp") as c:
            assert {t.name for t in (await c.list_tools()).tools} == TOOLS
            out = _structured(await c.call_tool("exec", {"command": "echo over-http"}))
            assert out["stdout"] == "over-http\n"
    finally:
        server.terminate()
        assert server.wait(timeout=15) is not None


def wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    """Until something accepts on ``port``; fails with the server's stderr if it exited."""
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if proc.poll() is not None:
            assert proc.stderr is not None
            pytest.fail(f"MCP server exited {proc.returncode}: {proc.stderr.read().decode()}")
        assert time.monotonic() < deadline, f"nothing listens on {port} after {timeout}s"
        time.sleep(0.05)


async def test_file_tools_round_trip(server: MCPServer[Any]) -> None:
    """file_write, file_read (whole and by lines), file_list, file_search and file_replace."""
    async with Client(server) as client:
        body = "".join(f"line {i}\n" for i in range(1, 101))
        wrote = _structured(
            await client.call_tool("file_write", {"path": "mcp/notes.txt", "content": body})
        )
        assert wrote["size"] == len(body)
        whole = _structured(await client.call_tool("file_read", {"path": "mcp/notes.txt"}))
        assert whole["text"] == body and whole["truncated"] is False
        window = _structured(
            await client.call_tool(
                "file_read", {"path": "mcp/notes.txt", "start_line": 10, "line_count": 2}
            )
        )
        assert window["text"] == "line 10\nline 11"
        listed = _structured(await client.call_tool("file_list", {"path": "mcp"}))
        assert [e["path"].rsplit("/", 1)[-1] for e in listed["entries"]] == ["notes.txt"]
        found = _structured(
            await client.call_tool("file_search", {"query": "line 42", "path": "mcp"})
        )
        assert [(m["line"], m["text"]) for m in found["matches"]] == [(42, "line 42")]
        replaced = _structured(
            await client.call_tool(
                "file_replace", {"path": "mcp/notes.txt", "old": "line 7\n", "new": "seven\n"}
            )
        )
        assert replaced["files"][0]["count"] == 1
        missing = await client.call_tool("file_read", {"path": "mcp/nope.txt"})
        assert missing.is_error and "fs.not_found" in _text(missing)


async def test_git_checkout_tool(server: MCPServer[Any], tmp_path: Path) -> None:
    """git_checkout clones a repository into the sandbox and reports the commit."""
    import subprocess

    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@e"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "README").write_text("hello\n")
    subprocess.run([*git, "add", "README"], check=True)
    subprocess.run([*git, "commit", "-qm", "first"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
    async with Client(server) as client:
        target = f"/workspace/mcp-clone-{tmp_path.name}"
        out = _structured(
            await client.call_tool("git_checkout", {"url": f"file://{repo}", "target": target})
        )
        assert out["commit"] == head.stdout.strip() and out["branch"] == "main"
        bad = await client.call_tool("git_checkout", {"url": f"file://{tmp_path}/missing"})
        assert bad.is_error and "git.not_found" in _text(bad)


async def test_process_tools(server: MCPServer[Any]) -> None:
    """process_start (waiting for a port), process_logs by cursor, process_kill."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with Client(server) as client:
        started = _structured(
            await client.call_tool(
                "process_start",
                {
                    "command": f"echo booting; exec python3 -m http.server {port} --bind 127.0.0.1",
                    "wait_for_port": port,
                },
            )
        )
        pid_name = started["process_id"]
        assert started["state"] == "running"
        logs = _structured(await client.call_tool("process_logs", {"process_id": pid_name}))
        assert "booting" in logs["stdout"] and logs["running"] is True
        again = _structured(
            await client.call_tool(
                "process_logs", {"process_id": pid_name, "cursor": logs["next_cursor"]}
            )
        )
        assert "booting" not in again["stdout"]
        killed = _structured(await client.call_tool("process_kill", {"process_id": pid_name}))
        assert killed["state"] == "exited"


async def test_session_tool_keeps_state_across_calls(
    server: MCPServer[Any], nats: NatsServer
) -> None:
    """session_run keeps cd and exported variables between calls and survives a timeout."""
    async with Client(server) as client:
        session = f"mcp-{uuid.uuid4().hex[:6]}"
        first = _structured(
            await client.call_tool(
                "session_run",
                {
                    "command": "mkdir -p /tmp/mcp-s && cd /tmp/mcp-s && export K=v",
                    "session": session,
                },
            )
        )
        assert first["exit_code"] == 0
        slow = _structured(
            await client.call_tool(
                "session_run", {"command": "sleep 30", "session": session, "timeout": 0.5}
            )
        )
        assert slow["timed_out"] is True
        after = _structured(
            await client.call_tool("session_run", {"command": "echo $K; pwd", "session": session})
        )
        assert after["stdout"] == "v\n/tmp/mcp-s\n"
    async with await AsyncSandbox.connect("shared", nats_url=nats.url) as sbx:
        await sbx.sessions.delete(session)
