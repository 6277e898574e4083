"""``sys`` family: liveness and self-description of a sandbox's execd."""

from __future__ import annotations

import dataclasses

from sandpod_contract.codec import Message
from sandpod_contract.messages.common import Empty
from sandpod_contract.operations import Operation

__all__ = ["OPERATIONS", "Info", "Pong"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Pong(Message):
    """Reply to ``sys.ping``."""

    TYPE = "sys.pong"
    sandbox_id: str
    time: float  # execd's wall clock, seconds since the epoch


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Info(Message):
    """Reply to ``sys.info``: what this execd is and the limits a client must respect."""

    TYPE = "sys.info"
    sandbox_id: str
    execd_version: str
    protocol_version: int
    runtime: str  # e.g. "process"
    isolation: str  # e.g. "none": commands run on the host as execd's user
    hostname: str
    pid: int
    started_at: float
    workspace: str  # the directory "/workspace" resolves to
    max_request_bytes: int  # larger requests are refused with bad_request.too_large
    max_payload: int  # the NATS server's max payload as execd sees it
    default_window: int  # stream window used when a client does not ask for one
    max_window: int
    default_max_output: int  # per-stream capture cap of one-shot exec
    families: tuple[str, ...] = ()


OPERATIONS: tuple[Operation, ...] = (
    Operation("sys", "ping", Empty, Pong, "liveness; answers without touching any command"),
    Operation("sys", "info", Empty, Info, "runtime, isolation and limits of this execd"),
)
