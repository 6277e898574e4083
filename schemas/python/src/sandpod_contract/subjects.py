"""Subject builders: the only place a NATS subject string is assembled or parsed.

    <prefix>.api.<kind>.<verb>                 control plane requests (queue groups)
    <prefix>.api.t.<tenant>.<kind>.<verb>      the same, as tenant <tenant>: the services take
                                               the tenant from the subject (a tenant credential
                                               may publish only under its own)
    <prefix>.sbx.<sandbox>.<family>.<verb>     data plane of one sandbox, answered by its execd
    <prefix>.events.<kind>.<name>.<type>       lifecycle and audit events

Every data-plane subject of a sandbox sits under ``<prefix>.sbx.<sandbox>.>``, so one NATS
permission scopes a credential to exactly one sandbox. The prefix is configurable so several
installations can share one NATS.
"""

from __future__ import annotations

import dataclasses
import re
from typing import NamedTuple

__all__ = [
    "DEFAULT_PREFIX",
    "SANDBOX_ID_RE",
    "TOKEN_RE",
    "DataSubject",
    "Subjects",
    "validate_sandbox_id",
]

DEFAULT_PREFIX = "sandpod"
# Always used with fullmatch: "$" alone would accept a trailing newline.
SANDBOX_ID_RE = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
TOKEN_RE = re.compile(r"[A-Za-z0-9_-]+")


