"""One served sandbox: its id, workspace, base environment and exec registry.

Resolves a request's command, cwd and environment into a :class:`~sandpod_execd.process.Command`.
In the ``process`` runtime ``/workspace`` is an alias: a cwd of ``/workspace`` (or below) maps to
this sandbox's workspace directory on the host, and ``$HOME``/``$SANDPOD_WORKSPACE`` point there.
With a :class:`~sandpod_execd.jail.Jail` (local runtime) commands run inside the sandbox, where
``/workspace`` is real: ``command()`` hands the jail a jail path, and host-side code (files,
watchers, session directories) resolves jail paths through :attr:`SandboxContext.fs_root`, never
through a host path string a sandbox link could redirect.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from sandpod_contract.errors import InvalidCwd
from sandpod_execd.files.rooted import Root, host_root
from sandpod_execd.freezer import Freezer
from sandpod_execd.jail import Jail
from sandpod_execd.process import TREE_TOKEN, Command
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
        *,
        jail: Jail | None = None,
        sole: bool = False,
        freezer: str = "auto",
    ) -> None:
        """``sole``: this execd serves no other sandbox; ``freezer``: its mode (both: see
        :class:`~sandpod_execd.freezer.Freezer`)."""
        self.sandbox_id = sandbox_id
        self.freezer = Freezer(sandbox_id, sole=sole, mode=freezer)
        self.jail = jail
        self.workspace = jail.workspace if jail else workspace
        self.shell = shell if jail is None or jail.has_program(shell) else "/bin/sh"
        if jail is not None and jail.image_shell and jail.has_program(jail.image_shell):
            self.shell = jail.image_shell  # the image says which shell it is made for
        self.registry = registry
        self.last_activity = time.time()  # wall clock of the last client activity (idle timeouts)
        self.inflight = 0  # activity requests being handled (a running exec.run, session.run...)
        home = WORKSPACE_ALIAS if jail else str(workspace)
        # Never the daemon's own environment: it may hold NATS credentials.
        self.base_env: dict[str, str] = {
            "PATH": DEFAULT_PATH,
            "HOME": home,
            "LANG": "C.UTF-8",
            "SANDPOD_SANDBOX_ID": sandbox_id,
            "SANDPOD_WORKSPACE": home,
            **extra_env,
            **(jail.env if jail else {}),
        }
        self._template_env = dict(self.base_env)
        self.config_generation = 0

    def configure(self, env: Mapping[str, str], generation: int) -> None:
        """Make ``env`` the configured default environment of new commands (``sys.configure``),
        unless ``generation`` is older than the one in effect."""
        if generation < self.config_generation:
            return
        self.config_generation = generation
        self.base_env = {**self._template_env, **env}

    @property
    def env_workspace(self) -> str:
        """``SANDPOD_WORKSPACE`` as the sandbox's commands carry it (``/workspace`` in a jail):
        with ``SANDPOD_SANDBOX_ID``, what finds their processes by environment."""
        return self.base_env.get("SANDPOD_WORKSPACE", str(self.workspace))

    def touch(self) -> None:
        """Record client activity: exec, stdin, PTY input, stream acks, file operations (not
        probes, nor passive waits and reads of output: see schemas/docs/metrics.md)."""
        self.last_activity = time.time()

    @property
    def busy(self) -> bool:
        """A client is waiting on this sandbox right now: a request in flight or a stream whose
        command runs. A busy sandbox is never idle, however long the command takes."""
        return self.inflight > 0 or bool(self.registry.streams)

    @functools.cached_property
    def fs_root(self) -> Root:
        """Where client paths of host-side code (fs, watch, git's checks) resolve: the jail's
        root (see :mod:`~sandpod_execd.files.rooted`) or, without a jail, the host's ``/``.
        Opened on first use and kept, like the jail itself, for execd's life.

        Raises:
            SandboxUnavailable: the jail is gone.
        """
        return self.jail.fs_root if self.jail is not None else host_root()

    def prepare(self) -> None:
        self.workspace.mkdir(parents=True, exist_ok=True)

    def resolve_cwd(self, cwd: str | None) -> str:
        """The host path of a request's cwd in the process runtime (``/workspace`` mapped).

        Raises:
            RuntimeError: the sandbox is jailed: a host path string of a jail path is a race
                a sandbox symlink can win; resolve ``jail.inside(cwd)`` in :attr:`fs_root`.
        """
        if self.jail is not None:
            raise RuntimeError("resolve_cwd is for the process runtime; use fs_root in a jail")
        if not cwd:
            return str(self.workspace)
        if cwd == WORKSPACE_ALIAS or cwd.startswith(WORKSPACE_ALIAS + "/"):
            return os.path.normpath(str(self.workspace) + cwd[len(WORKSPACE_ALIAS) :])
        if not os.path.isabs(cwd):
            return os.path.normpath(os.path.join(self.workspace, cwd))
        return cwd

    def command_path(self, path: str | None) -> str:
        """A client path as the sandbox's commands see it (for argv and cwd).

        In a jail that is the path inside it (``/workspace/...``); in the process runtime the
        host path (``/workspace`` mapped to the workspace directory). Host-side checks resolve
        it in :attr:`fs_root`.
        """
        if self.jail is not None:
            return self.jail.inside(path)
        return self.resolve_cwd(path)

    def command(
        self,
        argv: tuple[str, ...] | None,
        shell: str | None,
        cwd: str | None,
        env: Mapping[str, str] | None,
        *,
        stdin: bool,
    ) -> Command:
        args = argv if argv is not None else (self.shell, "-c", shell or "")
        # Every command's tree carries a token (a caller's own, e.g. proc's, is kept), so
        # kill_tree finds members that left the group and were re-parented.
        token = (env or {}).get(TREE_TOKEN) or uuid.uuid4().hex
        if self.jail is not None:
            inside = self.jail.inside(cwd)
            jail_env = {**self.base_env, "PWD": inside, **(env or {}), TREE_TOKEN: token}
            cmd = self.jail.command(tuple(args), inside, jail_env, stdin=stdin)
            return dataclasses.replace(cmd, token=token)
        resolved = self.resolve_cwd(cwd)
        if not os.path.isdir(resolved):  # said here, where the client's name for it is known
            ws = str(self.workspace)
            within = resolved == ws or resolved.startswith(ws + "/")
            shown = WORKSPACE_ALIAS + resolved[len(ws) :] if within else (cwd or resolved)
            raise InvalidCwd(f"working directory {shown!r} does not exist", cwd=shown)
        full_env = {**self.base_env, "PWD": resolved, **(env or {}), TREE_TOKEN: token}
        return Command(argv=tuple(args), cwd=resolved, env=full_env, stdin=stdin, token=token)
