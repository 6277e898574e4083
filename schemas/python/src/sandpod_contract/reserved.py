"""Reserved metadata: labels and annotations under ``sandpod.dev/`` belong to the services.

The services record what they decided in such keys (a pool member's ``sandpod.dev/pool``, a
claim's ``sandpod.dev/claim``, the owning ``sandpod.dev/tenant``, a delete mark), and other
services trust them. So no client may set or change one, nor set ``ownerReferences`` (pool
membership rests on them): every API handler that takes a client's object calls
:func:`refuse_reserved` before anything else, and keeps the stored object's reserved keys when
it replaces one (:func:`keep_reserved`). The gateway and the SDK check the same way first, for
an earlier error; the services' check is the one that counts (anything can speak NATS).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sandpod_contract.errors import BadRequest

__all__ = ["RESERVED_PREFIX", "is_reserved", "keep_reserved", "refuse_reserved", "reserved_in"]

RESERVED_PREFIX = "sandpod.dev/"


def is_reserved(key: object) -> bool:
    """True for a label or annotation key only services may write (``sandpod.dev/...``, and
    any key of the ``sandpod.dev`` domain or a subdomain of it)."""
    if not isinstance(key, str) or "/" not in key:
        return False
    domain = key.split("/", 1)[0].lower()
    return domain == "sandpod.dev" or domain.endswith(".sandpod.dev")


def reserved_in(keys: Iterable[object]) -> list[str]:
    """The reserved keys among ``keys``, sorted."""
    return sorted(str(k) for k in keys if is_reserved(k))


def _refuse(field: str, keys: Iterable[object]) -> None:
    found = reserved_in(keys)
    if found:
        raise BadRequest(
            f"{field} key {found[0]!r} is reserved: keys under {RESERVED_PREFIX!r} are set by "
            "Sandpod's services only; remove it (use a key of your own domain, e.g. "
            "'example.com/role')",
            field=field,
            key=found[0],
        )


def refuse_reserved(obj: Mapping[str, Any], *, spec_labels: bool = False) -> None:
    """Refuse a client's object that sets a reserved label or annotation or any owner reference.

    ``spec_labels``: also check ``spec.labels`` (a claim's labels for its sandbox).

    Raises:
        BadRequest: naming the field and the key (``details.key``).
    """
    if not isinstance(obj, Mapping):
        return  # the handler's own validation names the real problem
    meta = obj.get("metadata") or {}
    if isinstance(meta, Mapping):
        for field in ("labels", "annotations"):
            value = meta.get(field) or {}
            if isinstance(value, Mapping):
                _refuse(f"metadata.{field}", value)
        if meta.get("ownerReferences"):
            raise BadRequest(
                "metadata.ownerReferences is set by Sandpod's services only; remove it",
                field="metadata.ownerReferences",
                key="ownerReferences",
            )
    spec = obj.get("spec") or {}
    if spec_labels and isinstance(spec, Mapping):
        labels = spec.get("labels") or {}
        if isinstance(labels, Mapping):
            _refuse("spec.labels", labels)


def keep_reserved(new: Mapping[str, str], stored: Mapping[str, str]) -> dict[str, str]:
    """``new`` (a client's, already refused if reserved) with ``stored``'s reserved keys kept."""
    return {**dict(new), **{k: v for k, v in stored.items() if is_reserved(k)}}
