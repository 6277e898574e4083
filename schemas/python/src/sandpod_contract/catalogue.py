"""The operation catalogue: every verb that crosses NATS, by plane, with its message types.

Each family lists its own operations in ``messages/<family>.py``; this module only joins them and
says, per plane, on which subject they travel, who answers and in which queue group:

    data     <prefix>.sbx.<sandbox>.<family>.<verb>   the sandbox's execd      sandpod-execd
    control  <prefix>.api.<kind>.<verb>               lifecycle / pool         sandpod-lifecycle,
                                                                               sandpod-pool
    node     <prefix>.node.<node>.execd.<verb>        the execd of that node   (no group)
    events   <prefix>.events.<kind>.<name>.<type>     published, never answered

The tables are the single source for execd's router, the control-plane servers, the generated
docs in ``schemas/`` and the test vectors. An operation whose ``reply`` is ``None`` is
publish-only (no reply is sent).
"""

from __future__ import annotations

import dataclasses

from sandpod_contract._data_errors import DATA_ERRORS
from sandpod_contract.codec import Message
from sandpod_contract.errors import (
    BadRequest,
    Busy,
    InternalError,
    PayloadTooLarge,
    SandboxNotFound,
    SandpodError,
    StoreError,
    UnknownSubject,
    UnsupportedVersion,
)
from sandpod_contract.messages import exec as exec_
from sandpod_contract.messages import (
    fs,
    git,
    node,
    pools,
    proc,
    pty,
    sandboxes,
    session,
    system,
    watch,
)
from sandpod_contract.operations import Operation

__all__ = [
    "CONTROL_PLANES",
    "DATA",
    "DATA_PLANE",
    "EVENTS",
    "FAMILIES",
    "FRAMES",
    "LIFECYCLE",
    "NODE",
    "PLANES",
    "POOL",
    "PROTOCOL_VERSION",
    "EventStream",
    "Operation",
    "Plane",
    "operation",
]

PROTOCOL_VERSION = 1

FAMILIES = (system, exec_, fs, proc, session, pty, watch, git)

# Each data-plane operation with its own error codes joined in (tabled in _data_errors).
DATA_PLANE: tuple[Operation, ...] = tuple(
    dataclasses.replace(op, errors=(*op.errors, *DATA_ERRORS[f"{op.family}.{op.verb}"]))
    for fam in FAMILIES
    for op in fam.OPERATIONS
)

# Frames published by execd to a client's deliver subject, told apart by their ``kind`` field.
FRAMES: tuple[type[Message], ...] = tuple(
    frame for fam in FAMILIES for frame in getattr(fam, "FRAMES", ())
)


@dataclasses.dataclass(frozen=True, slots=True)
class Plane:
    """Operations that share a subject shape, a kind of server and its queue group.

    ``subject`` is a pattern with ``{family}`` and ``{verb}`` filled per operation (the
    placeholders in ``<...>`` are the caller's: prefix, sandbox id, node id). ``queue`` is the
    NATS queue group every server of the plane subscribes in, so each request reaches exactly one
    of them; ``None`` means one server per subject (no group). ``errors``: the codes any
    operation of the plane may reply with besides its own (:attr:`Operation.errors`).
    """

    name: str
    subject: str
    served_by: str
    queue: str | None
    operations: tuple[Operation, ...]
    errors: tuple[type[SandpodError], ...]
    doc: str

    def subject_of(self, op: Operation) -> str:
        """The subject pattern of ``op`` on this plane, e.g. ``<prefix>.api.pools.scale``."""
        return self.subject.format(family=op.family, verb=op.verb)


@dataclasses.dataclass(frozen=True, slots=True)
class EventStream:
    """Events of one kind: published (never requested) on ``subject``, kept in ``stream``."""

    kind: str
    subject: str
    message: type[Message]
    types: tuple[str, ...]  # the subject's last token, also the message's ``type`` field
    published_by: str
    stream: str  # JetStream stream holding them; <storage> is the prefix with '.' as '-'
    doc: str


