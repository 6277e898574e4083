"""Hand-written schemagen inputs of the control plane (``api.*``), the node plane (``node.*``)
and the events (``event.*``); see ``_schemagen_data``.

Objects are Kubernetes-shaped maps (``crds/`` describe them); the examples show the shapes the
lifecycle and pool services send and accept, not every spec field.
"""

from __future__ import annotations

from typing import Any

from sandpod_contract import errors
from sandpod_contract.codec import Message, pack, to_map
from sandpod_contract.messages.node import NodeSandboxes, Release, Serve
from sandpod_contract.messages.pools import Scale
from sandpod_contract.messages.sandboxes import (
    Expose,
    NetworkEvent,
    NetworkState,
    NetworkUpdate,
    ObjectReply,
    ObjectRequest,
    ObjectsReply,
    Ref,
    Renew,
    SandboxEvent,
    Selection,
)

__all__ = ["ACCEPT", "ERRORS", "EXAMPLES", "MESSAGE_RULES", "REJECT", "RULES"]

# message TYPE -> field -> JSON Schema keywords for rules __post_init__ enforces
RULES: dict[str, dict[str, dict[str, Any]]] = {
    "api.ref": {"name": {"minLength": 1}},
    "api.renew": {"seconds": {"exclusiveMinimum": 0}},
    "api.network_update": {
        "name": {"minLength": 1},
        "reset": {"enum": [True]},
        "wait": {"minimum": 0},
    },
    "api.expose": {"name": {"minLength": 1}, "port": {"minimum": 1, "maximum": 65535}},
    "api.scale": {"name": {"minLength": 1}, "replicas": {"minimum": 0}},
}
MESSAGE_RULES: dict[str, dict[str, Any]] = {
    "api.renew": {"oneOf": [{"required": ["seconds"]}, {"required": ["shutdown_time"]}]},
    "api.network_update": {"oneOf": [{"required": ["policy"]}, {"required": ["reset"]}]},
}

_API = "sandpod.dev/v1alpha1"
_NET = {
    "mode": "allowlist",
    "allow": ["pypi.example.org:443", "*.github.com", "10.20.0.0/16:5432"],
    "deny": ["evil.github.com"],
    "limits": {"maxConnections": 256},
}
_META = {"name": "demo", "namespace": "default", "labels": {"app": "agent"}}
_SPEC = {
    "templateRef": {"name": "python"},
    "idleTimeoutSeconds": 900,
    "env": [{"name": "AGENT_ID", "value": "a-17"}],
}
_STORED_META = {
    **_META,
    "uid": "2f7c1d9e-55a4-4f0b-9d3e-0b6c1a2e4f11",
    "generation": 1,
    "resourceVersion": "42",
    "creationTimestamp": "2026-11-30T05:00:00Z",
}
_READY = {
    "type": "Ready",
    "status": "True",
    "reason": "ExecdReady",
    "message": "",
    "lastTransitionTime": "2026-11-30T05:00:01Z",
    "observedGeneration": 1,
}
_SANDBOX = {
    "apiVersion": _API,
    "kind": "Sandbox",
    "metadata": _STORED_META,
    "spec": {
        **_SPEC,
        "permanent": False,
        "operatingMode": "Running",
        "shutdownTime": "2026-11-30T06:00:00Z",
    },
    "status": {
        "phase": "Running",
        "observedGeneration": 1,
        "conditions": [_READY],
        "shutdownTime": "2026-11-30T06:00:00Z",
        "node": "worker-1",
        "endpoint": {"subjectPrefix": "sandpod.sbx.demo"},
    },
}
_POOL = {
    "apiVersion": _API,
    "kind": "SandboxWarmPool",
    "metadata": {**_STORED_META, "name": "python-warm", "labels": {}},
    "spec": {
        "replicas": 3,
        "updateStrategy": {"type": "RollingUpdate"},
        "templateRef": {"name": "python"},
    },
    "status": {
        "replicas": 3,
        "readyReplicas": 2,
        "availableReplicas": 2,
        "observedGeneration": 1,
        "selector": "sandpod.dev/pool=python-warm",
        "templateHash": "5d41402a",
        "conditions": [],
    },
}
_CLAIM = {
    "apiVersion": _API,
    "kind": "SandboxClaim",
    "metadata": {"namespace": "default"},
    "spec": {
        "poolRef": {"name": "python-warm"},
        "lifetimeSeconds": 3600,
        "env": [{"name": "AGENT_ID", "value": "a-17"}],
    },
}