def validate_sandbox_id(sandbox_id: str) -> str:
    """Return ``sandbox_id`` if it is a DNS label (like Kubernetes names), else raise ValueError."""
    if not isinstance(sandbox_id, str) or not SANDBOX_ID_RE.fullmatch(sandbox_id):
        raise ValueError(
            f"invalid sandbox id {sandbox_id!r}: use 1-63 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    return sandbox_id


def _validate_prefix(prefix: str) -> None:
    if not prefix or not all(TOKEN_RE.fullmatch(t) for t in prefix.split(".")):
        raise ValueError(f"invalid subject prefix {prefix!r}: dot-separated [A-Za-z0-9_-] tokens")


class DataSubject(NamedTuple):
    """A parsed data-plane subject."""

    sandbox_id: str
    family: str
    verb: str


@dataclasses.dataclass(frozen=True, slots=True)
class Subjects:
    """Subject builders for one installation (one prefix).

    ``tenant``: a client acting as that tenant (with a tenant credential): its control-plane
    requests (:meth:`api`) go on the tenant's own subjects (:meth:`api_tenant`), the only ones
    its credential may publish to. Services leave it None.
    """

    prefix: str = DEFAULT_PREFIX
    tenant: str | None = None

    def __post_init__(self) -> None:
        _validate_prefix(self.prefix)
        if self.tenant is not None and not TOKEN_RE.fullmatch(self.tenant):
            raise ValueError(f"invalid tenant {self.tenant!r}")

    # -- data plane ----------------------------------------------------------------------------

    def sandbox(self, sandbox_id: str, family: str, verb: str) -> str:
        """The subject of ``family.verb`` on sandbox ``sandbox_id``."""
        validate_sandbox_id(sandbox_id)
        for token in (family, verb):
            if not TOKEN_RE.fullmatch(token):
                raise ValueError(f"invalid subject token {token!r}")
        return f"{self.prefix}.sbx.{sandbox_id}.{family}.{verb}"

    def sandbox_prefix(self, sandbox_id: str) -> str:
        """``<prefix>.sbx.<id>``: what every data-plane subject of the sandbox starts with."""
        validate_sandbox_id(sandbox_id)
        return f"{self.prefix}.sbx.{sandbox_id}"

    def sandbox_all(self, sandbox_id: str) -> str:
        """Wildcard covering every data-plane subject of one sandbox (for subscriptions/ACLs)."""
        validate_sandbox_id(sandbox_id)
        return f"{self.prefix}.sbx.{sandbox_id}.>"

    def parse_sandbox(self, subject: str) -> DataSubject | None:
        """Split a data-plane subject; ``None`` unless ``<prefix>.sbx.<id>.<family>.<verb>``."""
        head = f"{self.prefix}.sbx."
        if not subject.startswith(head):
            return None
        parts = subject[len(head) :].split(".")
        if len(parts) != 3 or not all(parts):
            return None
        return DataSubject(parts[0], parts[1], parts[2])

    # -- control plane and events --------------------------------------------------------------

    def api(self, kind: str, verb: str) -> str:
        """Control-plane request subject, e.g. ``sandpod.api.sandboxes.create`` (the tenant's,
        ``sandpod.api.t.<tenant>.sandboxes.create``, when this client acts as a tenant)."""
        if self.tenant is not None:
            return self.api_tenant(self.tenant, kind, verb)
        for token in (kind, verb):
            if not TOKEN_RE.fullmatch(token):
                raise ValueError(f"invalid subject token {token!r}")
        return f"{self.prefix}.api.{kind}.{verb}"

    def node(self, node: str, service: str, verb: str) -> str:
        """Node-plane subject: ``<prefix>.node.<node>.<service>.<verb>``."""
        for token in (node, service, verb):
            if not TOKEN_RE.fullmatch(token):
                raise ValueError(f"invalid subject token {token!r}")
        return f"{self.prefix}.node.{node}.{service}.{verb}"

    def node_all(self, node: str, service: str) -> str:
        if not TOKEN_RE.fullmatch(node) or not TOKEN_RE.fullmatch(service):
            raise ValueError(f"invalid node {node!r} or service {service!r}")
        return f"{self.prefix}.node.{node}.{service}.*"

    @property
    def storage_base(self) -> str:
        """The installation's name for JetStream buckets and streams (no dots there): the
        prefix with ``.`` as ``-``, so installations sharing a NATS keep their state apart."""
        return self.prefix.replace(".", "-")

    def storage(self, name: str) -> str:
        """A bucket or stream of this installation, e.g. ``sandpod-resources``."""
        if not TOKEN_RE.fullmatch(name):
            raise ValueError(f"invalid storage name {name!r}")
        return f"{self.storage_base}-{name}"

    def api_kind(self, kind: str) -> str:
        """Wildcard of one kind's control-plane verbs, e.g. ``sandpod.api.pools.*`` (each
        service subscribes to the kinds it serves)."""
        if not TOKEN_RE.fullmatch(kind):
            raise ValueError(f"invalid subject token {kind!r}")
        return f"{self.prefix}.api.{kind}.*"

    def api_all(self) -> str:
        """Wildcard covering every control-plane subject."""
        return f"{self.prefix}.api.>"

    def api_tenant(self, tenant: str, kind: str, verb: str) -> str:
        """A tenant's control-plane request subject, e.g. ``sandpod.api.t.acme.sandboxes.list``:
        the services act for ``tenant`` whatever the request body says."""
        for token in (tenant, kind, verb):
            if not TOKEN_RE.fullmatch(token):
                raise ValueError(f"invalid subject token {token!r}")
        return f"{self.prefix}.api.t.{tenant}.{kind}.{verb}"

    def api_tenant_kind(self, kind: str) -> str:
        """Every tenant's verbs of one kind, e.g. ``sandpod.api.t.*.pools.*`` (what a service
        subscribes to beside :meth:`api_kind`)."""
        if not TOKEN_RE.fullmatch(kind):
            raise ValueError(f"invalid subject token {kind!r}")
        return f"{self.prefix}.api.t.*.{kind}.*"

    def api_tenant_all(self, tenant: str) -> str:
        """Every control-plane subject of one tenant (a tenant credential's publish right)."""
        if not TOKEN_RE.fullmatch(tenant):
            raise ValueError(f"invalid subject token {tenant!r}")
        return f"{self.prefix}.api.t.{tenant}.>"

    def parse_api_tenant(self, subject: str) -> tuple[str, str, str] | None:
        """``(tenant, kind, verb)`` of ``<prefix>.api.t.<tenant>.<kind>.<verb>``, else None."""
        head = f"{self.prefix}.api.t."
        if not subject.startswith(head):
            return None
        parts = subject[len(head) :].split(".")
        if len(parts) != 3 or not all(parts):
            return None
        return parts[0], parts[1], parts[2]

    def parse_api(self, subject: str) -> tuple[str, str] | None:
        """``(kind, verb)`` of ``<prefix>.api.<kind>.<verb>``, else ``None``."""
        head = f"{self.prefix}.api."
        if not subject.startswith(head):
            return None
        parts = subject[len(head) :].split(".")
        if len(parts) != 2 or not all(parts):
            return None
        return parts[0], parts[1]

    def event(self, kind: str, name: str, event_type: str) -> str:
        """Event subject, e.g. ``sandpod.events.sandbox.demo.ready``."""
        for token in (kind, name, event_type):
            if not TOKEN_RE.fullmatch(token):
                raise ValueError(f"invalid subject token {token!r}")
        return f"{self.prefix}.events.{kind}.{name}.{event_type}"

    def events_of(self, kind: str, name: str) -> str:
        """Wildcard covering every event type of one object."""
        for token in (kind, name):
            if not TOKEN_RE.fullmatch(token):
                raise ValueError(f"invalid subject token {token!r}")
        return f"{self.prefix}.events.{kind}.{name}.*"

    def events_all(self) -> str:
        """Wildcard covering every event subject."""
        return f"{self.prefix}.events.>"
