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
from sandpod.errors import SandpodError, SessionDead, SessionNotFound

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

    tool = _registrar(server)
    _exec_tools(tool, pool)
    _file_tools(tool, pool)
    _git_tools(tool, pool)
    _process_tools(tool, pool)
    _session_tools(tool, pool)
    return server


Tool = Callable[[Callable[..., Any]], Callable[..., Any]]


def _registrar(server: MCPServer[Any]) -> Tool:
    def tool(fn: Callable[..., Any]) -> Callable[..., Any]:
        """Register ``fn`` with its docstring, dedented, as the description the model reads."""
        return server.tool(description=inspect.cleandoc(fn.__doc__ or ""))(fn)

    return tool


def _exec_tools(tool: Tool, pool: SandboxPool) -> None:
    """Tools for one-shot commands."""

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


def _file_tools(tool: Tool, pool: SandboxPool) -> None:
    """Tools for files."""

    @tool
    async def file_read(
        *,
        path: str,
        start_line: int | None = None,
        line_count: int | None = None,
        sandbox: str | None = None,
    ) -> dict[str, Any]:
        """Read a text file from the sandbox (paths relative to /workspace or absolute).

        Without `start_line`, returns the whole file if it is at most 64 KiB, otherwise its
        first 64 KiB with `truncated: true` and the file's `size`: then read windows of lines
        with `start_line` (1-based) and `line_count`. Binary bytes that are not UTF-8 appear
        as U+FFFD.
        """
        try:
            sbx = await pool.get(sandbox)
            if start_line is not None:
                text = "\n".join(await sbx.fs.read_lines(path, start_line, line_count or 200))
                return {"path": path, "start_line": start_line, "text": text}
            info = await sbx.fs.stat(path, follow_symlinks=True)
            data = await sbx.fs.read_range(path, 0, MAX_TOOL_OUTPUT)
        except SandpodError as exc:
            raise _tool_error(exc) from exc
        text, _ = _clip(data)
        return {"path": path, "size": info.size, "text": text, "truncated": info.size > len(data)}

    @tool
    async def file_write(
        *,
        path: str,
        content: str,
        mode: str | None = None,
        sandbox: str | None = None,
    ) -> dict[str, Any]:
        """Write a text file in the sandbox atomically, creating parent directories.

        Replaces the whole file. `mode` is an octal string such as "755" (default: keep the
        existing file's mode, 644 for new files). To change part of a file, prefer
        file_replace, which does not need the whole content.
        """
        try:
            sbx = await pool.get(sandbox)
            info = await sbx.fs.write(path, content, mode=int(mode, 8) if mode else None)
        except ValueError as exc:
            raise ToolError(f"error: mode {mode!r} is not an octal number like 644") from exc
        except SandpodError as exc:
            raise _tool_error(exc) from exc
        return {"path": info.path, "size": info.size, "mode": oct(info.mode & 0o7777)}

    @tool
    async def file_list(
        *,
        path: str = "/workspace",
        depth: int = 1,
        hidden: bool = False,
        sandbox: str | None = None,
    ) -> dict[str, Any]:
        """List a directory in the sandbox, `depth` levels deep (at most 500 entries).

        Each entry has its path, type (file, dir, symlink, other), size, mode and symlink
        target. Use file_search to find files by content, exec with `find` for anything else.
        """
        try:
            sbx = await pool.get(sandbox)
            listing = await sbx.fs.list(path, depth=depth, hidden=hidden, limit=500)
        except SandpodError as exc:
            raise _tool_error(exc) from exc
        entries = [
            {
                "path": e.path,
                "type": e.type,
                "size": e.size,
                "mode": oct(e.mode & 0o7777),
                **({"target": e.target} if e.target else {}),
            }
            for e in listing.entries
        ]
        return {"entries": entries, "truncated": listing.truncated}

    @tool
    async def file_search(
        *,
        query: str,
        path: str = "/workspace",
        glob: str | None = None,
        regex: bool = False,
        sandbox: str | None = None,
    ) -> dict[str, Any]:
        """Find lines containing `query` in files below `path` (like grep -rn).

        `glob` limits the files searched (e.g. "**/*.py"); `regex` makes `query` a Python
        regular expression. Returns up to 200 matches with file, line number and text;
        binary files are skipped.
        """
        try:
            sbx = await pool.get(sandbox)
            result = await sbx.fs.search(query, path=path, glob=glob, regex=regex, limit=200)
        except SandpodError as exc:
            raise _tool_error(exc) from exc
        matches = [{"path": m.path, "line": m.line, "text": m.text[:500]} for m in result.matches]
        return {"matches": matches, "truncated": result.truncated}

    @tool
    async def file_replace(
        *,
        path: str,
        old: str,
        new: str,
        glob: str | None = None,
        regex: bool = False,
        sandbox: str | None = None,
    ) -> dict[str, Any]:
        """Replace text in a file, or in every file below a directory matching `glob`.

        Literal by default; with `regex`, `new` may use \\1 group references. Each file is
        rewritten atomically. Returns how many replacements were made in each file.
        """
        try:
            sbx = await pool.get(sandbox)
            result = await sbx.fs.replace(path, old, new, glob=glob, regex=regex)
        except SandpodError as exc:
            raise _tool_error(exc) from exc
        return {"files": [{"path": r.path, "count": r.count} for r in result.files]}


