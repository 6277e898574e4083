"""Python binding of the Sandpod bus contract (``schemas/``).

Subjects, typed messages, the codec and the error model live here and nowhere else; services and
SDKs import them from this package.

The names below are imported on first use (PEP 562 ``__getattr__``): importing a submodule such
as ``sandpod_contract.subjects`` runs this file first, and the eager import of the catalogue
(every family's messages, about 0.1 s) made each CLI command pay for all of them.
"""

from __future__ import annotations

import importlib

# typing.TYPE_CHECKING without importing typing (mypy and pyright honour any name so spelled).
TYPE_CHECKING = False
if TYPE_CHECKING:  # what type checkers see: the eager imports this module defers
    from typing import Any

    from sandpod_contract.catalogue import (
        DATA_PLANE,
        EVENTS,
        FRAMES,
        PLANES,
        PROTOCOL_VERSION,
        EventStream,
        Operation,
        Plane,
        operation,
    )
    from sandpod_contract.codec import Message, decode, decode_reply, encode, encode_error
    from sandpod_contract.subjects import DEFAULT_PREFIX, Subjects, validate_sandbox_id

_CATALOGUE = "sandpod_contract.catalogue"
_CODEC = "sandpod_contract.codec"
_SUBJECTS = "sandpod_contract.subjects"

# name -> the module that defines it
_LAZY: dict[str, str] = {
    "DATA_PLANE": _CATALOGUE,
    "DEFAULT_PREFIX": _SUBJECTS,
    "EVENTS": _CATALOGUE,
    "FRAMES": _CATALOGUE,
    "PLANES": _CATALOGUE,
    "PROTOCOL_VERSION": _CATALOGUE,
    "EventStream": _CATALOGUE,
    "Message": _CODEC,
    "Operation": _CATALOGUE,
    "Plane": _CATALOGUE,
    "Subjects": _SUBJECTS,
    "decode": _CODEC,
    "decode_reply": _CODEC,
    "encode": _CODEC,
    "encode_error": _CODEC,
    "operation": _CATALOGUE,
    "validate_sandbox_id": _SUBJECTS,
}

__all__ = [
    "DATA_PLANE",
    "DEFAULT_PREFIX",
    "EVENTS",
    "FRAMES",
    "PLANES",
    "PROTOCOL_VERSION",
    "EventStream",
    "Message",
    "Operation",
    "Plane",
    "Subjects",
    "decode",
    "decode_reply",
    "encode",
    "encode_error",
    "operation",
    "validate_sandbox_id",
]


def __getattr__(name: str) -> Any:
    """Import the module behind ``name`` on first access and cache the value here."""
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'sandpod_contract' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
