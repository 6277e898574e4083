"""Typed models of the resources in ``schemas/crds/`` (``sandpod.dev/v1alpha1``).

The CRD YAML is the single source of the schema; these dataclasses mirror its ``spec`` and
``status`` properties field for field (``tests/contract/test_crds.py`` checks names, enums and
required fields against the YAML), convert to and from the camelCase wire maps, and validate what
the OpenAPI schema validates, raising :class:`ResourceInvalid` with the offending field.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Mapping
from typing import Any

from sandpod_contract.builds import TemplateBuild
from sandpod_contract.errors import ResourceInvalid
from sandpod_contract.network import NetworkPolicy
from sandpod_contract.times import from_rfc3339
from sandpod_contract.volumes import VolumeMount

__all__ = [
    "API_VERSION",
    "TERMINAL_REASONS",
    "Condition",
    "ConditionReason",
    "ConditionType",
    "EnvVar",
    "IdlePolicy",
    "NetworkStatus",
    "OperatingMode",
    "Phase",
    "SandboxSpec",
    "SandboxStatus",
    "SandboxTemplateSpec",
    "TemplateResources",
    "TemplateSecurity",
    "check_int",
    "check_name",
    "check_time",
    "field_error",
]

API_VERSION = "sandpod.dev/v1alpha1"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_QUANTITY = re.compile(r"[0-9]+(Ki|Mi|Gi|Ti|K|M|G|T)?")
_CPU = re.compile(r"[0-9]+(\.[0-9]+)?m?")
_UNITS = {
    "": 1,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}
MIN_DISK = 16 * 2**20  # the smallest filesystem a sandbox's disk can be


class Phase(enum.StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    PAUSED = "Paused"
    TERMINATING = "Terminating"
    TERMINATED = "Terminated"
    FAILED = "Failed"
    HIBERNATING = "Hibernating"  # its idle policy is Hibernate: being snapshotted and stopped
    HIBERNATED = "Hibernated"  # no instance, its files in a snapshot: its next use wakes it


class IdlePolicy(enum.StrEnum):
    """What idleness means: ``Delete`` the sandbox, or ``Hibernate`` it (files kept in a
    snapshot, processes stopped, memory freed; its next use wakes it)."""

    DELETE = "Delete"
    HIBERNATE = "Hibernate"


class OperatingMode(enum.StrEnum):
    RUNNING = "Running"
    PAUSED = "Paused"


class ConditionType(enum.StrEnum):
    READY = "Ready"
    PAUSED = "Paused"
    EXPIRED = "Expired"
    FAILED = "Failed"
    HIBERNATED = "Hibernated"
    ISOLATED = "Isolated"


class ConditionReason(enum.StrEnum):
    """Stable ``reason`` values of a Sandbox's conditions (also listed in the CRD's docs).

    Tools may switch on these; the ``message`` beside them is for people. Terminal reasons
    (the Sandbox is ``Failed`` and no new instance is made) and transient ones (``Ready=False``
    while the runtime keeps waiting, ``Failed`` with the same reason after the start deadline)
    are told apart in :data:`TERMINAL_REASONS`.
    """

    # Ready
    CREATING = "Creating"  # the object is written; the reconciler has not made its instance yet
    EXECD_READY = "ExecdReady"  # the instance runs and its execd answers
    INSTANCE_STARTING = "InstanceStarting"  # a create failed and is retried with backoff
    INSTANCE_FAILED = "InstanceFailed"  # creates kept failing: given up
    # What a Pod reports (the kubernetes runtime); on Ready=False, then on Failed
    POD_PENDING = "PodPending"  # the Pod exists, is not Ready yet and reports no problem
    UNSCHEDULABLE = "Unschedulable"  # no node fits (the scheduler's message): transient
    IMAGE_PULL_FAILED = "ImagePullFailed"  # ErrImagePull / ImagePullBackOff: transient
    INVALID_IMAGE = "InvalidImage"  # the image reference cannot be parsed: terminal
    CONTAINER_CONFIG_ERROR = "ContainerConfigError"  # CreateContainerConfigError: transient
    CRASH_LOOP = "CrashLoop"  # CrashLoopBackOff: execd keeps exiting: terminal
    EXECD_EXITED = "ExecdExited"  # the sandbox container terminated (exit code): terminal
    OOM_KILLED = "OOMKilled"  # the sandbox container hit its memory limit: terminal
    EVICTED = "Evicted"  # the node evicted the Pod: terminal
    POD_FAILED = "PodFailed"  # the Pod's phase is Failed for another reason: terminal
    POD_DELETED = "PodDeleted"  # the Pod of a running Sandbox was deleted by someone: terminal
    # What the local runtime reports of a running Sandbox whose jail died (OOMKilled above: its
    # memory cgroup's OOM killer took the jail's holder)
    INSTANCE_LOST = "InstanceLost"  # the jail's holder process exited (killed from the host...)
    # A Sandbox restored from a snapshot (spec.snapshotRef, or its template's)
    SNAPSHOT_PENDING = "SnapshotPending"  # the snapshot is still being taken: transient
    SNAPSHOT_UNAVAILABLE = "SnapshotUnavailable"  # gone, failed, or its layers refused: terminal
    # Paused
    REQUESTED = "Requested"  # frozen as requested (the local runtime's cgroup freezer)
    RESUMED = "Resumed"
    CGROUP_FROZEN = "CgroupFrozen"  # execd froze its commands' cgroup (invisible to them)
    SIGNAL_STOPPED = "SignalStopped"  # execd stopped its commands with SIGSTOP (observable)
    # Expired
    LIFETIME_EXCEEDED = "LifetimeExceeded"
    IDLE_TIMEOUT = "IdleTimeout"
    DELETED = "Deleted"  # no condition: the reason of the ``deleted`` event (deleted on request)
    # Hibernated (idlePolicy: Hibernate)
    FILES_ONLY = "FilesOnly"  # its files are in a snapshot; its processes were stopped
    WAKING = "Waking"  # on Ready: a use woke it; its instance is being restored
    HIBERNATE_UNSUPPORTED = "HibernateUnsupported"  # this runtime cannot: it keeps running
    # Isolated
    FULL_ISOLATION = "FullIsolation"
    DEGRADED = "Degraded"
    NO_ISOLATION = "NoIsolation"


TERMINAL_REASONS = frozenset(
    {
        ConditionReason.INSTANCE_FAILED,
        ConditionReason.INVALID_IMAGE,
        ConditionReason.CRASH_LOOP,
        ConditionReason.EXECD_EXITED,
        ConditionReason.OOM_KILLED,
        ConditionReason.EVICTED,
        ConditionReason.POD_FAILED,
        ConditionReason.POD_DELETED,
        ConditionReason.INSTANCE_LOST,
        ConditionReason.SNAPSHOT_UNAVAILABLE,
    }
)


def _fail(field: str, why: str) -> ResourceInvalid:
    return ResourceInvalid(f"{field}: {why}", field=field)


def _time(field: str, value: Any) -> str:
    if not isinstance(value, str):
        raise _fail(field, "must be an RFC 3339 date-time string")
    try:
        from_rfc3339(value)
    except ValueError as exc:
        raise _fail(field, f"{value!r} is not an RFC 3339 date-time") from exc
    return value


def _bytes(quantity: str) -> int:
    """Bytes of a quantity ``_QUANTITY`` matched (``10Gi``, ``512M``)."""
    digits = quantity.rstrip("KMGTi")
    return int(digits) * _UNITS[quantity[len(digits) :]]


def _int(field: str, value: Any, minimum: int) -> int:
    if type(value) is not int or value < minimum:
        raise _fail(field, f"must be an integer >= {minimum}")
    return value


def check_name(field: str, value: Any) -> str:
    """``value`` if it is a DNS label (an object name), else ResourceInvalid naming ``field``."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise _fail(field, "must be a DNS label")
    return value


