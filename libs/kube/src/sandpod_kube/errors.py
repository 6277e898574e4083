"""API-server failures become the contract's typed store errors, at this one boundary.

The decision uses the HTTP status and the ``reason`` field of the ``Status`` object the API server
returns (``AlreadyExists`` vs ``Conflict`` share 409), never the message text; the message is kept
only so a human reading the error sees what the API server said.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sandpod_contract.errors import (
    ResourceConflict,
    ResourceExists,
    ResourceExpired,
    ResourceInvalid,
    ResourceNotFound,
    StoreError,
)

__all__ = ["StoreForbidden", "from_api_error", "from_status"]


class StoreForbidden(StoreError):
    """The API server refused this identity (401/403): retrying will not help."""

    retryable = False


_BY_CODE: dict[int, type[StoreError]] = {
    400: ResourceInvalid,  # BadRequest: e.g. a malformed label selector
    401: StoreForbidden,
    403: StoreForbidden,
    404: ResourceNotFound,
    409: ResourceConflict,  # reason AlreadyExists is ResourceExists, below
    410: ResourceExpired,  # watch from a compacted resourceVersion
    422: ResourceInvalid,  # Invalid: the CRD schema (or metadata validation) refused the object
}


def from_status(status: Mapping[str, Any], what: str, kind: str, name: str | None) -> StoreError:
    """The typed error for a ``Status`` object (a failed call, or a watch's ERROR event)."""
    code = int(status.get("code") or 0)
    reason = str(status.get("reason") or "")
    message = f"{what}: {status.get('message') or reason or f'HTTP {code}'}"
    details: dict[str, Any] = {"kind": kind, "name": name, "reason": reason or None}
    cls = _BY_CODE.get(code, StoreError)
    if code == 409 and reason == "AlreadyExists":
        cls = ResourceExists
    if cls is ResourceInvalid:
        causes = (status.get("details") or {}).get("causes") or []
        fields = [str(c["field"]) for c in causes if isinstance(c, Mapping) and c.get("field")]
        details["field"] = ",".join(fields) or None
    if cls is StoreError:
        details["code"] = code or None
    return cls(message, **details)


def from_api_error(
    status: int | None, body: str | bytes | None, what: str, kind: str, name: str | None = None
) -> StoreError:
    """The typed error for a failed HTTP call (status code and raw ``Status`` body)."""
    parsed: Any = None
    if body:
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
    if not isinstance(parsed, Mapping) or parsed.get("kind") != "Status":
        parsed = {"code": status, "message": (body or b"")[:500] if body else None}
        if isinstance(parsed["message"], bytes):
            parsed["message"] = parsed["message"].decode("utf-8", "replace")
    return from_status({**parsed, "code": parsed.get("code") or status}, what, kind, name)
