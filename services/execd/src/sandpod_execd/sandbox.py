"""One served sandbox: its id, workspace, base environment and exec registry.

Resolves a request's command, cwd and environment into a :class:`~sandpod_execd.process.Command`.
In the ``process`` runtime ``/workspace`` is an alias: a cwd of ``/workspace`` (or below) maps to
this sandbox's workspace directory on the host, and ``$HOME``/``$SANDPOD_WORKSPACE`` point there.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

from sandpod_execd.process import Command
from sandpod_execd.registry import ExecRegistry

__all__ = ["SandboxContext"]

WORKSPACE_ALIAS = "/workspace"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class SandboxContext:
    def __init__(
        self,
        sandbox_id: str,
        workspace: Path,
        shell: str,
        extra_env: Mapping[str, str],
        registry: ExecRegistry,
    ) -> None:
        self.sandbox_id = sandbox_id
        self.workspace = workspace
        self.shell = shell
        self.registry = registry
        self.last_activity = time.time()  # wall clock of the last client activity (idle timeouts)
        # Never the daemon's own environment: it may hold NATS credentials.
        self.base_env: dict[str, str] = {
            "PATH": DEFAULT_PATH,
            "HOME": str(workspace),
            "LANG": "C.UTF-8",
            "SANDPOD_SANDBOX_ID": sandbox_id,
            "SANDPOD_WORKSPACE": str(workspace),
            **extra_env,
        }

    def touch(self) -> None:
        """Record client activity: exec, stdin, PTY input, stream reads (not probes or info)."""
        self.last_activity = time.time()

    def prepare(self) -> None:
        self.workspace.mkdir(parents=True, exist_ok=True)

    def resolve_cwd(self, cwd: str | None) -> str:
        if not cwd:
            return str(self.workspace)
        if cwd == WORKSPACE_ALIAS or cwd.startswith(WORKSPACE_ALIAS + "/"):
            return os.path.normpath(str(self.workspace) + cwd[len(WORKSPACE_ALIAS) :])
        if not os.path.isabs(cwd):
            return os.path.normpath(os.path.join(self.workspace, cwd))
        return cwd

    def command(
        self,
        argv: tuple[str, ...] | None,
        shell: str | None,
        cwd: str | None,
        env: Mapping[str, str] | None,
        *,
        stdin: bool,
    ) -> Command:
        resolved = self.resolve_cwd(cwd)
        full_env = {**self.base_env, "PWD": resolved, **(env or {})}
        args = argv if argv is not None else (self.shell, "-c", shell or "")
        return Command(argv=tuple(args), cwd=resolved, env=full_env, stdin=stdin)