def _git_tools(tool: Tool, pool: SandboxPool) -> None:
    """Tools for repositories."""

    @tool
    async def git_checkout(
        *,
        url: str,
        target: str | None = None,
        branch: str | None = None,
        depth: int | None = None,
        token: str | None = None,
        sandbox: str | None = None,
    ) -> dict[str, Any]:
        """Clone a git repository into the sandbox (default /workspace/<repository name>).

        `branch` picks a branch or tag, `depth` makes a shallow clone (1 is fastest). For a
        private repository pass `token` (it is never logged or returned). Returns the
        directory, the commit and the branch checked out.
        """
        try:
            sbx = await pool.get(sandbox)
            head = await sbx.git.clone(url, target, branch=branch, depth=depth, token=token)
        except SandpodError as exc:
            raise _tool_error(exc) from exc
        return {"path": head.path, "commit": head.commit, "branch": head.branch}


def _process_tools(tool: Tool, pool: SandboxPool) -> None:
    """Tools for background processes (servers, watchers, long builds)."""

    @tool
    async def process_start(
        *,
        command: str,
        cwd: str = "/workspace",
        env: dict[str, str] | None = None,
        name: str | None = None,
        wait_for_port: int | None = None,
        sandbox: str | None = None,
    ) -> dict[str, Any]:
        """Start a long-running command in the background (a dev server, a watcher, a build).

        Returns at once with its `process_id` (your `name`, or a generated one). With
        `wait_for_port`, returns only once something listens on that TCP port (or fails with
        the process's output if it exits first). Read its output with process_logs; stop it
        with process_kill.
        """
        try:
            sbx = await pool.get(sandbox)
            proc = await sbx.proc.start(cwd, command, proc_id=name, env=env)
            if wait_for_port is not None:
                await proc.wait_for_port(wait_for_port, timeout=60)
            info = await proc.status()
        except SandpodError as exc:
            raise _tool_error(exc) from exc
        return {"process_id": info.proc_id, "pid": info.pid, "state": info.state}

    @tool
    async def process_logs(
        *,
        process_id: str,
        cursor: int = 0,
        wait: float = 0.0,
        sandbox: str | None = None,
    ) -> dict[str, Any]:
        """Read a background process's output after `cursor` (0: from the start).

        Returns up to 64 KiB of stdout and stderr, the `next_cursor` to pass next time,
        whether it is still `running`, and its `exit_code` once it ended. `wait` (seconds,
        at most 30) waits for new output when there is none yet.
        """
        try:
            sbx = await pool.get(sandbox)
            read = await sbx.proc.logs(
                process_id, cursor, wait=min(wait, 30.0), max_bytes=MAX_TOOL_OUTPUT
            )
            info = await sbx.proc.status(process_id)
        except SandpodError as exc:
            raise _tool_error(exc) from exc
        out = b"".join(c.data for c in read.chunks if c.stream == "stdout")
        err = b"".join(c.data for c in read.chunks if c.stream == "stderr")
        return {
            "stdout": out.decode("utf-8", "replace"),
            "stderr": err.decode("utf-8", "replace"),
            "next_cursor": read.next_cursor,
            "skipped_bytes": read.skipped,
            "running": info.state == "running",
            "exit_code": info.exit_code,
        }

    @tool
    async def process_kill(*, process_id: str, sandbox: str | None = None) -> dict[str, Any]:
        """Stop a background process and everything it started (SIGTERM, then SIGKILL)."""
        try:
            sbx = await pool.get(sandbox)
            info = await sbx.proc.kill(process_id)
        except SandpodError as exc:
            raise _tool_error(exc) from exc
        return {
            "process_id": info.proc_id,
            "state": info.state,
            "exit_code": info.exit_code,
            "signal": info.signal,
        }


def _session_tools(tool: Tool, pool: SandboxPool) -> None:
    """Tools for stateful shell sessions."""

    @tool
    async def session_run(
        *,
        command: str,
        session: str = "main",
        timeout: float = 120.0,
        sandbox: str | None = None,
    ) -> dict[str, Any]:
        """Run a command in a persistent bash session (created on first use).

        Unlike exec, state persists between calls of the same `session`: the working
        directory (`cd`), exported variables, activated virtualenvs, shell functions.
        Commands in one session run one after another. A command that exceeds `timeout`
        seconds is killed, but the session and its state survive. Output is cut at 64 KiB
        per stream.
        """
        try:
            sbx = await pool.get(sandbox)
            try:
                r = await sbx.sessions.run(session, command, timeout=timeout)
            except (SessionNotFound, SessionDead):
                await sbx.sessions.create(session)
                r = await sbx.sessions.run(session, command, timeout=timeout)
        except SandpodError as exc:
            raise _tool_error(exc) from exc
        out, out_cut = _clip(r.stdout_bytes)
        err, err_cut = _clip(r.stderr_bytes)
        return {
            "exit_code": r.exit_code,
            "stdout": out,
            "stderr": err,
            "stdout_truncated": out_cut or r.stdout_truncated,
            "stderr_truncated": err_cut or r.stderr_truncated,
            "timed_out": r.timed_out,
            "cwd": r.cwd,
            "session_ended": r.shell_exited,
        }
