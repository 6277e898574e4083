"""execd settings, read once from the environment at start-up.

| variable | default | meaning |
|---|---|---|
| ``SANDPOD_NATS_URL`` / ``NATS_URL`` | ``nats://127.0.0.1:4222`` | NATS server(s) |
| ``SANDPOD_NATS_CREDS`` | unset | NATS creds file (operator mode), watched for renewals |
| ``SANDPOD_PREFIX`` | ``sandpod`` | subject prefix of the installation |
| ``SANDPOD_SANDBOX_ID`` | ``default`` | sandbox id(s) served, comma-separated |
| ``SANDPOD_WORKSPACE`` | ``$SANDPOD_STATE_DIR/workspaces/<id>`` | what ``/workspace`` maps to |
| ``SANDPOD_STATE_DIR`` | ``~/.local/state/sandpod`` | where workspaces are created |
| ``SANDPOD_EXECD_MAX_EXECS`` | 1024 | concurrent execs before ``busy`` |
| ``SANDPOD_EXECD_MAX_REQUEST`` | 1 MiB | largest accepted request (bytes) |
| ``SANDPOD_EXECD_MAX_OUTPUT`` | 16 MiB | default per-stream capture cap of one-shot exec |
| ``SANDPOD_EXECD_MAX_OUTPUT_LIMIT`` | 64 MiB | largest ``max_output`` honoured (more: clamped) |
| ``SANDPOD_EXECD_WINDOW`` | 4 MiB | default stream window (unacked bytes in flight) |
| ``SANDPOD_EXECD_MAX_WINDOW`` | 16 MiB | largest window a client may ask for |
| ``SANDPOD_EXECD_ABANDON_AFTER`` | 60 s | client silence after which a stream's command dies |
| ``SANDPOD_EXECD_RESULT_TTL`` | 60 s | how long unfetched one-shot output is kept |
| ``SANDPOD_EXECD_SHELL`` | ``/bin/bash`` if present, else ``/bin/sh`` | shell for shell strings |
| ``SANDPOD_EXECD_NODE`` | unset | node id: serve sandboxes on demand (``node.*.execd.serve``) |
| ``SANDPOD_EXECD_JAIL`` | unset | jail file (local runtime): commands run in it; ``{sandbox_id}`` |
| ``SANDPOD_EXECD_ENV`` | ``{}`` | JSON map: default env of commands (the template's and spec's) |
| ``SANDPOD_EXECD_FREEZER`` | ``auto`` | pause: cgroup v2 freezer if writable, else signals |
| ``SANDPOD_LOG_LEVEL`` | ``info`` | log level |
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path

from sandpod_bus import BusSettings
from sandpod_contract.subjects import DEFAULT_PREFIX, validate_sandbox_id
from sandpod_service import env_float, env_int, env_str

__all__ = ["ExecdSettings"]

MiB = 1024 * 1024
DEFAULT_STATE_DIR = Path("~/.local/state/sandpod").expanduser()


def _default_shell() -> str:
    return "/bin/bash" if Path("/bin/bash").exists() else "/bin/sh"


@dataclasses.dataclass(frozen=True)
class ExecdSettings:
    bus: BusSettings = dataclasses.field(default_factory=BusSettings)
    prefix: str = DEFAULT_PREFIX
    sandbox_ids: tuple[str, ...] = ("default",)
    state_dir: Path = dataclasses.field(default_factory=lambda: DEFAULT_STATE_DIR)
    workspace: Path | None = None  # None: <state_dir>/workspaces/<sandbox id>
    # SANDPOD_ROOTFS: the sandbox's own root filesystem ("/" in a Pod), whose changes since
    # execd started ``sys.snapshot`` can capture; None: the host's (never captured)
    rootfs: Path | None = None
    max_execs: int = 1024
    max_request_bytes: int = MiB
    default_max_output: int = 16 * MiB
    max_output_limit: int = 64 * MiB  # a client's max_output above it is clamped to it
    default_window: int = 4 * MiB
    max_window: int = 16 * MiB
    max_chunk: int = 256 * 1024
    abandon_after: float = 60.0
    result_ttl: float = 60.0
    pipe_grace: float = 0.2  # after exit, how long to keep reading pipes a grandchild holds open
    shell: str = dataclasses.field(default_factory=_default_shell)
    jail: str | None = None  # jail file path, may contain {sandbox_id}; None: process runtime
    node: str | None = None  # serve sandboxes on demand: <prefix>.node.<node>.execd.*
    base_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    grace: float = 10.0
    freezer: str = "auto"  # sandpod_execd.freezer.MODES
    log_level: str = "info"

    def output_cap(self, requested: int | None) -> int:
        """The per-stream capture cap of a one-shot exec asking for ``requested`` bytes.

        A client may not make execd hold more than ``max_output_limit`` per stream in memory.
        """
        return min(
            self.default_max_output if requested is None else requested, self.max_output_limit
        )

    def workspace_for(self, sandbox_id: str) -> Path:
        return self.workspace or self.state_dir / "workspaces" / sandbox_id

    def jail_file(self, sandbox_id: str) -> Path | None:
        return Path(self.jail.replace("{sandbox_id}", sandbox_id)) if self.jail else None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ExecdSettings:
        """Build settings from ``env`` (default: the process environment)."""
        env = os.environ if env is None else env
        node = env_str(env, "SANDPOD_EXECD_NODE", "") or None
        ids = tuple(
            validate_sandbox_id(s.strip())
            for s in env_str(env, "SANDPOD_SANDBOX_ID", "" if node else "default").split(",")
            if s.strip()
        )
        workspace = env_str(env, "SANDPOD_WORKSPACE", "")
        if workspace and len(ids) > 1:
            raise ValueError("SANDPOD_WORKSPACE is per sandbox: serve one sandbox id with it")
        jail = env_str(env, "SANDPOD_EXECD_JAIL", "") or None
        rootfs = env_str(env, "SANDPOD_ROOTFS", "")
        if rootfs and not rootfs.startswith("/"):
            raise ValueError(f"SANDPOD_ROOTFS must be an absolute path, not {rootfs!r}")
        base_env = _json_env(env_str(env, "SANDPOD_EXECD_ENV", "") or "{}")
        if jail and len(ids) > 1 and "{sandbox_id}" not in jail:
            raise ValueError("SANDPOD_EXECD_JAIL serving several ids needs {sandbox_id} in it")
        return cls(
            bus=BusSettings(
                url=env_str(env, ("SANDPOD_NATS_URL", "NATS_URL"), BusSettings.url),
                creds=env_str(env, "SANDPOD_NATS_CREDS", "") or None,
                name=f"execd:{','.join(ids)}",
            ),
            prefix=env_str(env, "SANDPOD_PREFIX", DEFAULT_PREFIX),
            sandbox_ids=ids,
            node=node,
            state_dir=Path(env_str(env, "SANDPOD_STATE_DIR", str(DEFAULT_STATE_DIR))).expanduser(),
            workspace=Path(workspace).expanduser() if workspace else None,
            rootfs=Path(rootfs) if rootfs else None,
            base_env=base_env,
            max_execs=env_int(env, "SANDPOD_EXECD_MAX_EXECS", cls.max_execs, minimum=1),
            max_request_bytes=env_int(
                env, "SANDPOD_EXECD_MAX_REQUEST", cls.max_request_bytes, minimum=1024
            ),
            default_max_output=env_int(env, "SANDPOD_EXECD_MAX_OUTPUT", cls.default_max_output),
            max_output_limit=env_int(
                env, "SANDPOD_EXECD_MAX_OUTPUT_LIMIT", cls.max_output_limit, minimum=1024
            ),
            default_window=env_int(env, "SANDPOD_EXECD_WINDOW", cls.default_window, minimum=1),
            max_window=env_int(env, "SANDPOD_EXECD_MAX_WINDOW", cls.max_window, minimum=1),
            abandon_after=env_float(
                env, "SANDPOD_EXECD_ABANDON_AFTER", cls.abandon_after, minimum=0.1
            ),
            result_ttl=env_float(env, "SANDPOD_EXECD_RESULT_TTL", cls.result_ttl, minimum=0.1),
            shell=env_str(env, "SANDPOD_EXECD_SHELL", _default_shell()),
            jail=jail,
            log_level=env_str(env, "SANDPOD_LOG_LEVEL", "info"),
            freezer=_freezer(env_str(env, "SANDPOD_EXECD_FREEZER", "auto")),
        )


def _freezer(raw: str) -> str:
    """``SANDPOD_EXECD_FREEZER``: ``auto`` or ``signals``. Raises ValueError."""
    if raw not in ("auto", "signals"):
        raise ValueError(f"SANDPOD_EXECD_FREEZER must be auto or signals, got {raw!r}")
    return raw


def _json_env(raw: str) -> dict[str, str]:
    """``SANDPOD_EXECD_ENV``: a JSON object of string values. Raises ValueError."""
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"SANDPOD_EXECD_ENV is not JSON: {exc}") from exc
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise ValueError("SANDPOD_EXECD_ENV must be a JSON object of strings")
    return data
