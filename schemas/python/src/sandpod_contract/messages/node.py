"""Node plane ``<prefix>.node.<node>.execd.<verb>``: a lifecycle replica tells the execd of its
host which sandboxes to serve.

One execd serving many sandboxes makes sandboxes cheap (no interpreter per sandbox: creating one is
a subscription, and memory per sandbox is a few hundred KiB). Only the lifecycle service may use
these subjects (a NATS permission on ``<prefix>.node.>``); sandboxes never reach them.
"""

from __future__ import annotations

import dataclasses

from sandpod_contract.codec import Message
from sandpod_contract.messages.common import Empty
from sandpod_contract.operations import Operation

__all__ = ["NODE_PLANE", "NodeSandboxes", "Release", "Serve"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Serve(Message):
    """``serve``: start answering ``<prefix>.sbx.<sandbox_id>.>`` (idempotent)."""

    TYPE = "node.serve"
    sandbox_id: str  # a sandbox id (sandbox_id_pattern in subjects.json), else bad_request
    # Ignored (kept for wire compatibility): execd takes a sandbox's jail from its own
    # configuration, never from a request; a node configured for jails refuses a sandbox
    # without one (sandbox.jail_refused).
    jail: str | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Release(Message):
    """``release``: stop serving a sandbox and kill every process it started (idempotent).
    ``drain``: seconds to let commands already running finish first (their callers get their
    answers; a hibernating sandbox's), new requests finding no responder meanwhile."""

    TYPE = "node.release"
    sandbox_id: str  # releasing a sandbox not served is a no-op (the reply lists what is)
    drain: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NodeSandboxes(Message):
    """Reply: the sandboxes this execd serves now."""

    TYPE = "node.sandboxes"
    sandbox_ids: tuple[str, ...]  # sorted


NODE_PLANE: tuple[Operation, ...] = (
    Operation("execd", "serve", Serve, NodeSandboxes, "serve one more sandbox"),
    Operation("execd", "release", Release, NodeSandboxes, "stop serving a sandbox"),
    Operation("execd", "list", Empty, NodeSandboxes, "the sandboxes served"),
)
