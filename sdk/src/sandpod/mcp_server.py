"""Sandpod as an MCP server: the tools an agent needs to work in a sandbox.

Built on the official ``mcp`` SDK (``MCPServer``) and on :class:`~sandpod.aio.AsyncSandbox`: each
tool is one or a few SDK calls, so every tool call still goes straight to the sandbox's execd over
NATS. One server serves one default sandbox (``--sandbox``); tools accept another sandbox id when
the agent needs several. Outputs handed to the model are capped (``MAX_TOOL_OUTPUT`` per stream)
and say when they were cut, so a chatty command cannot flood the model's context.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from sandpod.aio import AsyncSandbox
from sandpod.errors import SandpodError

__all__ = ["MAX_TOOL_OUTPUT", "SandboxPool", "build_server"]

MAX_TOOL_OUTPUT = 64 * 1024

INSTRUCTIONS = """\
Tools to work inside a Sandpod sandbox: an isolated Linux machine with a persistent /workspace.
Use `exec` for one command and its output; `session_run` when state (cd, exported variables,
activated virtualenvs) must persist between commands; `process_start` for servers and other
long-running programs, then `process_logs` to read their output and `process_kill` to stop them.
Files: `file_read`, `file_write`, `file_list`, `file_search`. Repositories: `git_checkout`.
Errors come back as `error: [code] message`; codes marked retryable may succeed if repeated.
"""


class SandboxPool:
    """Lazily connected sandbox handles, shared by every tool call of the server."""

    def __init__(self, default: str, nats_url: str | None, prefix: str | None) -> None:
        self.default = default
        self._nats_url = nats_url
        self._prefix = prefix
        self._handles: dict[str, AsyncSandbox] = {}
        self._lock = asyncio.Lock()

    async def get(self, sandbox: str | None) -> AsyncSandbox:
        sid = sandbox or self.default
        async with self._lock:
            if sid not in self._handles:
                first = next(iter(self._handles.values()), None)
                self._handles[sid] = await AsyncSandbox.connect(
                    sid,
                    nats_url=self._nats_url,
                    prefix=self._prefix,
                    bus=first.bus if first is not None else None,
                )
            return self._handles[sid]

    async def close(self) -> None:
        owners = [h for h in self._handles.values() if h._owns_bus]
        self._handles.clear()
        for handle in owners:
            await handle.close()


def _clip(data: bytes) -> tuple[str, bool]:
    text = data[:MAX_TOOL_OUTPUT].decode("utf-8", "replace")
    return text, len(data) > MAX_TOOL_OUTPUT


def _tool_error(exc: SandpodError) -> ToolError:
    """A failed tool call the model can read: code, message, and whether to retry."""
    hint = " (retryable)" if exc.retryable else ""
    return ToolError(f"error: [{exc.code}] {exc.message}{hint}")


def build_server(pool: SandboxPool) -> MCPServer:
    """The MCP server with Sandpod's tools bound to ``pool``."""

    @contextlib.asynccontextmanager
    async def lifespan(_: MCPServer[Any]) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await pool.close()

    server: MCPServer[Any] = MCPServer(
        "sandpod", instructions=INSTRUCTIONS, version="0.1.0", lifespan=lifespan
    )

    def tool(fn: Callable[..., Any]) -> Callable[..., Any]:
        """Register ``fn`` with its docstring, dedented, as the description the model reads."""
        return server.tool(description=inspect.cleandoc(fn.__doc__ or ""))(fn)

    @tool
    async def exec(
        *,
        command: str,
        cwd: str = "/workspace",
        env: dict[str, str] | None = None,
        timeout: float = 120.0,
        stdin: str | None = None,
        sandbox: str | None = None,
    ) -> dict[str, Any]:
        """Run one shell command in the sandbox and return its output.

        `command` is a bash command line (pipes, &&, redirects work). Runs in `cwd`
        (default /workspace) with `env` added. Killed with its whole process tree after
        `timeout` seconds (then `timed_out` is true). `stdin` is fed to the command. Each
        stream is cut at 64 KiB (`stdout_truncated`/`stderr_truncated` say so): redirect big
        output to a file and read parts of it instead. State such as `cd` does not persist
        between calls: use session_run for that.
        """
        try:
            sbx = await pool.get(sandbox)
            r = await sbx.exec(cwd, command, env=env, timeout=timeout, stdin=stdin)
        except SandpodError as exc:
            raise _tool_error(exc) from exc
        out, out_cut = _clip(r.stdout_bytes)
        err, err_cut = _clip(r.stderr_bytes)
        return {
            "exit_code": r.exit_code,
            "signal": r.signal_name,
            "stdout": out,
            "stderr": err,
            "stdout_truncated": out_cut or r.stdout_truncated,
            "stderr_truncated": err_cut or r.stderr_truncated,
            "timed_out": r.timed_out,
            "duration_seconds": round(r.duration, 3),
        }

    return server
