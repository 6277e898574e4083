"""The OpenAPI 3.1 document of the gateway, built from one table of operations.

The same document is served at ``/openapi.json`` and checked into
``schemas/openapi/gateway.json`` (a test keeps them equal: regenerate with
``python -m sandpod_gateway openapi > schemas/openapi/gateway.json``). Request bodies are
described precisely (clients are generated from them, and schemathesis fuzzes them); replies of
the data plane mirror the contract's messages (``schemas/messages``) with bytes as
``<field>_base64``.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["spec"]

_S = "#/components/schemas/"
_P = "#/components/parameters/"
OBJ: dict[str, Any] = {"type": "object"}
ERR = {"description": "error", "content": {"application/json": {"schema": {"$ref": _S + "Error"}}}}
STR = {"type": "string"}
INT = {"type": "integer", "minimum": 0}
NUM = {"type": "number", "minimum": 0}
BOOL = {"type": "boolean"}
STRS = {"type": "array", "items": STR}
STRMAP = {"type": "object", "additionalProperties": STR}

COMMAND: dict[str, Any] = {
    "type": "object",
    "properties": {
        "argv": {**STRS, "minItems": 1},
        "shell": STR,
        "cwd": STR,
        "env": STRMAP,
        "timeout": {"type": "number", "exclusiveMinimum": 0},
        "stdin": STR,
        "stdin_base64": STR,
        "encoding": {"enum": ["utf-8", "base64"]},
    },
}

SCHEMAS: dict[str, Any] = {
    "NatsCredential": {
        "type": "object",
        "required": ["creds", "inbox_prefix", "tenant", "prefix", "expires_at", "sandboxes"],
        "properties": {
            "creds": STR,
            "inbox_prefix": STR,
            "tenant": STR,
            "prefix": STR,
            "expires_at": INT,
            "sandboxes": STRMAP,
        },
    },
    "ArchiveExtracted": {
        "type": "object",
        "required": ["path", "received"],
        "properties": {"path": STR, "received": INT},
    },
    "PreviewCreate": {
        "type": "object",
        "required": ["port"],
        "properties": {
            "port": {"type": "integer", "minimum": 1, "maximum": 65535},
            "public": BOOL,
            "ttl_seconds": {"type": "number", "exclusiveMinimum": 0},
        },
    },
    "Preview": {
        "type": "object",
        "required": ["sandbox", "port", "public", "url"],
        "properties": {
            "sandbox": STR,
            "port": INT,
            "public": BOOL,
            "url": STR,
            "host_url": {"type": ["string", "null"]},
            "host_url_reason": STR,
            "token": {"type": ["string", "null"]},
            "expires_at": {"type": ["integer", "null"]},
            "address_ready": BOOL,
        },
    },
    "Error": {
        "type": "object",
        "required": ["code", "message", "retryable"],
        "properties": {"code": STR, "message": STR, "retryable": BOOL, "details": OBJ},
    },
    "Sandbox": {
        "type": "object",
        "description": "a sandpod.dev/v1alpha1 Sandbox (see "
        "schemas/crds); metadata.namespace is the tenant",
        "properties": {"apiVersion": STR, "kind": STR, "metadata": OBJ, "spec": OBJ, "status": OBJ},
    },
    "SandboxCreate": {
        "type": "object",
        "properties": {
            "metadata": {
                "type": "object",
                "properties": {"name": STR, "labels": STRMAP, "annotations": STRMAP},
            },
            "spec": OBJ,
            "wait": {"type": "number", "minimum": 0, "maximum": 300},
        },
    },
    "SandboxList": {
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": {"$ref": _S + "Sandbox"}},
            "next_cursor": {"type": ["string", "null"]},
            "truncated": BOOL,
        },
    },
    "Command": COMMAND,
    "Exec": {**COMMAND, "properties": {**COMMAND["properties"], "max_output": INT}},
    "ExecResult": {
        "type": "object",
        "properties": {
            "exec_id": STR,
            "exit_code": {"type": ["integer", "null"]},
            "signal": {"type": ["integer", "null"]},
            "stdout": STR,
            "stderr": STR,
            "encoding": STR,
            "stdout_truncated": BOOL,
            "stderr_truncated": BOOL,
            "timed_out": BOOL,
            "duration": {"type": "number"},
        },
    },
    "ProcessStart": {
        **COMMAND,
        "properties": {**COMMAND["properties"], "proc_id": STR, "tags": STRMAP, "log_limit": INT},
    },
    "FsEntry": OBJ,
    "FsListing": OBJ,
    "FsRemoved": OBJ,
    "FsSearchResult": OBJ,
    "ProcInfo": OBJ,
    "ProcListing": OBJ,
    "ProcLogs": OBJ,
    "Mkdir": {
        "type": "object",
        "required": ["path"],
        "properties": {"path": STR, "parents": BOOL, "mode": INT},
    },
    "Move": {
        "type": "object",
        "required": ["src", "dst"],
        "properties": {"src": STR, "dst": STR, "overwrite": BOOL, "make_parents": BOOL},
    },
    "Chmod": {
        "type": "object",
        "required": ["path", "mode"],
        "properties": {"path": STR, "mode": INT, "recursive": BOOL},
    },
    "Search": {
        "type": "object",
        "required": ["query"],
        "properties": {
            "query": STR,
            "path": STR,
            "glob": STR,
            "regex": BOOL,
            "case_sensitive": BOOL,
            "hidden": BOOL,
            "limit": {"type": "integer", "minimum": 1},
        },
    },
    "Pool": {
        "type": "object",
        "description": "a sandpod.dev/v1alpha1 SandboxWarmPool",
        "properties": {"apiVersion": STR, "kind": STR, "metadata": OBJ, "spec": OBJ, "status": OBJ},
    },
    "PoolCreate": {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": STR,
            "template": STR,
            "replicas": {"type": "integer", "minimum": 0, "maximum": 1000},
            "strategy": {"enum": ["RollingUpdate", "Recreate", "OnClaim"]},
        },
    },
    "PoolScale": {
        "type": "object",
        "required": ["replicas"],
        "properties": {"replicas": {"type": "integer", "minimum": 0, "maximum": 1000}},
    },
    "PoolList": {
        "type": "object",
        "properties": {"items": {"type": "array", "items": {"$ref": _S + "Pool"}}},
    },
    "Volume": {
        "type": "object",
        "description": "a sandpod.dev/v1alpha1 SandboxVolume; status.writer and status.readers "
        "are the sandboxes mounting it read-write and read-only",
        "properties": {"apiVersion": STR, "kind": STR, "metadata": OBJ, "spec": OBJ, "status": OBJ},
    },
    "VolumeCreate": {
        "type": "object",
        "required": ["name", "size"],
        "properties": {"name": STR, "size": STR, "storage_class": STR},
    },
    "VolumeList": {
        "type": "object",
        "properties": {"items": {"type": "array", "items": {"$ref": _S + "Volume"}}},
    },
    "Claim": {
        "type": "object",
        "description": "a sandpod.dev/v1alpha1 SandboxClaim; "
        "status.sandbox is the bound sandbox's name",
        "properties": {"apiVersion": STR, "kind": STR, "metadata": OBJ, "spec": OBJ, "status": OBJ},
    },
    "ClaimCreate": {
        "type": "object",
        "properties": {
            "pool": STR,
            "template": STR,
            "name": STR,
            "lifetime_seconds": {"type": "integer", "minimum": 1},
            "idle_timeout_seconds": {"type": "integer", "minimum": 0},
            "labels": STRMAP,
            "env": STRMAP,
            "wait": {"type": "number", "minimum": 0, "maximum": 300},
        },
    },
    "ClaimList": {
        "type": "object",
        "properties": {"items": {"type": "array", "items": {"$ref": _S + "Claim"}}},
    },
    "WsTicket": {
        "type": "object",
        "required": ["ticket", "expires_in"],
        "properties": {"ticket": STR, "expires_in": {"type": "number"}},
    },
    "NetworkPolicy": {
        "type": "object",
        "description": "a sandbox's egress policy (sandpod_contract.network); PUT replaces it "
        "(absent fields take their default) or, with reset, drops it for the template's",
        "properties": {
            "mode": {"enum": ["public", "allowlist", "deny-all"]},
            "allow": STRS,
            "deny": STRS,
            "limits": {
                "type": "object",
                "properties": {"bandwidthBytesPerSecond": INT, "maxConnections": INT},
            },
            "inject": {"type": "array", "items": STRMAP},
            "reset": BOOL,
            "generation": INT,
            "wait": NUM,
        },
    },
    "NetworkState": {
        "type": "object",
        "required": ["name", "generation", "source", "policy"],
        "properties": {
            "name": STR,
            "generation": INT,
            "source": {"enum": ["sandbox", "template"]},
            "policy": OBJ,
            "applied": OBJ,
            "applied_generation": INT,
            "enforced": BOOL,
            "reason": STR,
        },
    },
    "Renew": {
        "type": "object",
        "properties": {"seconds": {"type": "number", "exclusiveMinimum": 0}, "shutdown_time": STR},
    },
}


def _q(name: str, schema: dict[str, Any], doc: str, required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": required, "schema": schema, "description": doc}


NAME = {"$ref": _P + "name"}
PATH_Q = _q("path", STR, "path in the sandbox (/workspace/... or relative)", True)
PROC = {"name": "proc_id", "in": "path", "required": True, "schema": STR}


def _op(
    op_id: str,
    summary: str,
    tag: str,
    *,
    params: list[dict[str, Any]] | None = None,
    body: str | None = None,
    ok: int = 200,
    reply: str | None = None,
    content: dict[str, Any] | None = None,
    raw_body: bool = False,
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "operationId": op_id,
        "summary": summary,
        "tags": [tag],
        "parameters": params or [],
    }
    if body:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": _S + body}}},
        }
    if raw_body:
        op["requestBody"] = {
            "required": True,
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    ok_content = content or (
        {"application/json": {"schema": {"$ref": _S + reply}}}
        if reply
        else {"application/json": {"schema": OBJ}}
    )
    op["responses"] = {
        str(ok): {"description": "ok", "content": ok_content},
        "4XX": ERR,
        "5XX": ERR,
    }
    return op


SSE = {"text/event-stream": {"schema": STR}}


@functools.cache
def _paths() -> dict[str, Any]:
    sbx = "/v1/sandboxes/{name}"
    sel = [
        _q("selector", STR, "label selector, e.g. app=web,tier!=db"),
        _q("limit", {"type": "integer", "minimum": 1, "maximum": 1000}, "page size"),
        _q("cursor", STR, "next_cursor of the previous page"),
    ]
    wait = [_q("wait", {"type": "number", "minimum": 0, "maximum": 300}, "seconds to wait")]
    return {
        "/healthz": {
            "get": {**_op("healthz", "the process serves HTTP", "health"), "security": []}
        },
        "/readyz": {"get": {**_op("readyz", "connected to NATS", "health"), "security": []}},
        "/metrics": {
            "get": _op(
                "metrics",
                "Prometheus metrics (admin key or metrics token unless "
                "SANDPOD_GATEWAY_METRICS_AUTH=none)",
                "health",
                content={"text/plain": {"schema": STR}},
            )
        },
        "/v1/ws-tickets": {
            "post": _op(
                "createWsTicket",
                "a single-use WebSocket ticket (?ticket= or the "
                "sandpod.ticket.<ticket> subprotocol), valid for expires_in seconds",
                "auth",
                ok=201,
                reply="WsTicket",
            )
        },
        "/v1/sandboxes": {
            "get": _op(
                "listSandboxes",
                "list the tenant's sandboxes",
                "sandboxes",
                params=sel,
                reply="SandboxList",
            ),
            "post": _op(
                "createSandbox",
                "create a sandbox (waits until Ready)",
                "sandboxes",
                body="SandboxCreate",
                ok=201,
                reply="Sandbox",
            ),
        },
        sbx: {
            "get": _op("getSandbox", "one sandbox", "sandboxes", params=[NAME], reply="Sandbox"),
            "delete": _op(
                "deleteSandbox",
                "delete a sandbox",
                "sandboxes",
                params=[NAME, *wait],
                reply="Sandbox",
            ),
        },
        f"{sbx}/renew": {
            "post": _op(
                "renewSandbox",
                "extend the lifetime",
                "sandboxes",
                params=[NAME],
                body="Renew",
                reply="Sandbox",
            )
        },
        f"{sbx}/pause": {
            "post": _op(
                "pauseSandbox", "freeze", "sandboxes", params=[NAME, *wait], reply="Sandbox"
            )
        },
        f"{sbx}/resume": {
            "post": _op("resumeSandbox", "thaw", "sandboxes", params=[NAME, *wait], reply="Sandbox")
        },
        f"{sbx}/network": {
            "get": _op(
                "getSandboxNetwork",
                "the egress policy (wanted and applied)",
                "sandboxes",
                params=[NAME],
                reply="NetworkState",
            ),
            "put": _op(
                "setSandboxNetwork",
                "replace the egress policy at runtime",
                "sandboxes",
                params=[NAME],
                body="NetworkPolicy",
                reply="NetworkState",
            ),
        },
        f"{sbx}/exec": {
            "post": _op(
                "exec",
                "run a command to completion",
                "exec",
                params=[NAME],
                body="Exec",
                reply="ExecResult",
            )
        },
        f"{sbx}/exec/stream": {
            "post": _op(
                "execStream",
                "run a command, output as SSE (stdout/stderr/exit events)",
                "exec",
                params=[NAME],
                body="Command",
                content=SSE,
            )
        },
        f"{sbx}/files/content": {
            "get": _op(
                "download",
                "file bytes (Range supported)",
                "files",
                params=[NAME, PATH_Q],
                content={
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
                },
            ),
            "put": _op(
                "upload",
                "write a file from the raw body (atomic)",
                "files",
                params=[
                    NAME,
                    PATH_Q,
                    _q("mode", STR, "octal bits, e.g. 644"),
                    _q("make_parents", BOOL, "create parents (default true)"),
                ],
                raw_body=True,
                ok=201,
                reply="FsEntry",
            ),
        },
        f"{sbx}/files/archive": {
            "get": _op(
                "archive",
                "a directory as a tar stream (made by the sandbox's tar)",
                "files",
                params=[NAME, PATH_Q, _q("gzip", BOOL, "gzip'ed (default false)")],
                content={
                    "application/x-tar": {"schema": {"type": "string", "format": "binary"}},
                    "application/gzip": {"schema": {"type": "string", "format": "binary"}},
                },
            ),
            "put": _op(
                "extract",
                "unpack a tar body into a directory (made if missing)",
                "files",
                params=[NAME, PATH_Q, _q("gzip", BOOL, "the body is gzip'ed (default false)")],
                raw_body=True,
                ok=201,
                reply="ArchiveExtracted",
            ),
        },
        f"{sbx}/files": {
            "get": _op(
                "listFiles",
                "list a directory",
                "files",
                reply="FsListing",
                params=[
                    NAME,
                    PATH_Q,
                    _q("depth", {"type": "integer", "minimum": 1}, "levels"),
                    _q("hidden", BOOL, "include dot files"),
                    _q("limit", {"type": "integer", "minimum": 1}, "page size"),
                    _q("cursor", STR, "next page"),
                ],
            ),
            "delete": _op(
                "removeFile",
                "delete a path",
                "files",
                reply="FsRemoved",
                params=[
                    NAME,
                    PATH_Q,
                    _q("recursive", BOOL, "non-empty dirs"),
                    _q("missing_ok", BOOL, "no error if absent"),
                ],
            ),
        },
        f"{sbx}/files/stat": {
            "get": _op(
                "statFile",
                "describe a path",
                "files",
                reply="FsEntry",
                params=[NAME, PATH_Q, _q("follow", BOOL, "symlinks")],
            )
        },
        f"{sbx}/files/mkdir": {
            "post": _op(
                "mkdir",
                "create a directory",
                "files",
                ok=201,
                params=[NAME],
                body="Mkdir",
                reply="FsEntry",
            )
        },
        f"{sbx}/files/move": {
            "post": _op(
                "moveFile", "rename or move", "files", params=[NAME], body="Move", reply="FsEntry"
            )
        },
        f"{sbx}/files/chmod": {
            "post": _op(
                "chmod",
                "set permission bits",
                "files",
                params=[NAME],
                body="Chmod",
                reply="FsEntry",
            )
        },
        f"{sbx}/files/search": {
            "post": _op(
                "searchFiles",
                "find lines",
                "files",
                params=[NAME],
                body="Search",
                reply="FsSearchResult",
            )
        },
        f"{sbx}/processes": {
            "get": _op(
                "listProcesses",
                "background processes",
                "processes",
                reply="ProcListing",
                params=[NAME, _q("state", {"enum": ["running", "exited"]}, "filter")],
            ),
            "post": _op(
                "startProcess",
                "start a background process",
                "processes",
                ok=201,
                params=[NAME],
                body="ProcessStart",
                reply="ProcInfo",
            ),
        },
        f"{sbx}/processes/{{proc_id}}": {
            "get": _op(
                "getProcess", "one process", "processes", params=[NAME, PROC], reply="ProcInfo"
            ),
            "delete": _op(
                "killProcess",
                "signal, then SIGKILL after grace",
                "processes",
                reply="ProcInfo",
                params=[
                    NAME,
                    PROC,
                    _q("signal", {"type": "integer", "minimum": 1, "maximum": 64}, "default 15"),
                    _q("grace", {"type": "number", "minimum": 0, "maximum": 60}, "seconds"),
                ],
            ),
        },
        f"{sbx}/processes/{{proc_id}}/logs": {
            "get": _op(
                "processLogs",
                "output after a cursor (long-poll)",
                "processes",
                reply="ProcLogs",
                params=[
                    NAME,
                    PROC,
                    _q("cursor", INT, "byte position"),
                    _q("max_bytes", {"type": "integer", "minimum": 1}, "cap"),
                    _q("wait", {"type": "number", "minimum": 0, "maximum": 60}, "long-poll"),
                    _q("encoding", {"enum": ["utf-8", "base64"]}, "data encoding"),
                ],
            )
        },
        f"{sbx}/watch": {
            "get": _op(
                "watch",
                "file changes as SSE",
                "events",
                content=SSE,
                params=[
                    NAME,
                    _q("path", STR, "default /workspace"),
                    _q("recursive", BOOL, "default true"),
                ],
            )
        },
        f"{sbx}/previews": {
            "get": _op("listPreviews", "the sandbox's public ports", "previews", params=[NAME]),
            "post": _op(
                "createPreview",
                "preview URLs of a port: a signed link (ttl_seconds), or public: true",
                "previews",
                params=[NAME],
                ok=201,
                body="PreviewCreate",
                reply="Preview",
            ),
        },
        f"{sbx}/previews/{{port}}": {
            "delete": _op(
                "deletePreview",
                "make a port private again",
                "previews",
                params=[
                    NAME,
                    {
                        "name": "port",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "integer", "minimum": 1, "maximum": 65535},
                    },
                ],
            )
        },
        "/v1/pools": {
            "get": _op("listPools", "the tenant's warm pools", "pools", reply="PoolList"),
            "post": _op(
                "createPool",
                "create or update a warm pool",
                "pools",
                ok=201,
                body="PoolCreate",
                reply="Pool",
            ),
        },
        "/v1/pools/{name}": {
            "get": _op("getPool", "one pool", "pools", params=[NAME], reply="Pool"),
            "delete": _op(
                "deletePool",
                "delete a pool and its free members",
                "pools",
                params=[NAME],
                reply="Pool",
            ),
        },
        "/v1/pools/{name}/scale": {
            "post": _op(
                "scalePool", "set replicas", "pools", params=[NAME], body="PoolScale", reply="Pool"
            )
        },
        "/v1/claims": {
            "get": _op("listClaims", "the tenant's claims", "claims", reply="ClaimList"),
            "post": _op(
                "createClaim",
                "claim a ready sandbox (warm, else cold: PoolExhausted)",
                "claims",
                ok=201,
                body="ClaimCreate",
                reply="Claim",
            ),
        },
        "/v1/claims/{name}": {
            "get": _op("getClaim", "one claim", "claims", params=[NAME], reply="Claim"),
            "delete": _op(
                "deleteClaim",
                "release a claim (its sandbox is deleted)",
                "claims",
                params=[NAME],
                reply="Claim",
            ),
        },
        "/v1/volumes": {
            "get": _op("listVolumes", "the tenant's volumes", "volumes", reply="VolumeList"),
            "post": _op(
                "createVolume",
                "create a persistent volume of a size (its storage is made at once)",
                "volumes",
                ok=201,
                body="VolumeCreate",
                reply="Volume",
            ),
        },
        "/v1/volumes/{name}": {
            "get": _op("getVolume", "one volume", "volumes", params=[NAME], reply="Volume"),
            "delete": _op(
                "deleteVolume",
                "delete a volume and its data (409 store.in_use while mounted)",
                "volumes",
                params=[NAME],
                reply="Volume",
            ),
        },
        "/v1/credentials/nats": {
            "post": _op(
                "natsCredentials",
                "a NATS credential reaching only this tenant's sandboxes and its "
                "control subjects (<prefix>.api.t.<tenant>.>); connect with its inbox_prefix",
                "credentials",
                ok=201,
                reply="NatsCredential",
            )
        },
        "/v1/events": {
            "get": _op(
                "events",
                "the tenant's lifecycle events as SSE",
                "events",
                content=SSE,
                params=[_q("sandbox", STR, "only this one")],
            )
        },
    }


def spec() -> dict[str, Any]:
    """The document (a fresh copy)."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Sandpod gateway",
            "version": "v1",
            "description": (
                "HTTP API of Sandpod: every call is translated to NATS. Authenticate with "
                "`Authorization: Bearer <API key>`. Errors are {code, message, retryable} with the "
                "wire error codes; a full tenant quota is 429 busy.quota_exceeded with details "
                "{quota, limit, setting}. WebSockets authenticate with a header, the subprotocols "
                "`sandpod` + `sandpod.key.<key>`, or a ticket from POST /v1/ws-tickets. "
                "WebSockets (not describable here): /v1/sandboxes/{name}/pty, "
                "/v1/sandboxes/{name}/exec/ws and /v1/sandboxes/{name}/port-forward/{port}. "
                "Preview URLs relay any method (and WebSockets) to a sandbox's port: "
                "/v1/sandboxes/{id}/ports/{port}/<path> and {port}-{id}.<preview domain>, "
                "with a key, a signed link (?token=) or on a public port; "
                "see services/gateway/README.md."
            ),
        },
        "security": [{"bearer": []}],
        "paths": _paths(),
        "components": {
            "schemas": SCHEMAS,
            "parameters": {
                "name": {
                    "name": "name",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string", "pattern": "^[a-z0-9-]{1,63}$"},
                    "description": "the sandbox's name",
                }
            },
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
