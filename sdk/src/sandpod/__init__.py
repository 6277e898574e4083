"""Sandpod: sandboxes for AI agents, over NATS.

    from sandpod import Sandbox
    sbx = Sandbox.connect("default")
    r = sbx.exec("/workspace", "date")
    print(r.stdout, r.exit_code)

``AsyncSandbox`` offers the same surface with ``await``.

Names are imported on first use (PEP 562 ``__getattr__``): ``import sandpod`` loads nothing but
this table, so the CLI and short scripts pay only for the families they touch (the SDK pulls in
asyncio, nats-py and the whole contract, about half a second together). ``__all__`` lists every
lazy name; ``tests/unit/test_public_api.py`` checks each one resolves.
"""

from __future__ import annotations

import importlib

# typing.TYPE_CHECKING without importing typing (mypy and pyright honour any name so spelled).
TYPE_CHECKING = False
if TYPE_CHECKING:  # what type checkers and IDEs see: the eager imports this module defers
    from typing import Any

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
    from sandpod.network import NetworkView
    from sandpod.pools import AsyncPools, ClaimInfo, PoolInfo, Pools
    from sandpod.sync import ExecStream, Sandbox
    from sandpod.templates import AsyncTemplates, Template, TemplateInfo, Templates
    from sandpod.volumes import AsyncVolumes, VolumeInfo, VolumeMount, Volumes

__version__ = "0.1.0"

# name -> the module that defines it (a module itself when the name is the module's).
_LAZY: dict[str, str] = {
    "AsyncExecStream": "sandpod.aio",
    "AsyncPools": "sandpod.pools",
    "AsyncSandbox": "sandpod.aio",
    "AsyncTemplates": "sandpod.templates",
    "AsyncVolumes": "sandpod.volumes",
    "ClaimInfo": "sandpod.pools",
    "CommandFailed": "sandpod.errors",
    "ExecLost": "sandpod.errors",
    "ExecResult": "sandpod.exec.types",
    "ExecStream": "sandpod.sync",
    "ExitStatus": "sandpod.exec.types",
    "NetworkView": "sandpod.network",
    "OutputChunk": "sandpod.exec.types",
    "PoolInfo": "sandpod.pools",
    "Pools": "sandpod.pools",
    "RequestTimeout": "sandpod.errors",
    "Sandbox": "sandpod.sync",
    "SandboxNotFound": "sandpod.errors",
    "SandboxUnavailable": "sandpod.errors",
    "SandpodError": "sandpod.errors",
    "Template": "sandpod.templates",
    "TemplateInfo": "sandpod.templates",
    "Templates": "sandpod.templates",
    "VolumeInfo": "sandpod.volumes",
    "VolumeMount": "sandpod.volumes",
    "Volumes": "sandpod.volumes",
    "errors": "sandpod.errors",
}

__all__ = [
    "AsyncExecStream",
    "AsyncPools",
    "AsyncSandbox",
    "AsyncTemplates",
    "AsyncVolumes",
    "ClaimInfo",
    "CommandFailed",
    "ExecLost",
    "ExecResult",
    "ExecStream",
    "ExitStatus",
    "NetworkView",
    "OutputChunk",
    "PoolInfo",
    "Pools",
    "RequestTimeout",
    "Sandbox",
    "SandboxNotFound",
    "SandboxUnavailable",
    "SandpodError",
    "Template",
    "TemplateInfo",
    "Templates",
    "VolumeInfo",
    "VolumeMount",
    "Volumes",
    "__version__",
    "errors",
]


def __getattr__(name: str) -> Any:
    """Import the module behind ``name`` on first access and cache the value here."""
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'sandpod' has no attribute {name!r}")
    module = importlib.import_module(where)
    value = module if name == where.rpartition(".")[2] else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
