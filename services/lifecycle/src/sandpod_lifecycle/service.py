"""Lifecycle wiring: store, leases, events, driver, reconciler and the control-plane API.

The store is the JetStream KV bucket (``SANDPOD_STORE=kv``) or the CRDs on an API server
(``kube``, through ``sandpod_kube``, imported only then). Who reconciles what follows the store:
per-object leases in a NATS KV bucket (kv), or one leader elected on the Lease
``<prefix>-lifecycle`` (kube: ``sandpod_kube.leader``); a replica that becomes leader resyncs at
once, one that loses it stops acting. The ``kubernetes`` runtime needs the ``kube`` store: its
Pods are owned by the Sandbox objects.

The API subscriptions (``<prefix>.api.sandboxes.*``, ``.templates.*`` and ``.volumes.*``,
queue group ``sandpod-lifecycle``) routes by ``(kind, verb)`` through the contract's
control-plane catalogue; the reconciler runs as one task owned by the service's supervisor.
Stopping leaves instances running (a restarted replica adopts them through the driver) and
releases this replica's leases so others take over at once.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
from prometheus_client import CollectorRegistry

from sandpod_bus import Bus, NoResponders
from sandpod_contract.codec import Message, decode_reply, encode
from sandpod_contract.errors import InternalError, SandboxUnavailable, SandpodError
from sandpod_contract.messages.common import Empty
from sandpod_contract.messages.node import NodeSandboxes
from sandpod_contract.messages.sandboxes import CONTROL_PLANE
from sandpod_contract.messages.system import (
    Activity,
    Configure,
    Configured,
    Freeze,
    FreezeState,
    Pong,
)
from sandpod_contract.subjects import Subjects
from sandpod_image.auth import AuthFile, default_auth_path, load_auth_file
from sandpod_image.layers import UnpackOptions
from sandpod_image.store import ImageStore
from sandpod_kube import open_store
from sandpod_lifecycle.api import LifecycleApi
from sandpod_lifecycle.builds.cache import BuildCache
from sandpod_lifecycle.builds.executor import Builder
from sandpod_lifecycle.builds.loop import TemplateBuilder, TemplateBuilds
from sandpod_lifecycle.driver import Driver, ExecdLauncher
from sandpod_lifecycle.events import Events
from sandpod_lifecycle.hibernation import Hibernator
from sandpod_lifecycle.network.addressing import PoolExhausted
from sandpod_lifecycle.network.egress import Egress
from sandpod_lifecycle.network.link import LinkError
from sandpod_lifecycle.network.metrics import NetworkMetrics
from sandpod_lifecycle.network.nft import NftError
from sandpod_lifecycle.network.node import NodeNetwork, ProxyWiring, start_node_network
from sandpod_lifecycle.node import NodeLauncher
from sandpod_lifecycle.reconciler import Reconciler
from sandpod_lifecycle.runtime.diskquota import DiskOptions
from sandpod_lifecycle.runtime.installation import Installation, remove_cgroup_parents
from sandpod_lifecycle.runtime.local import JAIL_FILE, LocalRuntime, LocalRuntimeConfig
from sandpod_lifecycle.runtime.local_driver import LocalDriver
from sandpod_lifecycle.runtime.process import ProcessDriver
from sandpod_lifecycle.runtime.volumes import LocalVolumeBackend
from sandpod_lifecycle.settings import LifecycleSettings
from sandpod_lifecycle.snapshots.wiring import Snapshots, start_snapshots
from sandpod_lifecycle.steps import Templates
from sandpod_lifecycle.volumes import VolumeBackend, Volumes
from sandpod_service import Supervisor
from sandpod_service.api import ApiServer, Handler
from sandpod_service.clock import REAL, Clock
from sandpod_service.leases import LeaseKeeper, Leases
from sandpod_store import Store

if TYPE_CHECKING:
    from sandpod_kube import PodApi
    from sandpod_lifecycle.runtime.podcreds import CredsPolicy

__all__ = ["LifecycleService"]

log = structlog.get_logger("sandpod.lifecycle")

QUEUE_GROUP = "sandpod-lifecycle"
FREEZE_TIMEOUT = 5.0  # seconds execd may take to stop every process of a sandbox
DENIAL_POLL = 5.0  # seconds between reads of the sandboxes' refused-packet counters


class LifecycleService:
    name = "lifecycle"

    def __init__(self, settings: LifecycleSettings, *, clock: Clock = REAL) -> None:
        self.settings = settings
        self.clock = clock  # every time rule below reads this one (tests pass a fake)
        self.subjects = Subjects(settings.prefix)
        self.supervisor = Supervisor("lifecycle", 256)
        self.reconciler: Reconciler | None = None
        self._api: ApiServer | None = None
        self._leases: LeaseKeeper | None = None
        self._elect: Callable[[], Coroutine[Any, Any, None]] | None = (
            None  # kube: the election loop
        )
        self._bus: Bus | None = None
        self._node: NodeLauncher | None = None
        self._local: tuple[LocalRuntime, str] | None = None  # local runtime, its cgroup parent
        self.builder: Builder | None = None  # template builds (the local runtime)
        self.snapshots: Snapshots | None = None  # the snapshot controller and API
        self._pod_api: PodApi | None = None  # kubernetes: the driver's (builder Pods too)
        self._creds_policy: CredsPolicy | None = None  # kubernetes, operator mode
        self._template_builds: TemplateBuilds | None = None
        self._egress: Egress | None = None  # the local runtime's sandbox network (root)
        self.node_network: NodeNetwork | None = None  # egress + resolver + refusal reports
        self.network_metrics: NetworkMetrics | None = None
        self._leading = True  # kube: what the election last said (one replica: always)
        self.metrics = CollectorRegistry()  # the lifecycle's own (not served yet)
        self._closers: list[Callable[[], Awaitable[None]]] = []  # kube clients, last first

    async def _store(self, bus: Bus, bucket: str) -> Store:
        store, close = await open_store(bus, bucket, self.settings.kube)
        if close is not None:
            self._closers.append(close)
        return store

    async def _lease_keeper(self, bus: Bus) -> LeaseKeeper:
        """KV leases per object (kv store), or leader election on a Lease (kube store)."""
        kube = self.settings.kube
        if kube is None:
            return await Leases.open(
                bus,
                self.settings.replica_id,
                self.settings.lease_ttl,
                bucket=self.subjects.storage("leases"),
                clock=self.clock,
            )
        from sandpod_kube import elect

        leases, self._elect, close = elect(
            kube,
            self.settings.leader,
            prefix=self.settings.prefix,
            service="lifecycle",
            identity=self.settings.replica_id,
            on_change=self._leadership,
        )
        self._closers.append(close)
        return leases

    def _leadership(self, leading: bool) -> None:
        """Won: queue everything now (the old leader's work, timers it had). Lost: acquire()
        already refuses every object, so the workers stop acting."""
        self._leading = leading
        log.info("leadership_changed", leading=leading, replica=self.settings.replica_id)
        if leading and self.reconciler is not None:
            self.reconciler.resync_soon()
        if leading and self._template_builds is not None:
            self._template_builds.resync_soon()

    def _driver(self, templates: Templates) -> Driver:
        """The runtime's driver; ``templates`` reads a template's spec (the Pod runtime
        re-renders a template's NetworkPolicy from it)."""
        state = self.settings.state_dir
        if self.settings.runtime == "kubernetes":
            from sandpod_kube import PodApi
            from sandpod_lifecycle.runtime.pod import PodDriver
            from sandpod_lifecycle.runtime.podcreds import CredsPolicy

            if self.settings.kube is None:  # settings refuse kubernetes without kube
                raise ValueError("SANDPOD_RUNTIME=kubernetes needs SANDPOD_STORE=kube")
            pods = PodApi(self.settings.kube)
            self._pod_api = pods
            self._closers.append(pods.close)
            creds = None
            if seed := self.settings.nats_account_seed_file:  # unreadable or not a seed: fail
                creds = CredsPolicy.from_seed_file(
                    seed,
                    Subjects(self.settings.prefix),
                    self.settings.nats_creds_ttl,
                    self.settings.nats_creds_margin,
                )
            self._creds_policy = creds
            return PodDriver(
                pods,
                self.settings.pods,
                installation=self.settings.prefix,
                ready_timeout=self.settings.ready_timeout,
                namespace=self.settings.kube.namespace,
                freezer=self._freezer,
                creds=creds,
                templates=templates,
            )
        launcher = ExecdLauncher(
            state,
            self.settings.bus.url,
            self.settings.prefix,
            self.settings.execd_creds or self.settings.bus.creds,
        )
        if self.settings.runtime == "local":
            # Host-global names (cgroup parent, uid range) are this installation's own.
            registry = self.settings.uid_registry if os.geteuid() == 0 else None
            inst = Installation.claim(self.settings.prefix, state, registry)
            log.info(
                "installation",
                id=inst.id,
                cgroup_parent=inst.cgroup_parent,
                uid_base=inst.uid_base,
                uid_count=inst.uid_count,
            )
            # The whole state dir (NATS data, logs, other sandboxes) is masked in every jail.
            config = LocalRuntimeConfig(
                state_dir=state / "jails",
                cgroup_parent=inst.cgroup_parent,
                uid_base=inst.uid_base,
                uid_count=inst.uid_count,
                mask_paths=(Path("/root"), Path("/home"), state),
                default_disk_bytes=self.settings.disk_default,
                disk=DiskOptions(
                    preallocate=self.settings.disk_preallocate,
                    reserve_bytes=self.settings.disk_reserve,
                ),
            )
            # The node's execd finds each jail file itself, by id, in this directory: a serve
            # request names no path, so nobody on the bus can choose what execd runs.
            jails = str(config.state_dir / "{sandbox_id}" / JAIL_FILE)
            node = NodeLauncher(launcher, self.settings.node, self._node_request, jails=jails)
            self._node = node
            egress = None
            if os.geteuid() == 0 and self.settings.network.enabled:
                egress = Egress(self.settings.network, inst.id, state, state / "net")
            self._egress = egress  # started in start(): a node that cannot is loopback only
            runtime = LocalRuntime(config, egress=egress)
            self._local = (runtime, inst.cgroup_parent)
            images = self._images(state)
            # Build layers live in the node's image area, beside the image store's.
            builds = BuildCache(images.root / "build")
            driver = LocalDriver(
                runtime,
                node,
                self.settings.default_rootfs,
                images,
                builds,
                always_allowed=self.settings.always_allow,
            )
            self._closers.append(driver.close)
            return driver
        return ProcessDriver(launcher)

    def _volume_backend(self) -> VolumeBackend | None:
        """Where SandboxVolumes' storage is made: the local runtime's filesystems, Kubernetes'
        PVCs (None on the process runtime, which has no volumes; see ``runtime/volumes.py``)."""
        if self._local is not None:
            return LocalVolumeBackend(self._local[0].volumes)
        if self._pod_api is not None:
            from sandpod_lifecycle.runtime.podvolumes import PvcVolumeBackend

            return PvcVolumeBackend(self._pod_api, self.settings.pods)
        return None

    def _auth_file(self) -> AuthFile | None:
        """The registry credentials of the settings, or Docker's default file (None: none).

        Raises:
            ValueError: the file cannot be read (a start-up error).
        """
        path = self.settings.image_auth_file or default_auth_path()
        try:
            return load_auth_file(path) if path is not None else None
        except SandpodError as exc:
            raise ValueError(f"registry credentials {path}: {exc}") from exc

    def _images(self, state: Path) -> ImageStore:
        """The node's image store (shared with ``sandpod image``), with the registry
        credentials of the settings or the Docker default file.

        Raises:
            ValueError: the credentials file cannot be read (a start-up error).
        """
        auth = self._auth_file()
        return ImageStore(
            self.settings.image_dir or state / "images",
            auth_file=auth,
            insecure=self.settings.insecure_registries,
            unpack=UnpackOptions(rootless=os.geteuid() != 0),
        )

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        # Buckets and streams are named after the prefix: installations sharing a NATS stay apart.
        store = await self._store(bus, self.subjects.storage("resources"))
        events = Events(
            bus, self.subjects, stream=self.subjects.storage("events"), limits=self.settings.events
        )
        await events.setup()
        self._leases = await self._lease_keeper(bus)
        api = LifecycleApi(
            store, events, clock=self.clock, always_allowed=self.settings.always_allow
        )
        driver = self._driver(api.template)
        backend = self._volume_backend()
        api.volumes = volumes = Volumes(store, backend, events, self.settings.volumes)
        await self._start_egress(events, driver)
        self._start_guard_reports(events)
        builds = self._builds(bus, store, driver)
        self._template_builds = builds
        snapshots = await start_snapshots(
            bus=bus,
            store=store,
            events=events,
            driver=driver,
            templates=api.template,
            wait=api.wait,
            subjects=self.subjects,
            state_dir=self.settings.state_dir,
            clock=self.clock,
            s3=self.settings.snapshot_s3,
            quota=self.settings.snapshot_quota,
        )
        self.snapshots = snapshots
        from sandpod_lifecycle.runtime.pod import PodDriver

        hibernator = (
            Hibernator(store, driver, snapshots.controller)
            if isinstance(driver, (LocalDriver, PodDriver))
            and snapshots.controller.snapshots is not None
            else None
        )
        self.supervisor.spawn(snapshots.controller.run(), name="snapshots")
        self.reconciler = Reconciler(
            store=store,
            driver=driver,
            leases=self._leases,
            events=events,
            templates=api.template,
            ready_probe=self._ready,
            idle_probe=self._idle,
            configure=self._configure,
            subjects=self.subjects,
            workers=self.settings.workers,
            resync=self.settings.resync,
            ready_timeout=self.settings.ready_timeout,
            clock=self.clock,
            keep=self.builder.live if self.builder is not None else None,
            always_allowed=self.settings.always_allow,
            hibernator=hibernator,
        )
        routes: dict[tuple[str, str], Handler] = {
            ("sandboxes", "create"): api.create,
            ("sandboxes", "get"): api.get,
            ("sandboxes", "list"): api.list,
            ("sandboxes", "delete"): api.delete,
            ("sandboxes", "renew"): api.renew,
            ("sandboxes", "pause"): api.pause,
            ("sandboxes", "resume"): api.resume,
            ("sandboxes", "wake"): api.wake,
            ("sandboxes", "network"): api.network,
            ("sandboxes", "set_network"): api.set_network,
            ("sandboxes", "expose"): api.expose,
            ("templates", "apply"): api.template_apply,
            ("templates", "get"): api.template_get,
            ("templates", "list"): api.template_list,
            ("templates", "delete"): api.template_delete,
            ("volumes", "create"): volumes.create,
            ("volumes", "get"): volumes.get,
            ("volumes", "list"): volumes.list,
            ("volumes", "delete"): volumes.delete,
        }
        routes.update(snapshots.routes())
        self.supervisor.spawn(self.reconciler.run(), name="reconciler")
        if builds is not None:
            self.supervisor.spawn(builds.run(), name="template-builds")
        if self._elect is not None:
            self.supervisor.spawn(self._elect(), name="leader-election")
        # Only the kinds served here: the pool service answers pools and claims.
        self._api = ApiServer(
            bus,
            self.subjects,
            queue=QUEUE_GROUP,
            operations=CONTROL_PLANE,
            routes=routes,
            supervisor=self.supervisor,
        )
        await self._api.start()
        log.info("lifecycle_ready", replica=self.settings.replica_id, runtime=self.settings.runtime)

    async def _start_egress(self, events: Events, driver: Driver) -> None:
        """Set up the node's sandbox network; a node that cannot runs its sandboxes with
        loopback only (each says so in its notes), never with an unfiltered network. Refused
        lookups and connections become ``network.denied`` events and a metric (see
        ``network/node.py``)."""
        egress = self._egress
        if egress is None or self._local is None:
            return

        async def publish(sandbox_id: str, kind: str, dest: str, rule: str, count: int) -> None:
            namespace = driver.namespace_of(sandbox_id) if isinstance(driver, LocalDriver) else ""
            await events.publish_denied(
                name=sandbox_id,
                kind=kind,
                destination=dest,
                rule=rule,
                count=count,
                namespace=namespace or "",
            )

        def spawn(coro: Coroutine[Any, Any, None], name: str) -> None:
            self.supervisor.spawn(coro, name=name)

        self.network_metrics = NetworkMetrics(self.metrics)
        try:
            self.node_network = await start_node_network(
                egress,
                self.settings.dns,
                self.network_metrics,
                publish=publish,
                spawn=spawn,
                poll=DENIAL_POLL,
                proxy=ProxyWiring(
                    self.settings.proxy,
                    self.settings.state_dir,
                    egress.installation_id,
                    self.metrics,
                ),
            )
            if self.node_network.ca is not None:  # a proxy runs: injections are served
                self._local[0].trust = self.node_network.trust
        except (NftError, LinkError, PoolExhausted, OSError, ValueError) as exc:
            log.error("egress_unavailable", error=str(exc))
            self._local[0].egress = None
            self._egress = None

    def _start_guard_reports(self, events: Events) -> None:
        """Kubernetes with the network guard: its refusals become events (``guardreports``)."""
        kube = self.settings.kube
        if self.settings.runtime != "kubernetes" or kube is None or not self.settings.pods.netguard:
            return
        from sandpod_lifecycle.runtime.guardreports import follow_guard_reports

        self.network_metrics = metrics = self.network_metrics or NetworkMetrics(self.metrics)
        self.supervisor.spawn(
            follow_guard_reports(
                kube, kube.namespace, events, metrics.denied, leading=lambda: self._leading
            ),
            name="guard-reports",
        )

    @property
    def egress(self) -> Egress | None:
        """The local runtime's sandbox network once started (None: none on this node)."""
        return self._egress

    def _builds(self, bus: Bus, store: Store, driver: Driver) -> TemplateBuilds | None:
        """The template builder: builder sandboxes on this node (the local runtime), or
        builder Pods pushing to ``SANDPOD_BUILD_REGISTRY`` (kubernetes: ``builds.kube``)."""
        if self._leases is None:
            return None
        if self._pod_api is not None:
            return TemplateBuilds(
                store=store,
                builder=self._pod_builds(),
                leases=self._leases,
                bus=bus,
                subjects=self.subjects,
                clock=self.clock,
            )
        if not isinstance(driver, LocalDriver) or driver.builds is None:
            return None
        bucket = self.subjects.storage("build-contexts")
        self.builder = Builder(
            cache=driver.builds,
            driver=driver,
            bus=bus,
            subjects=self.subjects,
            contexts=lambda: bus.objects(bucket),
            ready=self._ready,
            # the prepared default base (SANDPOD_DEFAULT_ROOTFS, branch rootfs-default)
            default_rootfs=self.settings.default_rootfs,
            ready_timeout=self.settings.ready_timeout,
            images=driver.images,
        )
        return TemplateBuilds(
            store=store,
            builder=self.builder,
            leases=self._leases,
            bus=bus,
            subjects=self.subjects,
            clock=self.clock,
        )

    def _pod_builds(self) -> TemplateBuilder:
        """Kubernetes mode's builder (imported only then: it needs ``sandpod_kube.pods``)."""
        from sandpod_lifecycle.builds.kube import PodBuilds

        if self._pod_api is None:
            raise InternalError("the Pod runtime is not set up: no builder Pods")
        return PodBuilds(
            pods=self._pod_api,
            settings=self.settings.build_pods,
            registry=self.settings.build_registry,
            installation=self.settings.prefix,
            default_image=self.settings.pods.default_image,
            nats_secret=self.settings.pods.nats_secret,
            start_deadline=self.settings.pods.start_deadline,
            creds=self._creds_policy,
            auth=self._auth_file(),
            insecure=self.settings.insecure_registries,
        )

    def _started(self) -> Bus:
        """The bus, for a probe or node request; they run only once ``start`` set it."""
        if self._bus is None:
            raise InternalError("the lifecycle service is not started: no bus to use yet")
        return self._bus

    async def _node_request(self, verb: str, msg: Message) -> NodeSandboxes:
        bus = self._started()
        subject = self.subjects.node(self.settings.node, "execd", verb)
        try:
            return decode_reply(NodeSandboxes, await bus.request(subject, encode(msg), 10.0))
        except NoResponders as exc:  # the transport's word; what it means here:
            raise SandboxUnavailable(
                f"the node execd of {self.settings.node!r} is not answering", subject=subject
            ) from exc

    async def stop(self, grace: float) -> None:
        if self._api is not None:
            await self._api.stop()
        await self.supervisor.close(0.1)  # the reconciler loops forever: cancel it
        if self.settings.destroy_on_exit and self.reconciler is not None:
            driver = self.reconciler.driver
            sandbox_ids = await driver.list()
            if self._node is not None:
                # The node's execd goes first, by signal: releasing each sandbox from it is a
                # NATS request, and on Ctrl-C nats-server may already be gone (the request would
                # wait out its timeout, and `sandpod up` kill us with the jails still up).
                await self._node.shutdown()
            for sandbox_id in sandbox_ids:
                log.info("instance_destroyed_at_exit", sandbox=sandbox_id)
                await driver.destroy(sandbox_id)
            if self._local is not None:  # and the installation's own cgroup parents
                runtime, parent = self._local
                kept = remove_cgroup_parents(await runtime.capabilities(), parent)
                if kept:
                    log.warning("cgroup_parents_kept", paths=kept)
        if self.node_network is not None:
            await self.node_network.close()
        if self._egress is not None:  # its table and gateway link, once no sandbox needs them
            await self._egress.stop_if_unused()
        if self._leases is not None:
            await self._leases.release_all()
        for close in reversed(self._closers):
            await close()
        self._closers.clear()

    # -- probes of a sandbox's execd -----------------------------------------------------------

    async def _ready(self, sandbox_id: str, timeout: float) -> bool:
        bus = self._started()
        subject = self.subjects.sandbox(sandbox_id, "sys", "ping")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                decode_reply(Pong, await bus.request(subject, encode(Empty()), 1.0))
                return True
            except SandpodError:
                await asyncio.sleep(0.02)
        return False

    async def _idle(self, sandbox_id: str) -> float | None:
        bus = self._started()
        subject = self.subjects.sandbox(sandbox_id, "sys", "activity")
        try:
            reply = decode_reply(Activity, await bus.request(subject, encode(Empty()), 2.0))
        except SandpodError:
            return None
        return max(reply.idle, 0.0)

    async def _freezer(self, sandbox_id: str, verb: str) -> FreezeState:
        """``sys.freeze`` / ``sys.thaw`` / ``sys.freezer`` to the sandbox's execd (the Pod
        runtime's pause). Raises SandpodError when execd refuses or does not answer."""
        bus = self._started()
        subject = self.subjects.sandbox(sandbox_id, "sys", verb)
        request: Message = Freeze(timeout=FREEZE_TIMEOUT) if verb == "freeze" else Empty()
        wait = FREEZE_TIMEOUT + 2.0 if verb == "freeze" else 2.0  # inspect asks every pass
        try:
            reply = await bus.request(subject, encode(request), wait)
        except NoResponders as exc:
            raise SandboxUnavailable(
                f"the execd of sandbox {sandbox_id!r} is not answering", sandbox_id=sandbox_id
            ) from exc
        return decode_reply(FreezeState, reply)

    async def _configure(self, sandbox_id: str, env: dict[str, str], generation: int) -> bool:
        bus = self._started()
        subject = self.subjects.sandbox(sandbox_id, "sys", "configure")
        request = Configure(env=env, generation=generation)
        try:
            decode_reply(Configured, await bus.request(subject, encode(request), 2.0))
        except SandpodError as exc:
            log.warning("configure_failed", sandbox=sandbox_id, error=exc.message)
            return False
        return True