# -- examples: "full" first (every field set), then variants and "minimal" ------------------------

EXAMPLES: dict[str, list[tuple[str, Message]]] = {
    "api.object_request": [
        (
            "full",
            ObjectRequest(
                object={"apiVersion": _API, "kind": "Sandbox", "metadata": _META, "spec": _SPEC},
                wait_ready=60.0,
            ),
        ),
        ("claim", ObjectRequest(object=_CLAIM, wait_ready=30.0)),
        ("minimal", ObjectRequest(object={"spec": {}})),
    ],
    "api.object_reply": [
        ("sandbox", ObjectReply(object=_SANDBOX)),
        ("pool", ObjectReply(object=_POOL)),
    ],
    "api.objects_reply": [
        ("full", ObjectsReply(items=(_SANDBOX,), revision=812, truncated=True)),
        ("minimal", ObjectsReply(items=(), revision=0)),
    ],
    "api.ref": [
        ("full", Ref(name="demo", namespace="team-a", wait=30.0)),
        ("minimal", Ref(name="demo")),
    ],
    "api.renew": [
        ("seconds", Renew(name="demo", namespace="team-a", seconds=1800.0)),
        ("shutdown-time", Renew(name="demo", shutdown_time="2026-11-30T08:00:00Z")),
        ("minimal", Renew(name="demo", seconds=600.0)),
    ],
    "api.network_update": [
        (
            "full",
            NetworkUpdate(
                name="demo",
                namespace="team-a",
                policy=_NET,
                generation=3,
                wait=5.0,
            ),
        ),
        ("reset", NetworkUpdate(name="demo", reset=True)),
        ("minimal", NetworkUpdate(name="demo", policy={"mode": "deny-all"})),
    ],
    "api.network_state": [
        (
            "applied",
            NetworkState(
                name="demo",
                namespace="default",
                generation=4,
                source="sandbox",
                policy=_NET,
                applied=_NET,
                applied_generation=4,
                enforced=False,
                reason="process runtime: egress is not enforced",
            ),
        ),
        (
            "minimal",
            NetworkState(
                name="demo",
                namespace="default",
                generation=1,
                source="template",
                policy={"mode": "public", "allow": [], "deny": []},
            ),
        ),
    ],
    "api.expose": [
        ("full", Expose(name="demo", namespace="team-a", port=8000, public=False)),
        ("minimal", Expose(name="demo", port=8000)),
    ],
    "api.selection": [
        ("full", Selection(namespace="team-a", selector="app=agent,tier!=batch", limit=100)),
        ("minimal", Selection()),
    ],
    "api.scale": [
        ("full", Scale(name="python-warm", namespace="team-a", replicas=10)),
        ("minimal", Scale(name="python-warm", replicas=0)),
    ],
    "node.serve": [
        ("full", Serve(sandbox_id="demo", jail="/run/sandpod/jails/demo.json")),
        ("minimal", Serve(sandbox_id="demo")),
    ],
    "node.release": [
        ("full", Release(sandbox_id="demo", drain=8.0)),
        ("minimal", Release(sandbox_id="demo")),
    ],
    "node.sandboxes": [
        ("basic", NodeSandboxes(sandbox_ids=("demo", "sbx-7f3a"))),
        ("none", NodeSandboxes(sandbox_ids=())),
    ],
    "event.sandbox": [
        (
            "ready",
            SandboxEvent(
                name="demo",
                namespace="default",
                type="ready",
                phase="Running",
                reason="ExecdReady",
                time=1732900000.25,
                generation=1,
            ),
        ),
        (
            "idle-expired",
            SandboxEvent(
                name="demo",
                namespace="default",
                type="idle_expired",
                phase="Terminated",
                reason="IdleTimeout",
                message="no activity for 900s (limit 900s)",
                time=1732901000.5,
                generation=2,
            ),
        ),
        (
            "minimal",
            SandboxEvent(name="demo", namespace="default", type="created", phase="Pending"),
        ),
    ],
    "event.network": [
        (
            "updated",
            NetworkEvent(
                name="demo",
                namespace="default",
                type="updated",
                time=1732900000.25,
                generation=4,
                policy=_NET,
                enforced=True,
            ),
        ),
        (
            "denied",
            NetworkEvent(
                name="demo",
                namespace="default",
                type="denied",
                time=1732900001.5,
                kind="connect",
                destination="169.254.169.254",
                port=80,
                rule="metadata",
                count=3,
            ),
        ),
        ("minimal", NetworkEvent(name="demo", namespace="default", type="denied")),
    ],
}

