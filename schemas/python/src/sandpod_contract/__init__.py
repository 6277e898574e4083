"""Python binding of the Sandpod bus contract (``schemas/``).

Subjects, typed messages, the codec and the error model live here and nowhere else; services and
SDKs import them from this package.
"""

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
