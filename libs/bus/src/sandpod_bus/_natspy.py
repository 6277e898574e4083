"""Import nats-py without aiohttp, and give aiohttp back to it when a ``ws://`` URL needs it.

nats-py's ``nats.aio.transport`` runs ``try: import aiohttp`` at import time, for its WebSocket
transport only; aiohttp (installed here as a dependency of ``kubernetes``) then costs about 0.4 s
of every Sandpod process's start, the CLI's included, although TCP connections never touch it.
The optional import is skipped the way the import system documents: while ``nats`` loads,
``sys.modules["aiohttp"]`` is ``None``, so ``import aiohttp`` raises ``ModuleNotFoundError`` and
nats-py records ``aiohttp = None``; the entry is then removed, so anyone else (gateway, kubernetes)
imports aiohttp normally afterwards. :func:`websocket_support` rebinds nats-py's module global to
the real aiohttp before a ``ws://``/``wss://`` connection: the value nats-py's own try-import would
have bound, so its WebSocket transport works unchanged.

When aiohttp is already imported, or nats already is, nothing is blocked (nats-py then holds the
real module, as before). Importing this module does it; ``sandpod_bus/__init__.py`` imports it
before any nats import.
"""

from __future__ import annotations

import importlib
import sys

__all__ = ["WS_SCHEMES", "import_nats", "websocket_support"]

WS_SCHEMES = ("ws://", "wss://")
_OPTIONAL = "aiohttp"


def import_nats() -> None:
    """Import ``nats`` (client and transport) with its optional aiohttp import skipped."""
    if _OPTIONAL in sys.modules or "nats.aio.transport" in sys.modules:
        importlib.import_module("nats")
        return
    sys.modules[_OPTIONAL] = None  # type: ignore[assignment]  # documented: import raises
    try:
        importlib.import_module("nats")
    finally:
        if sys.modules.get(_OPTIONAL, 0) is None:
            del sys.modules[_OPTIONAL]


def websocket_support(servers: list[str]) -> None:
    """Before connecting to ``servers``: if any is a WebSocket URL, give nats-py aiohttp.

    Raises:
        ModuleNotFoundError: a WebSocket URL, and aiohttp is not installed (what nats-py's own
            WebSocket transport would raise, earlier and with the module's name).
    """
    if not any(s.lower().startswith(WS_SCHEMES) for s in servers):
        return
    transport = importlib.import_module("nats.aio.transport")
    if getattr(transport, _OPTIONAL, None) is None:
        setattr(transport, _OPTIONAL, importlib.import_module(_OPTIONAL))


import_nats()