# (label, type, non-canonical map a decoder must accept, why)
ACCEPT: list[tuple[str, type[Message], dict[str, Any], str]] = [
    (
        "nil-namespace",
        Selection,
        {"v": 1, "namespace": None, "selector": "app=agent"},
        "nil is absent: the namespace is 'default' (there is no 'every namespace' on the wire)",
    ),
    (
        "unknown-fields",
        SandboxEvent,
        {**to_map(EXAMPLES["event.sandbox"][0][1]), "node": "worker-1"},
        "events gain fields over time: ignore the ones you do not know",
    ),
]

_REF = {"v": 1, "name": "demo"}
# (label, type, payload, error code, a JSON Schema validator catches it too, why)
REJECT: list[tuple[str, type[Message], bytes, str, bool, str]] = [
    ("empty-name", Ref, pack({"v": 1, "name": ""}), "bad_request", True, "name is required"),
    (
        "object-not-a-map",
        ObjectRequest,
        pack({"v": 1, "object": ["Sandbox"]}),
        "bad_request",
        True,
        "an object is a map",
    ),
    (
        "renew-both",
        Renew,
        pack({**_REF, "seconds": 60.0, "shutdown_time": "2026-11-30T08:00:00Z"}),
        "bad_request",
        True,
        "exactly one of seconds or shutdown_time",
    ),
    (
        "renew-neither",
        Renew,
        pack(_REF),
        "bad_request",
        True,
        "exactly one of seconds or shutdown_time",
    ),
    (
        "network-policy-and-reset",
        NetworkUpdate,
        pack({**_REF, "policy": {"mode": "public"}, "reset": True}),
        "bad_request",
        True,
        "exactly one of policy or reset",
    ),
    (
        "network-reset-false",
        NetworkUpdate,
        pack({**_REF, "reset": False}),
        "bad_request",
        True,
        "reset is true or absent",
    ),
    (
        "network-neither",
        NetworkUpdate,
        pack(_REF),
        "bad_request",
        True,
        "exactly one of policy or reset",
    ),
    ("renew-zero", Renew, pack({**_REF, "seconds": 0.0}), "bad_request", True, "seconds > 0"),
    ("expose-port-zero", Expose, pack({**_REF, "port": 0}), "bad_request", True, "port 1..65535"),
    (
        "negative-replicas",
        Scale,
        pack({**_REF, "replicas": -1}),
        "bad_request",
        True,
        "replicas >= 0",
    ),
    ("no-replicas", Scale, pack(_REF), "bad_request", True, "replicas is required"),
    (
        "no-sandbox-id",
        Serve,
        pack({"v": 1, "jail": "/run/j.json"}),
        "bad_request",
        True,
        "sandbox_id is required",
    ),
    (
        "ids-not-array",
        NodeSandboxes,
        pack({"v": 1, "sandbox_ids": "demo"}),
        "bad_request",
        True,
        "sandbox_ids is an array",
    ),
    (
        "no-type",
        SandboxEvent,
        pack({"v": 1, "name": "demo", "namespace": "default", "phase": "Running"}),
        "bad_request",
        True,
        "type is required",
    ),
]
# every code these planes raise is already in the data plane's or the claim/store lists
ERRORS: list[errors.SandpodError] = []