# Public names of the validators, for the other resource models of the contract.
field_error = _fail
check_int = _int
check_time = _time


def _enum(field: str, cls: type[enum.StrEnum], value: Any) -> Any:
    try:
        return cls(value)
    except ValueError as exc:
        raise _fail(field, f"must be one of {[m.value for m in cls]}") from exc


@dataclasses.dataclass(frozen=True, slots=True)
class EnvVar:
    name: str
    value: str = ""

    @classmethod
    def parse(cls, field: str, raw: Any) -> tuple[EnvVar, ...]:
        if raw is None:
            return ()
        if not isinstance(raw, list):
            raise _fail(field, "must be a list of {name, value}")
        out = []
        for i, item in enumerate(raw):
            if not isinstance(item, Mapping) or not _ENV_NAME.fullmatch(str(item.get("name", ""))):
                raise _fail(f"{field}[{i}].name", "must be an environment variable name")
            out.append(cls(str(item["name"]), str(item.get("value", ""))))
        return tuple(out)


@dataclasses.dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str = ""
    message: str = ""
    last_transition_time: str = ""
    observed_generation: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
            "lastTransitionTime": self.last_transition_time,
            "observedGeneration": self.observed_generation,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Condition:
        return cls(
            type=str(raw["type"]),
            status=str(raw["status"]),
            reason=str(raw.get("reason", "")),
            message=str(raw.get("message", "")),
            last_transition_time=str(raw.get("lastTransitionTime", "")),
            observed_generation=int(raw.get("observedGeneration", 0)),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class SandboxSpec:
    template_ref: str | None = None  # wire: templateRef.name
    shutdown_time: str | None = None
    permanent: bool = False
    idle_timeout_seconds: int | None = None
    operating_mode: OperatingMode = OperatingMode.RUNNING
    env: tuple[EnvVar, ...] = ()
    network: NetworkPolicy | None = None  # None: the template's (sandpod_contract.network)
    snapshot_ref: str | None = None  # wire: snapshotRef.name, a SandboxSnapshot to start from
    idle_policy: IdlePolicy | None = None  # None: the template's
    volumes: tuple[VolumeMount, ...] = ()  # SandboxVolumes to mount (sandpod_contract.volumes)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> SandboxSpec:
        """Validate and convert ``spec``. Raises ResourceInvalid naming the field."""
        ref = raw.get("templateRef")
        name = None
        if ref is not None:
            if not isinstance(ref, Mapping) or not _NAME.fullmatch(str(ref.get("name", ""))):
                raise _fail("spec.templateRef.name", "must be a DNS label")
            name = str(ref["name"])
        permanent = raw.get("permanent", False)
        if type(permanent) is not bool:
            raise _fail("spec.permanent", "must be a boolean")
        shutdown = raw.get("shutdownTime")
        if shutdown is not None:
            shutdown = _time("spec.shutdownTime", shutdown)
            if permanent:
                raise _fail("spec", "a permanent sandbox cannot have a shutdownTime")
        idle = raw.get("idleTimeoutSeconds")
        return cls(
            template_ref=name,
            shutdown_time=shutdown,
            permanent=permanent,
            idle_timeout_seconds=None if idle is None else _int("spec.idleTimeoutSeconds", idle, 0),
            operating_mode=_enum(
                "spec.operatingMode", OperatingMode, raw.get("operatingMode", "Running")
            ),
            env=EnvVar.parse("spec.env", raw.get("env")),
            network=None if raw.get("network") is None else NetworkPolicy.from_dict(raw["network"]),
            snapshot_ref=_ref("spec.snapshotRef", raw.get("snapshotRef")),
            idle_policy=(
                None
                if raw.get("idlePolicy") is None
                else _enum("spec.idlePolicy", IdlePolicy, raw["idlePolicy"])
            ),
            volumes=VolumeMount.parse("spec.volumes", raw.get("volumes")),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "permanent": self.permanent,
            "operatingMode": str(self.operating_mode),
        }
        if self.template_ref:
            out["templateRef"] = {"name": self.template_ref}
        if self.shutdown_time:
            out["shutdownTime"] = self.shutdown_time
        if self.idle_timeout_seconds is not None:
            out["idleTimeoutSeconds"] = self.idle_timeout_seconds
        if self.env:
            out["env"] = [{"name": e.name, "value": e.value} for e in self.env]
        if self.network is not None:
            out["network"] = self.network.to_dict()
        if self.snapshot_ref:
            out["snapshotRef"] = {"name": self.snapshot_ref}
        if self.idle_policy is not None:
            out["idlePolicy"] = str(self.idle_policy)
        if self.volumes:
            out["volumes"] = [v.to_dict() for v in self.volumes]
        return out


def _ref(field: str, raw: Any) -> str | None:
    """The name of an object reference ``{name: <DNS label>}`` (None when absent)."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or not _NAME.fullmatch(str(raw.get("name", ""))):
        raise _fail(f"{field}.name", "must be a DNS label")
    return str(raw["name"])


@dataclasses.dataclass(frozen=True, slots=True)
class NetworkStatus:
    """``status.network``: the egress policy the runtime last applied to the instance.

    ``source``: ``sandbox`` (its own ``spec.network``) or ``template`` (its template's);
    ``enforced``: the runtime enforces all of it, else ``reason`` says what it does not and why
    (the process runtime enforces nothing; a NetworkPolicy cannot express DNS names);
    ``observed_generation``: the Sandbox generation it was applied for.
    """

    policy: NetworkPolicy
    source: str = "template"
    enforced: bool = False
    reason: str = ""
    observed_generation: int = 0

    @classmethod
    def from_dict(cls, raw: Any) -> NetworkStatus | None:
        if not isinstance(raw, Mapping):
            return None
        return cls(
            policy=NetworkPolicy.from_dict(raw.get("policy"), "status.network.policy"),
            source=str(raw.get("source", "template")),
            enforced=bool(raw.get("enforced", False)),
            reason=str(raw.get("reason", "")),
            observed_generation=int(raw.get("observedGeneration", 0)),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy.to_dict(),
            "source": self.source,
            "enforced": self.enforced,
            "reason": self.reason,
            "observedGeneration": self.observed_generation,
        }


@dataclasses.dataclass(frozen=True, slots=True)
class SandboxStatus:
    phase: Phase = Phase.PENDING
    observed_generation: int = 0
    shutdown_time: str | None = None
    last_activity_time: str | None = None
    node: str | None = None
    endpoint: Mapping[str, str] = dataclasses.field(default_factory=dict)
    conditions: tuple[Condition, ...] = ()
    network: NetworkStatus | None = None  # the egress policy applied (None: not yet)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> SandboxStatus:
        return cls(
            phase=_enum("status.phase", Phase, raw.get("phase", "Pending")),
            observed_generation=int(raw.get("observedGeneration", 0)),
            shutdown_time=raw.get("shutdownTime"),
            last_activity_time=raw.get("lastActivityTime"),
            node=raw.get("node"),
            endpoint=dict(raw.get("endpoint") or {}),
            conditions=tuple(Condition.from_dict(c) for c in raw.get("conditions") or ()),
            network=NetworkStatus.from_dict(raw.get("network")),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "phase": str(self.phase),
            "observedGeneration": self.observed_generation,
            "conditions": [c.to_dict() for c in self.conditions],
        }
        for key, value in (
            ("shutdownTime", self.shutdown_time),
            ("lastActivityTime", self.last_activity_time),
            ("node", self.node),
        ):
            if value:
                out[key] = value
        if self.endpoint:
            out["endpoint"] = dict(self.endpoint)
        if self.network is not None:
            out["network"] = self.network.to_dict()
        return out


@dataclasses.dataclass(frozen=True, slots=True)
class TemplateResources:
    cpu: str | None = None
    memory: str | None = None
    pids: int | None = None
    disk: str | None = None


SECCOMP_PROFILES = ("RuntimeDefault", "Unconfined")


@dataclasses.dataclass(frozen=True, slots=True)
class TemplateSecurity:
    """``spec.security``: the only way a template loosens the sandbox's confinement, explicitly.

    ``seccomp``: ``RuntimeDefault`` (the platform's filter, at least as strict as the common
    container default) or ``Unconfined`` (no filter). ``allow_nested_user_namespaces``
    (wire ``allowNestedUserNamespaces``): the filter also lets the sandbox create user (and
    other) namespaces and mount inside them. Either is reported in the Sandbox's ``Isolated``.
    """

    seccomp: str = "RuntimeDefault"
    allow_nested_user_namespaces: bool = False

    @classmethod
    def from_dict(cls, raw: Any) -> TemplateSecurity:
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise _fail("spec.security", "must be a map")
        seccomp = raw.get("seccomp", "RuntimeDefault")
        if seccomp not in SECCOMP_PROFILES:
            raise _fail("spec.security.seccomp", f"must be one of {', '.join(SECCOMP_PROFILES)}")
        nested = raw.get("allowNestedUserNamespaces", False)
        if not isinstance(nested, bool):
            raise _fail("spec.security.allowNestedUserNamespaces", "must be true or false")
        return cls(seccomp=seccomp, allow_nested_user_namespaces=nested)


@dataclasses.dataclass(frozen=True, slots=True)
class SandboxTemplateSpec:
    image: str | None = None
    rootfs: str | None = None
    runtime_class_name: str | None = None
    user: str = "sandbox"
    env: tuple[EnvVar, ...] = ()
    resources: TemplateResources = dataclasses.field(default_factory=TemplateResources)
    network: NetworkPolicy = dataclasses.field(default_factory=NetworkPolicy)
    default_lifetime_seconds: int = 3600
    idle_timeout_seconds: int = 900
    security: TemplateSecurity = dataclasses.field(default_factory=TemplateSecurity)
    build: TemplateBuild | None = None  # how the template is built (sandpod_contract.builds)
    snapshot_ref: str | None = None  # its sandboxes start from this SandboxSnapshot
    idle_policy: IdlePolicy = IdlePolicy.DELETE  # what its sandboxes' idleness means
    volumes: tuple[VolumeMount, ...] = ()  # mounted by each of its sandboxes (a Sandbox's win)

    @property
    def egress(self) -> tuple[str, ...]:
        """The ``allow`` rules' texts (what a Kubernetes NetworkPolicy can be made of)."""
        return tuple(r.text for r in self.network.allow)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> SandboxTemplateSpec:
        """Validate and convert a template ``spec``. Raises ResourceInvalid naming the field."""
        res = raw.get("resources") or {}
        if not isinstance(res, Mapping):
            raise _fail("spec.resources", "must be a map")
        for key, pattern in (("cpu", _CPU), ("memory", _QUANTITY), ("disk", _QUANTITY)):
            if key in res and not pattern.fullmatch(str(res[key])):
                raise _fail(f"spec.resources.{key}", f"{res[key]!r} is not a quantity")
        if "disk" in res and _bytes(str(res["disk"])) < MIN_DISK:
            raise _fail("spec.resources.disk", f"{res['disk']!r} is below the minimum of 16Mi")
        pids = res.get("pids")
        return cls(
            image=raw.get("image"),
            rootfs=raw.get("rootfs"),
            runtime_class_name=raw.get("runtimeClassName"),
            user=str(raw.get("user", "sandbox")),
            env=EnvVar.parse("spec.env", raw.get("env")),
            resources=TemplateResources(
                cpu=res.get("cpu"),
                memory=res.get("memory"),
                pids=None if pids is None else _int("spec.resources.pids", pids, 1),
                disk=res.get("disk"),
            ),
            network=NetworkPolicy.from_dict(raw.get("network")),
            default_lifetime_seconds=_int(
                "spec.defaultLifetimeSeconds", raw.get("defaultLifetimeSeconds", 3600), 1
            ),
            idle_timeout_seconds=_int(
                "spec.idleTimeoutSeconds", raw.get("idleTimeoutSeconds", 900), 0
            ),
            security=TemplateSecurity.from_dict(raw.get("security")),
            build=TemplateBuild.from_dict(raw.get("build")),
            snapshot_ref=_ref("spec.snapshotRef", raw.get("snapshotRef")),
            idle_policy=_enum("spec.idlePolicy", IdlePolicy, raw.get("idlePolicy", "Delete")),
            volumes=VolumeMount.parse("spec.volumes", raw.get("volumes")),
        )