# Every request can be malformed, too new, on an unknown verb, or hit a bug in its server.
_DECODE = (BadRequest, UnsupportedVersion, UnknownSubject, InternalError)

DATA = Plane(
    name="data",
    subject="<prefix>.sbx.<sandbox>.{family}.{verb}",
    served_by="execd serving the sandbox",
    queue="sandpod-execd",
    operations=DATA_PLANE,
    errors=(*_DECODE, PayloadTooLarge, Busy, SandboxNotFound),
    doc="a sandbox's commands, files, processes, terminals, watches and git; one NATS "
    "permission on <prefix>.sbx.<sandbox>.> scopes a credential to one sandbox",
)
LIFECYCLE = Plane(
    name="control",
    subject="<prefix>.api.{family}.{verb}",
    served_by="lifecycle",
    queue="sandpod-lifecycle",
    operations=sandboxes.CONTROL_PLANE,
    errors=(*_DECODE, StoreError),
    doc="Sandboxes and SandboxTemplates as Kubernetes-shaped maps (crds/); any replica answers",
)
POOL = Plane(
    name="control",
    subject="<prefix>.api.{family}.{verb}",
    served_by="pool",
    queue="sandpod-pool",
    operations=pools.POOL_PLANE,
    errors=(*_DECODE, StoreError),
    doc="SandboxWarmPools and SandboxClaims as Kubernetes-shaped maps (crds/); any replica answers",
)
NODE = Plane(
    name="node",
    subject="<prefix>.node.<node>.{family}.{verb}",
    served_by="the execd started with SANDPOD_EXECD_NODE=<node>",
    queue=None,
    operations=node.NODE_PLANE,
    errors=(BadRequest, UnsupportedVersion, UnknownSubject),
    doc="the lifecycle service of node <node> tells its execd which sandboxes to serve; only "
    "the lifecycle service may publish here (permission on <prefix>.node.>)",
)
CONTROL_PLANES: tuple[Plane, ...] = (LIFECYCLE, POOL)
PLANES: tuple[Plane, ...] = (DATA, LIFECYCLE, POOL, NODE)

EVENTS: tuple[EventStream, ...] = (
    EventStream(
        kind="sandbox",
        subject="<prefix>.events.sandbox.<name>.<type>",
        message=sandboxes.SandboxEvent,
        types=sandboxes.SANDBOX_EVENT_TYPES,
        published_by="lifecycle",
        stream="<storage>-events",
        doc="every Sandbox transition, in order per sandbox; retained 7 days",
    ),
    EventStream(
        kind="network",
        subject="<prefix>.events.network.<name>.<type>",
        message=sandboxes.NetworkEvent,
        types=sandboxes.NETWORK_EVENT_TYPES,
        published_by="lifecycle (updated) and the network enforcers (denied)",
        stream="<storage>-events",
        doc="a sandbox's egress policy applied, and destinations its enforcers refused "
        "(rate-limited); retained 7 days",
    ),
    EventStream(
        kind="volume",
        subject="<prefix>.events.volume.<name>.<type>",
        message=sandboxes.SandboxEvent,
        types=sandboxes.VOLUME_EVENT_TYPES,
        published_by="lifecycle",
        stream="<storage>-events",
        doc="a SandboxVolume created, claimed by a sandbox (reason: the sandbox; message: "
        "read-only or read-write), released, deleted; retained 7 days",
    ),
)

_BY_KEY = {(op.family, op.verb): op for op in DATA_PLANE}
if len(_BY_KEY) != len(DATA_PLANE):  # pragma: no cover - a binding bug caught at import
    raise RuntimeError("duplicate (family, verb) in the operation catalogue")
_SUBJECTS = [plane.subject_of(op) for plane in PLANES for op in plane.operations]
if len(set(_SUBJECTS)) != len(_SUBJECTS):  # pragma: no cover - a binding bug caught at import
    raise RuntimeError("two operations on one subject pattern in the catalogue")


def operation(family: str, verb: str) -> Operation | None:
    """The data-plane operation for ``family.verb``, or ``None`` if there is none."""
    return _BY_KEY.get((family, verb))
