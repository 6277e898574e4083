"""Sandpod's resource store: one interface, several implementations (see ``interface``)."""

from sandpod_store.interface import EventType, Store, WatchEvent
from sandpod_store.kv import KvStore
from sandpod_store.memory import MemoryStore
from sandpod_store.model import ObjectMeta, OwnerReference, Resource, Selector, parse_selector

__all__ = [
    "EventType",
    "KvStore",
    "MemoryStore",
    "ObjectMeta",
    "OwnerReference",
    "Resource",
    "Selector",
    "Store",
    "WatchEvent",
    "parse_selector",
]
