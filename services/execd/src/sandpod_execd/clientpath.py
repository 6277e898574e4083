"""Host paths as clients see them: ``/workspace/...`` inside the sandbox's workspace.

In the ``process`` runtime ``/workspace`` is an alias (see :class:`~sandpod_execd.sandbox.
SandboxContext.resolve_cwd`); replies show paths through the same alias so a client can pass them
back unchanged, and never learn the host layout for paths inside the workspace.
"""

from __future__ import annotations

from pathlib import Path

from sandpod_execd.sandbox import WORKSPACE_ALIAS

__all__ = ["client_path"]


def client_path(workspace: Path, host: str) -> str:
    """``/workspace/...`` for ``host`` inside ``workspace``; any other path unchanged."""
    ws = str(workspace).rstrip("/")
    if host == ws:
        return WORKSPACE_ALIAS
    if host.startswith(ws + "/"):
        return WORKSPACE_ALIAS + host[len(ws) :]
    return host
