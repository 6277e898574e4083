"""Sandpod: sandboxes for AI agents, over NATS.

    from sandpod import Sandbox
    sbx = Sandbox.connect("default")
    r = sbx.exec("/workspace", "date")
    print(r.stdout, r.exit_code)

``AsyncSandbox`` offers the same surface with ``await``.
"""

from sandpod import errors
from sandpod.aio import AsyncExecStream, AsyncSandbox
from sandpod.errors import (
    CommandFailed,
    ExecLost,
    RequestTimeout,
    SandboxNotFound,
    SandboxUnavailable,
    SandpodError,
)
from sandpod.exec.types import ExecResult, ExitStatus, OutputChunk
from sandpod.pools import AsyncPools, ClaimInfo, PoolInfo, Pools
from sandpod.sync import ExecStream, Sandbox

__version__ = "0.1.0"

__all__ = [
    "AsyncExecStream",
    "AsyncPools",
    "AsyncSandbox",
    "ClaimInfo",
    "CommandFailed",
    "ExecLost",
    "ExecResult",
    "ExecStream",
    "ExitStatus",
    "OutputChunk",
    "PoolInfo",
    "Pools",
    "RequestTimeout",
    "Sandbox",
    "SandboxNotFound",
    "SandboxUnavailable",
    "SandpodError",
    "__version__",
    "errors",
]
