"""Sandpod's resource store: one interface, several implementations (see ``interface``)."""

from sandpod_store.interface import EventType, Store, WatchEvent
from sandpod_store.kv import KvStore
from sandpod_store.memory import MemoryStore
from sandpod_store.model import ObjectMeta, OwnerReference, Resource, Selector, parse_selector
from sandpod_store.views import (
    DELETE_ANNOTATION,
    ClaimView,
    SandboxView,
    bound_at,
    condition,
    set_condition,
)

__all__ = [
    "DELETE_ANNOTATION",
    "ClaimView",
    "EventType",
    "KvStore",
    "MemoryStore",
    "ObjectMeta",
    "OwnerReference",
    "Resource",
    "SandboxView",
    "Selector",
    "Store",
    "WatchEvent",
    "bound_at",
    "condition",
    "parse_selector",
    "set_condition",
]
