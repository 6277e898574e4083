"""Preview URLs and port-forwarding: reaching a server inside a sandbox through the gateway.

Inbound traffic reaches a sandbox only through the gateway (its authenticated preview URLs), so
this is the one part of the SDK that speaks HTTP instead of NATS: ``sbx.expose(8000)`` asks the
gateway (``POST /v1/sandboxes/{id}/previews``) for a signed link, or records the port as public.
Where the gateway is and which key to use: the arguments, else ``$SANDPOD_GATEWAY_URL`` and
``$SANDPOD_API_KEY``, else what a local ``sandpod up`` wrote in its state dir (``gateway-url``,
``gateway-api-key``). Blocking urllib runs in a worker thread: no second HTTP stack to install.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from sandpod.config import DEFAULT_STATE_DIR
from sandpod.errors import BadRequest, SandboxError
from sandpod_contract.errors import error_from_wire

__all__ = ["GatewayAccess", "Preview", "create_preview", "remove_preview", "resolve_gateway"]

TIMEOUT = 30.0


@dataclasses.dataclass(frozen=True, slots=True)
class GatewayAccess:
    url: str  # e.g. http://127.0.0.1:8080
    api_key: str


@dataclasses.dataclass(frozen=True, slots=True)
class Preview:
    """A port's preview URLs. ``url`` (path form) always works; ``host_url`` (the app at the
    root path) when the gateway has a preview domain. Links with a ``token`` expire at
    ``expires_at`` (Unix seconds); ``public`` ones need no credentials until made private."""

    port: int
    url: str
    host_url: str | None
    public: bool
    token: str | None = None
    expires_at: int | None = None
    host_url_reason: str | None = None  # why host_url is None though the gateway has a domain

    @classmethod
    def of(cls, body: dict[str, Any]) -> Preview:
        return cls(
            port=int(body["port"]),
            url=str(body["url"]),
            host_url=body.get("host_url"),
            public=bool(body.get("public")),
            token=body.get("token"),
            expires_at=body.get("expires_at"),
            host_url_reason=body.get("host_url_reason"),
        )


def _state_file(name: str) -> str | None:
    base = Path(os.environ.get("SANDPOD_STATE_DIR") or DEFAULT_STATE_DIR).expanduser()
    path = base / name
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def resolve_gateway(url: str | None = None, api_key: str | None = None) -> GatewayAccess:
    """The gateway to ask, and the key. Raises BadRequest naming what is missing."""
    url = url or os.environ.get("SANDPOD_GATEWAY_URL") or _state_file("gateway-url")
    key = api_key or os.environ.get("SANDPOD_API_KEY") or _state_file("gateway-api-key")
    if not url:
        raise BadRequest(
            "no gateway: pass gateway=, set SANDPOD_GATEWAY_URL, or run `sandpod up` (which "
            "writes its URL to the state dir)"
        )
    if not url.startswith(("http://", "https://")):
        raise BadRequest(f"gateway {url!r}: give an http:// or https:// URL")
    if not key:
        raise BadRequest("no API key: pass api_key= or set SANDPOD_API_KEY")
    return GatewayAccess(url.rstrip("/"), key)


def _call(gw: GatewayAccess, method: str, path: str, body: dict[str, Any] | None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(  # noqa: S310 - the scheme is checked in resolve_gateway
        gw.url + path,
        method=method,
        data=data,
        headers={"authorization": f"Bearer {gw.api_key}", "content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as reply:  # noqa: S310
            return json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            wire = json.loads(raw)
        except ValueError:
            wire = None
        if not isinstance(wire, dict) or "code" not in wire:
            raise SandboxError(f"the gateway answered {exc.code}: {raw[:300]!r}") from exc
        raise error_from_wire(wire) from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise SandboxError(f"cannot reach the gateway at {gw.url}: {exc}") from exc


async def create_preview(
    gw: GatewayAccess, sandbox_id: str, port: int, *, public: bool, ttl: float | None
) -> Preview:
    body: dict[str, Any] = {"port": port, "public": public}
    if ttl is not None:
        body["ttl_seconds"] = ttl
    path = f"/v1/sandboxes/{sandbox_id}/previews"
    return Preview.of(await asyncio.to_thread(_call, gw, "POST", path, body))


async def remove_preview(gw: GatewayAccess, sandbox_id: str, port: int) -> None:
    path = f"/v1/sandboxes/{sandbox_id}/previews/{port}"
    await asyncio.to_thread(_call, gw, "DELETE", path, None)
