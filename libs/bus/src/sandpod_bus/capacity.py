"""Why JetStream refused to make a stream or bucket, in words an operator can act on.

A stream reserves its ``max_bytes`` of the server's file store when it is made; KV and object
buckets reserve nothing but still need the store not to be fully reserved. When the server
cannot hold the reservation it answers API error 10047 ("insufficient storage resources
available"), which says neither how much was asked nor what is left. So the bus turns that
answer into the contract's :class:`~sandpod_contract.errors.InsufficientStorage` here:

    nats-py APIError (err_code 10047)
      -> ask the account's JetStream figures ($JS.API.INFO: reserved, stored, limits),
         best effort and bounded by INFO_TIMEOUT
      -> InsufficientStorage(stream, reserve_bytes, the figures) whose message names the
         stream, the sizes, which limit is short (the account's, or the server's own
         ``max_file_store``) and what to do.

The server's own ``max_file_store`` is not reachable over NATS by an ordinary account (only its
monitoring port or the system account report it), so the message bounds it instead: it is below
what the account reserves plus what was asked. Every JetStream creation in the bus (streams, KV
and object buckets) goes through :func:`out_of_storage` and :func:`insufficient_storage`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import nats.errors
import nats.js.api
import nats.js.errors
from nats.aio.client import Client as NatsClient

from sandpod_contract.errors import InsufficientStorage

__all__ = ["AccountRoom", "human_bytes", "insufficient_storage", "out_of_storage"]

STORAGE_EXCEEDED = 10047  # JetStream API error: JSStorageResourcesExceededErr (file storage)
INFO_TIMEOUT = 2.0  # seconds the account figures may take; the error goes out without them


@dataclasses.dataclass(frozen=True, slots=True)
class AccountRoom:
    """The account's JetStream file storage as ``$JS.API.INFO`` reports it (bytes)."""

    reserved: int  # what its streams' max_bytes reserve
    stored: int  # what they hold
    limit: int  # the account's own limit; -1: none (the server's is the only one)
    streams: int


def out_of_storage(exc: BaseException) -> bool:
    """Whether ``exc`` is JetStream refusing a reservation for lack of file storage."""
    return isinstance(exc, nats.js.errors.APIError) and exc.err_code == STORAGE_EXCEEDED


def human_bytes(n: int) -> str:
    """``268435456`` -> ``256 MiB``; exact multiples print without decimals."""
    size, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            break
        size /= 1024
    if unit == "B":
        return f"{n} B"
    return f"{size:.0f} {unit}" if size == int(size) else f"{size:.1f} {unit}"


async def account_room(nc: NatsClient) -> AccountRoom | str:
    """The account's figures, or why they are unavailable (never raises: this only explains
    another error)."""
    try:
        reply = await nc.request(f"{nats.js.api.DEFAULT_PREFIX}.INFO", b"", timeout=INFO_TIMEOUT)
        info: Any = json.loads(reply.data)
    except (nats.errors.Error, TimeoutError, ValueError) as exc:
        return f"no answer to {nats.js.api.DEFAULT_PREFIX}.INFO ({type(exc).__name__})"
    if not isinstance(info, dict) or "error" in info:
        return f"{nats.js.api.DEFAULT_PREFIX}.INFO answered {str(info)[:200]}"
    limits = info.get("limits")
    if not isinstance(limits, dict):
        limits = {}
    try:
        return AccountRoom(
            reserved=int(info.get("reserved_storage", 0)),
            stored=int(info.get("storage", 0)),
            limit=int(limits.get("max_storage", -1)),
            streams=int(info.get("streams", 0)),
        )
    except (TypeError, ValueError):
        return f"{nats.js.api.DEFAULT_PREFIX}.INFO answered {str(info)[:200]}"


async def insufficient_storage(
    nc: NatsClient, *, what: str, stream: str, reserve: int, setting: str | None = None
) -> InsufficientStorage:
    """The typed error for JetStream refusing ``stream`` (``what`` names it for a reader:
    ``stream x``, ``KV bucket y``), which reserves ``reserve`` bytes (<= 0: nothing of its
    own); ``setting`` is the setting that sizes it, offered as a remedy."""
    room = await account_room(nc)
    message = _message(what, reserve, room, setting)
    figures: dict[str, int] = {}
    if isinstance(room, AccountRoom):
        figures = {
            "account_reserved_bytes": room.reserved,
            "account_stored_bytes": room.stored,
            "account_limit_bytes": room.limit,
            "account_streams": room.streams,
        }
    return InsufficientStorage(
        message, stream=stream, reserve_bytes=max(reserve, 0), setting=setting, **figures
    )


def _message(what: str, reserve: int, room: AccountRoom | str, setting: str | None) -> str:
    if reserve > 0:
        head = f"it cannot reserve {human_bytes(reserve)} of file storage"
    else:  # a bucket reserves nothing, but needs the store not to be fully reserved
        head = "the file store has nothing left to reserve"
    lines = [
        f"JetStream has no room for {what}: {head} "
        "(nats-server: insufficient storage resources available)."
    ]
    if isinstance(room, str):
        lines.append(f"The account's JetStream figures are unavailable: {room}.")
        short = "the server's file store (max_file_store) or the account's storage limit"
    else:
        limit = human_bytes(room.limit) if room.limit >= 0 else "none"
        lines.append(
            f"This account's {room.streams} stream{'' if room.streams == 1 else 's'} reserve "
            f"{human_bytes(room.reserved)} and "
            f"hold {human_bytes(room.stored)}; the account's own storage limit: {limit}."
        )
        if 0 <= room.limit < room.reserved + max(reserve, 1):
            short = f"the account's storage limit ({limit})"
        elif reserve > 0:
            short = (
                "the server's file store: its max_file_store is below "
                f"{human_bytes(room.reserved + reserve)} (these reservations and this one; "
                "other accounts' reservations count too)"
            )
        else:
            short = (
                "the server's file store: its max_file_store is all reserved "
                "(by these streams and any other account's)"
            )
    lines.append(f"What is short is {short}.")
    remedies = [
        "free disk space where nats-server keeps JetStream (by default its max_file_store is "
        "75% of the free space there when it starts) and restart it",
        "raise nats-server's `jetstream { max_file_store: ... }` (or the account's JetStream "
        "storage limit, if it has one)",
        "delete streams that are no longer needed",
    ]
    if setting:
        remedies.append(f"lower {setting} (now {reserve} bytes, {human_bytes(reserve)})")
    lines.append("To fix it: " + "; or ".join(remedies) + ".")
    return " ".join(lines)
