"""Lifecycle settings, read once from the environment at start-up.

| variable | default | meaning |
|---|---|---|
| ``SANDPOD_NATS_URL`` / ``NATS_URL`` | ``nats://127.0.0.1:4222`` | NATS server(s) |
| ``SANDPOD_NATS_CREDS`` | unset | NATS creds file (operator mode), watched for renewals |
| ``SANDPOD_EXECD_NATS_CREDS`` | the above | creds of the execds it starts (host runtimes) |
| ``SANDPOD_PREFIX`` | ``sandpod`` | subject prefix |
| ``SANDPOD_STATE_DIR`` | ``~/.local/state/sandpod`` | instances, workspaces, logs |
| ``SANDPOD_RUNTIME`` | ``process`` | ``local`` (jail, root), ``process``, ``kubernetes`` (Pods) |
| ``SANDPOD_STORE`` | ``kv`` | ``kv`` (JetStream KV) or ``kube`` (CRDs: ``SANDPOD_KUBE_*``) |
| ``SANDPOD_POD_*`` | | the ``kubernetes`` runtime's Pods (``sandpod_kube.podspec.PodSettings``) |
| ``SANDPOD_REPLICA_ID`` | hostname-pid | lease holder name of this replica |
| ``SANDPOD_LEASE_TTL`` | 10 s | KV store: a dead replica's objects move after this |
| ``SANDPOD_LEADER_*`` | 15/10/2 s | kube store: leader election (``LeaderSettings``) |
| ``SANDPOD_RESYNC`` | 5 s | full resync period (orphans, lease renewal) |
| ``SANDPOD_WORKERS`` | 8 | objects reconciled in parallel |
| ``SANDPOD_READY_TIMEOUT`` | 30 s | how long a new instance may take to answer |
| ``SANDPOD_DESTROY_ON_EXIT`` | false | destroy every instance at shutdown (``sandpod up``) |
| ``SANDPOD_UID_REGISTRY`` | ``/var/lib/sandpod/uid-ranges.json`` | uid ranges claimed host-wide |
| ``SANDPOD_NODE`` | hostname | this host's node id (local runtime: one execd serves all) |
| ``SANDPOD_NATS_ACCOUNT_SEED_FILE`` | unset | the NATS account's seed: per-sandbox creds (Pods) |
| ``SANDPOD_NATS_CREDS_TTL`` | 86400 s | longest life of a sandbox's JWT (renewed at half) |
| ``SANDPOD_NATS_CREDS_MARGIN`` | 300 s | a sandbox JWT outlives its ``shutdownTime`` by this |
| ``SANDPOD_EVENTS_MAX_BYTES`` | 256 MiB | stream ``<prefix>-events``: size (oldest dropped), |
| | | reserved in JetStream at start (no room: ``store.insufficient_storage`` says what to do) |
| ``SANDPOD_EVENTS_MAX_AGE`` | 604800 s | ... and age of its events (7 days) |
| ``SANDPOD_EVENTS_MAX_PER_SUBJECT`` | 100 | ... and events kept per sandbox and event type |
| ``SANDPOD_EVENTS_BURST`` | 20 | events one sandbox may publish at once ... |
| ``SANDPOD_EVENTS_RATE`` | 1 /s | ... refilled at this rate (past it: dropped, logged) |
| ``SANDPOD_DISK_DEFAULT`` | ``10Gi`` | local runtime: disk quota of a template naming none |
| ``SANDPOD_DISK_RESERVE`` | ``2Gi`` | local runtime: free host space a create needs |
| ``SANDPOD_DISK_PREALLOCATE`` | false | local runtime: reserve each sandbox's disk on the host |
| ``SANDPOD_VOLUME_MAX_COUNT`` | 100 | SandboxVolumes one tenant may hold (0: no limit) |
| ``SANDPOD_VOLUME_MAX_BYTES`` | ``100Gi`` | ... and the sum of their sizes (0: no limit) |
| ``SANDPOD_IMAGE_DIR`` | ``<state>/images`` | local runtime: the node's image store |
| ``SANDPOD_IMAGE_AUTH_FILE`` | Docker's | registry credentials (``config.json`` format) |
| ``SANDPOD_INSECURE_REGISTRIES`` | none | hosts (comma-separated) pulled over plain HTTP |
| ``SANDPOD_BUILD_REGISTRY`` | unset | kubernetes: ``host[:port]/prefix`` built templates are |
| | | pushed to (``<prefix>/<template>:build-<key>``); unset, a template with a build fails |
| | | at once, naming this setting. Plain HTTP only to loopback or an insecure registry |
| ``SANDPOD_BUILD_*`` | | kubernetes: the builder Pods (``sandpod_kube.buildpod``'s |
| | | ``BuildPodSettings``: ``IMAGE``, ``REGISTRY_SECRET``, ``DEADLINE``, ``WORK_SIZE``) |
| ``SANDPOD_NET`` | true | local runtime (root): give sandboxes egress under their policy |
| ``SANDPOD_NET_POOL`` | ``10.240.0.0/12`` | ... host-wide pool (a /20 each) |
| ``SANDPOD_NET_IPV6`` | auto | ... IPv6 egress under the same policy (``auto``: when the |
| | | host has IPv6; ``off``: IPv4 only, noted per sandbox; ``on``: noted when the host lacks it) |
| ``SANDPOD_NET_POOL6`` | ``fd53:616e:6470::/48`` | ... host-wide IPv6 ULA pool (a /64 each) |
| ``SANDPOD_NET_REGISTRY`` | ``/var/lib/sandpod/net-ranges.json`` | ... where slices are claimed |
| ``SANDPOD_NET_GATEWAY_UID`` | lifecycle's uid | ... only uid connecting into sandboxes |
| ``SANDPOD_NET_DNS_PORT`` | 53 | ... the node resolver's port on the gateway address |
| ``SANDPOD_NET_PROXY_PORT`` | 3129 | ... the egress proxy's port there (name rules on 80/443: |
| | | SNI/Host checked; header injections, in any mode: an ``inject`` domain's addresses |
| | | on 80/443 go there); ``off``: no proxy, name rules open by address, no injection |
| ``SANDPOD_EGRESS_*`` | | ... the proxy's limits and timeouts (``ProxySettings``) |
| ``SANDPOD_NET_ALWAYS_ALLOW`` | none | rules (comma-separated, the syntax of ``allow`` rules: |
| | | ``mirror.test:443``, ``*.example.com``, ``10.0.0.5/32:3128``) added to every sandbox's |
| | | effective policy (its platform needs: a package mirror, an internal proxy); ``deny`` |
| | | rules still beat them, a ``deny-all`` policy stays deny-all, hard denies stay closed; |
| | | any runtime. A bad entry fails start-up naming it |
| ``SANDPOD_NET_LOG_GROUP`` | derived | ... first NFLOG group tried for refused connections' |
| | | destinations (the first free one from there is used); ``off``: counted only |
| ``SANDPOD_SNAPSHOT_QUOTA_COUNT`` | 0 | snapshots a tenant may keep (0: no limit) |
| ``SANDPOD_SNAPSHOT_QUOTA_BYTES`` | 0 | bytes a tenant's snapshots may store (``10Gi``; 0: none) |
| ``SANDPOD_SNAPSHOT_S3_ENDPOINT`` | unset | snapshot layers in this S3-compatible store (with |
| | | ``_BUCKET``, ``_ACCESS_KEY_ID``...: ``sandpod_blobs.s3``); unset: JetStream's |
| ``SANDPOD_DEFAULT_ROOTFS`` | unset | local runtime: the prepared default base (a tree made by |
| | | ``sandpod_image.debian``, ``sandpod up`` builds one); a template naming no ``rootfs`` |
| | | runs on it; unset, such a template fails to create (never the host root) |
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import socket
from collections.abc import Mapping
from pathlib import Path

from sandpod_blobs import S3Settings
from sandpod_bus import BusSettings
from sandpod_contract.errors import ResourceInvalid
from sandpod_contract.network import MAX_RULES, Rule
from sandpod_contract.subjects import DEFAULT_PREFIX
from sandpod_kube import KubeSettings, LeaderSettings, store_settings
from sandpod_kube.buildpod import BuildPodSettings
from sandpod_kube.podspec import PodSettings
from sandpod_lifecycle.events import SIZE_SETTING, EventLimits
from sandpod_lifecycle.network.dnssettings import ResolverSettings
from sandpod_lifecycle.network.egress import EgressSettings
from sandpod_lifecycle.network.proxyconfig import ProxySettings
from sandpod_lifecycle.runtime.base import MIN_DISK
from sandpod_lifecycle.runtime.local_driver import parse_quantity
from sandpod_lifecycle.snapshots.api import SnapshotQuota
from sandpod_lifecycle.volumes import VolumeLimits
from sandpod_service import env_bool, env_float, env_int, env_str
from sandpod_service.env import SettingsError

__all__ = ["LifecycleSettings"]

DEFAULT_PROXY_PORT = 3129  # the egress proxy on each installation's own gateway address


@dataclasses.dataclass(frozen=True)
class LifecycleSettings:
    bus: BusSettings = dataclasses.field(default_factory=BusSettings)
    prefix: str = DEFAULT_PREFIX
    state_dir: Path = dataclasses.field(
        default_factory=lambda: Path("~/.local/state/sandpod").expanduser()
    )
    runtime: str = "process"
    kube: KubeSettings | None = None  # None: the KV store (SANDPOD_STORE=kv)
    leader: LeaderSettings = dataclasses.field(default_factory=LeaderSettings)  # kube only
    pods: PodSettings = dataclasses.field(default_factory=PodSettings)
    replica_id: str = dataclasses.field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}"
    )
    lease_ttl: float = 10.0
    resync: float = 5.0
    workers: int = 8
    ready_timeout: float = 30.0
    destroy_on_exit: bool = False  # `sandpod up`: stopping the platform stops every sandbox
    node: str = dataclasses.field(default_factory=lambda: socket.gethostname().split(".")[0])
    # Where installations on this host claim their sandbox uid ranges (None: no registry).
    uid_registry: Path | None = Path("/var/lib/sandpod/uid-ranges.json")
    grace: float = 10.0
    log_level: str = "info"
    execd_creds: str | None = None  # None: the lifecycle's own (bus.creds)
    nats_account_seed_file: Path | None = None  # kubernetes: mint per-sandbox NATS creds
    nats_creds_ttl: float = 86400.0
    nats_creds_margin: float = 300.0
    events: EventLimits = dataclasses.field(default_factory=EventLimits)
    disk_default: int = 10 << 30  # local runtime: bytes (see runtime/diskquota.py)
    disk_reserve: int = 2 << 30
    disk_preallocate: bool = False
    volumes: VolumeLimits = dataclasses.field(default_factory=VolumeLimits)  # per tenant
    default_rootfs: Path | None = None  # local runtime: the base of a template naming none
    image_dir: Path | None = None  # local runtime: the node's image store (None: <state>/images)
    image_auth_file: Path | None = None  # registry credentials (Docker config.json format)
    insecure_registries: frozenset[str] = frozenset()  # plain HTTP allowed beyond loopback
    build_registry: str | None = None  # kubernetes: where built templates are pushed
    build_pods: BuildPodSettings = dataclasses.field(default_factory=BuildPodSettings)
    network: EgressSettings = dataclasses.field(default_factory=EgressSettings)  # local runtime
    dns: ResolverSettings | None = None  # SANDPOD_DNS_* (None: read at start from the host)
    proxy: ProxySettings = dataclasses.field(default_factory=ProxySettings)  # SANDPOD_EGRESS_*
    # SANDPOD_NET_ALWAYS_ALLOW: the platform's rules at the end of every effective ``allow``
    always_allow: tuple[Rule, ...] = ()
    # SANDPOD_SNAPSHOT_S3_*: snapshot layers in an S3-compatible store (None: JetStream's)
    snapshot_s3: S3Settings | None = None
    snapshot_quota: SnapshotQuota = dataclasses.field(default_factory=SnapshotQuota)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LifecycleSettings:
        env = os.environ if env is None else env
        base = cls()
        runtime = env_str(env, "SANDPOD_RUNTIME", "process")
        if runtime not in ("process", "local", "kubernetes"):
            raise ValueError(
                f"SANDPOD_RUNTIME={runtime!r}: use 'local' (namespace jail, needs root), "
                "'process' (no isolation) or 'kubernetes' (a Pod per sandbox)"
            )
        kube = store_settings(env)
        if runtime == "kubernetes" and kube is None:
            raise ValueError(
                "SANDPOD_RUNTIME=kubernetes needs SANDPOD_STORE=kube (Pods are owned "
                "by Sandbox objects on the API server)"
            )
        return cls(
            bus=BusSettings(
                url=env_str(env, ("SANDPOD_NATS_URL", "NATS_URL"), BusSettings.url),
                creds=env_str(env, "SANDPOD_NATS_CREDS", "") or None,
                name="lifecycle",
            ),
            prefix=env_str(env, "SANDPOD_PREFIX", DEFAULT_PREFIX),
            state_dir=Path(env_str(env, "SANDPOD_STATE_DIR", str(base.state_dir))).expanduser(),
            runtime=runtime,
            kube=kube,
            pods=PodSettings.from_env(env),
            replica_id=env_str(env, "SANDPOD_REPLICA_ID", base.replica_id),
            leader=LeaderSettings.from_env(env),
            lease_ttl=env_float(env, "SANDPOD_LEASE_TTL", base.lease_ttl, minimum=0.5),
            resync=env_float(env, "SANDPOD_RESYNC", base.resync, minimum=0.1),
            workers=env_int(env, "SANDPOD_WORKERS", base.workers, minimum=1),
            ready_timeout=env_float(env, "SANDPOD_READY_TIMEOUT", base.ready_timeout, minimum=1),
            destroy_on_exit=env_bool(env, "SANDPOD_DESTROY_ON_EXIT", False),
            node=env_str(env, "SANDPOD_NODE", base.node),
            execd_creds=env_str(env, "SANDPOD_EXECD_NATS_CREDS", "") or None,
            uid_registry=Path(registry)
            if (registry := env_str(env, "SANDPOD_UID_REGISTRY", str(base.uid_registry)))
            else None,
            log_level=env_str(env, "SANDPOD_LOG_LEVEL", "info"),
            nats_account_seed_file=Path(seed)
            if (seed := env_str(env, "SANDPOD_NATS_ACCOUNT_SEED_FILE", ""))
            else None,
            nats_creds_ttl=env_float(
                env, "SANDPOD_NATS_CREDS_TTL", base.nats_creds_ttl, minimum=60
            ),
            nats_creds_margin=env_float(
                env, "SANDPOD_NATS_CREDS_MARGIN", base.nats_creds_margin, minimum=0
            ),
            events=_event_limits(env, base.events),
            disk_default=_quantity(env, "SANDPOD_DISK_DEFAULT", base.disk_default, MIN_DISK),
            disk_reserve=_quantity(env, "SANDPOD_DISK_RESERVE", base.disk_reserve, 0),
            disk_preallocate=env_bool(env, "SANDPOD_DISK_PREALLOCATE", False),
            volumes=VolumeLimits(
                max_count=env_int(env, "SANDPOD_VOLUME_MAX_COUNT", 100, minimum=0),
                max_bytes=_quantity(env, "SANDPOD_VOLUME_MAX_BYTES", 100 << 30, 0),
            ),
            default_rootfs=_absolute(env, "SANDPOD_DEFAULT_ROOTFS"),
            image_dir=_absolute(env, "SANDPOD_IMAGE_DIR"),
            image_auth_file=_absolute(env, "SANDPOD_IMAGE_AUTH_FILE"),
            insecure_registries=frozenset(
                h.strip()
                for h in env_str(env, "SANDPOD_INSECURE_REGISTRIES", "").split(",")
                if h.strip()
            ),
            build_registry=_build_registry(env),
            snapshot_quota=SnapshotQuota(
                count=env_int(env, "SANDPOD_SNAPSHOT_QUOTA_COUNT", 0, minimum=0),
                bytes=_quantity(env, "SANDPOD_SNAPSHOT_QUOTA_BYTES", 0, 0),
            ),
            snapshot_s3=(
                S3Settings.from_env(env) if env.get("SANDPOD_SNAPSHOT_S3_ENDPOINT") else None
            ),
            build_pods=BuildPodSettings.from_env(env),
            network=_egress(env),
            dns=ResolverSettings.from_env(env),
            proxy=ProxySettings.from_env(env),
            always_allow=always_allow(env),
        )


def _event_limits(env: Mapping[str, str], base: EventLimits) -> EventLimits:
    return EventLimits(
        max_bytes=env_int(env, SIZE_SETTING, base.max_bytes, minimum=1 << 20),
        max_age=env_float(env, "SANDPOD_EVENTS_MAX_AGE", base.max_age, minimum=60),
        max_msgs_per_subject=env_int(
            env, "SANDPOD_EVENTS_MAX_PER_SUBJECT", base.max_msgs_per_subject, minimum=1
        ),
        burst=env_int(env, "SANDPOD_EVENTS_BURST", base.burst, minimum=1),
        rate=env_float(env, "SANDPOD_EVENTS_RATE", base.rate, minimum=0.001),
    )


def _build_registry(env: Mapping[str, str]) -> str | None:
    """``SANDPOD_BUILD_REGISTRY`` checked (None: unset); ValueError naming it if unusable."""
    raw = env.get("SANDPOD_BUILD_REGISTRY", "").strip()
    if not raw:
        return None
    from sandpod_lifecycle.builds.kube import validate_registry  # only when set: kubernetes

    return validate_registry(raw)


def _egress(env: Mapping[str, str]) -> EgressSettings:
    """``SANDPOD_NET_*``; ValueError naming the variable at fault."""
    base = EgressSettings()
    raw_pool = env_str(env, "SANDPOD_NET_POOL", str(base.pool))
    try:
        pool = ipaddress.IPv4Network(raw_pool)
    except ValueError:
        raise ValueError(
            f"SANDPOD_NET_POOL={raw_pool!r}: use an IPv4 network (10.240.0.0/12)"
        ) from None
    if not pool.is_private:
        raise ValueError(f"SANDPOD_NET_POOL={raw_pool!r}: use a private range")
    registry = env_str(env, "SANDPOD_NET_REGISTRY", str(base.registry))
    uid = env_str(env, "SANDPOD_NET_GATEWAY_UID", "")
    proxy = env_str(env, "SANDPOD_NET_PROXY_PORT", str(DEFAULT_PROXY_PORT))
    if (uid and not uid.isdigit()) or not (proxy.isdigit() or proxy == "off"):
        raise ValueError(
            "SANDPOD_NET_GATEWAY_UID is an integer; SANDPOD_NET_PROXY_PORT an integer or off"
        )
    group = env_str(env, "SANDPOD_NET_LOG_GROUP", "")
    if group not in ("", "off") and not (group.isdigit() and int(group) <= 0xFFFF):
        raise ValueError(f"SANDPOD_NET_LOG_GROUP={group!r}: an NFLOG group (0..65535) or off")
    raw6 = env_str(env, "SANDPOD_NET_IPV6", "auto").lower()
    if raw6 not in ("auto", "on", "off", "true", "false", "1", "0"):
        raise ValueError(f"SANDPOD_NET_IPV6={raw6!r}: auto, on or off")
    raw_pool6 = env_str(env, "SANDPOD_NET_POOL6", str(base.pool6))
    try:
        pool6 = ipaddress.IPv6Network(raw_pool6)
    except ValueError:
        raise ValueError(
            f"SANDPOD_NET_POOL6={raw_pool6!r}: use an IPv6 network (fd53:616e:6470::/48)"
        ) from None
    if not pool6.is_private or pool6.prefixlen > 64:
        raise ValueError(f"SANDPOD_NET_POOL6={raw_pool6!r}: use a private range of /64 or more")
    return EgressSettings(
        enabled=env_bool(env, "SANDPOD_NET", True),
        ipv6=None if raw6 == "auto" else raw6 in ("on", "true", "1"),
        pool6=pool6,
        pool=pool,
        registry=Path(registry) if registry else None,
        gateway_uid=int(uid) if uid else None,
        dns_port=env_int(env, "SANDPOD_NET_DNS_PORT", base.dns_port, minimum=1),
        proxy_port=int(proxy) if proxy.isdigit() else None,
        log_denials=group != "off",
        log_group=int(group) if group.isdigit() else None,
    )


ALWAYS_ALLOW = "SANDPOD_NET_ALWAYS_ALLOW"


def always_allow(env: Mapping[str, str]) -> tuple[Rule, ...]:
    """``SANDPOD_NET_ALWAYS_ALLOW``: comma-separated ``allow`` rules (empty entries skipped).

    Raises:
        SettingsError: an entry is not a rule (the message names it and why), or there are
            more than ``MAX_RULES``.
    """
    entries = [e.strip() for e in env.get(ALWAYS_ALLOW, "").split(",") if e.strip()]
    if len(entries) > MAX_RULES:
        raise SettingsError(f"{ALWAYS_ALLOW}: at most {MAX_RULES} rules, not {len(entries)}")
    rules = []
    for index, entry in enumerate(entries):
        try:
            rules.append(Rule.parse(f"{ALWAYS_ALLOW}[{index}]", entry))
        except ResourceInvalid as exc:
            raise SettingsError(
                f"{ALWAYS_ALLOW}: entry {entry!r} is not an allow rule ({exc.message}); "
                "use names (mirror.test, *.example.com) or addresses (10.0.0.5, 10.0.0.0/8), "
                "each optionally with :port or :low-high"
            ) from exc
    return tuple(rules)


def _absolute(env: Mapping[str, str], name: str) -> Path | None:
    """An absolute path variable (None: unset); ValueError naming it if relative."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    path = Path(raw).expanduser()
    if not path.is_absolute():
        raise ValueError(f"{name}={raw!r}: use an absolute path")
    return path


def _quantity(env: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    """Bytes of a quantity variable (``10Gi``, ``512M``); ValueError naming it if unusable."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = parse_quantity(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: use a quantity such as 10Gi or 512Mi") from None
    if value < minimum:
        raise ValueError(f"{name}={raw!r}: must be at least {minimum} bytes")
    return value
