"""The service users of an installation's NATS and their least-privilege permissions: the one
definition behind both the embedded ``sandpod up`` (:mod:`sandpod_lifecycle.embedded_auth`) and
Kubernetes mode's setup tool (:mod:`sandpod_lifecycle.natsauth_setup`).

Anything not in a user's allow lists is a permission violation, refused by the server. The
services that make JetStream streams or buckets may read the account's JetStream figures
(``JS_ACCOUNT_INFO``), to explain a reservation the server refuses.
"""

from __future__ import annotations

from sandpod_bus.natsauth import (
    INBOX_ALL,
    JS_ACCOUNT_INFO,
    Permissions,
    kv_owner_subjects,
    kv_subjects,
    object_owner_subjects,
    object_reader_subjects,
    object_subjects,
    stream_subjects,
)
from sandpod_contract.subjects import Subjects

__all__ = ["EMBEDDED_USERS", "KUBERNETES_USERS", "embedded_users", "kubernetes_users"]

EMBEDDED_USERS = ("lifecycle", "pool", "gateway", "execd", "client")
KUBERNETES_USERS = ("lifecycle", "pool", "gateway", "client")


def _kinds(subjects: Subjects, *kinds: str) -> tuple[str, ...]:
    """The API subjects a service answers for ``kinds``: global and every tenant's."""
    return tuple(x for k in kinds for x in (subjects.api_kind(k), subjects.api_tenant_kind(k)))


def _users(subjects: Subjects, node: str | None) -> dict[str, Permissions]:
    """``node`` None: Kubernetes mode. There the store is the API server (no resources bucket:
    lifecycle refuses ``SANDPOD_RUNTIME=kubernetes`` without ``SANDPOD_STORE=kube``), leader
    election runs on Leases (no leases bucket), there is no node plane, and each Pod's
    execd connects with its sandbox's own creds (minted by lifecycle), so there is no execd
    user."""
    s = subjects
    api, sbx, events = s.api_all(), s.sandboxes_all(), s.events_all()
    events_stream = stream_subjects(s.storage("events"))
    keys = kv_subjects(s.storage("gateway-keys"))
    kv_store: tuple[str, ...] = ()
    kv_owned: tuple[str, ...] = ()  # the same buckets, the lifecycle's (compact) grant
    node_plane: tuple[str, ...] = ()
    # template builds' uploaded files: the client writes them in both modes; the lifecycle
    # reads them where it builds (the local runtime; a compact grant: its JWT must fit the
    # server's 4 KiB CONNECT line). In Kubernetes mode each builder Pod reads them with a
    # user of its own (sandpod_lifecycle.builds.buildcreds).
    contexts = object_subjects(s.storage("build-contexts"))
    # snapshot layers (both modes, unless they go to S3): the lifecycle alone writes, reads
    # and deletes them (reading finds a chunk's stream by subject: STREAM.NAMES)
    snapshots = object_owner_subjects(s.storage("snapshots"))
    reads: tuple[str, ...] = (*snapshots, "$JS.API.STREAM.NAMES")
    if node is not None:
        kv_store = (*kv_subjects(s.storage("resources")), *kv_subjects(s.storage("leases")))
        kv_owned = tuple(
            x for b in ("resources", "leases") for x in kv_owner_subjects(s.storage(b))
        )
        node_plane = (s.node_plane(),)
        reads = (*object_reader_subjects(s.storage("build-contexts")), *snapshots)
    users = {
        "lifecycle": Permissions(
            pub_allow=(
                *(sbx, *node_plane, events, INBOX_ALL),
                *(*kv_owned, *events_stream, *reads, JS_ACCOUNT_INFO),
            ),
            sub_allow=(*_kinds(s, "sandboxes", "templates", "snapshots", "volumes"), INBOX_ALL),
        ),
        "pool": Permissions(
            pub_allow=(api, sbx, INBOX_ALL, *kv_store, JS_ACCOUNT_INFO),
            sub_allow=(*_kinds(s, "pools", "claims"), INBOX_ALL),
        ),
        "gateway": Permissions(
            pub_allow=(api, sbx, INBOX_ALL, *keys, JS_ACCOUNT_INFO), sub_allow=(INBOX_ALL, events)
        ),
        "client": Permissions(pub_allow=(api, sbx, *contexts), sub_allow=(INBOX_ALL, events)),
    }
    if node is not None:
        users["execd"] = Permissions(
            pub_allow=(INBOX_ALL,), sub_allow=(sbx, s.node_all(node, "execd")), resp_max=1
        )
    return users


def embedded_users(subjects: Subjects, node: str) -> dict[str, Permissions]:
    """``sandpod up``'s users (see :data:`EMBEDDED_USERS`).

    - lifecycle: the node plane (alone), its API kinds, sandboxes' data plane (probes), the
      store and lease buckets and the event stream;
    - pool: its API kinds, the store and lease buckets, ``sys.configure`` on members;
    - gateway: the API and data plane as a client, its key bucket, the events;
    - execd: its sandboxes' subjects and this node's node-plane verbs; replies only;
    - client (CLI, SDK, MCP on this machine): the API and data plane, the events, the
      build-context object store (a template build's files; content-addressed, and the
      lifecycle checks each digest); no other JetStream, no node plane.

    Raises:
        ValueError: an invalid node id.
    """
    return _users(subjects, node)


def kubernetes_users(subjects: Subjects) -> dict[str, Permissions]:
    """Kubernetes mode's users (see :data:`KUBERNETES_USERS`): as :func:`embedded_users` without
    the node plane, the store and lease buckets, and execd.

    - lifecycle: its API kinds, sandboxes' data plane (probes, configure), the event stream;
    - pool: its API kinds, the API as a client (claims create sandboxes), ``sys.configure``;
    - gateway: the API and data plane as a client, its key bucket, the events;
    - client (an operator's CLI/SDK): the API and data plane, the events, the build-context
      object store (a template build's files, read by the builder Pod); no other JetStream.
    """
    return _users(subjects, None)
