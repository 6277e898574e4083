"""Leader election on one ``coordination.k8s.io/v1`` Lease per service, as client-go does it.

In Kubernetes mode the lifecycle (and pool) replicas elect one leader, which alone reconciles;
the others stand by and take over when it dies. The Lease ``<prefix>-<service>`` in the services'
namespace holds the record: ``holderIdentity``, ``leaseDurationSeconds``, ``acquireTime``,
``renewTime``, ``leaseTransitions``.

Every ``retry_period`` each replica reads the Lease (:meth:`LeaderElector.step`):

    absent                                -> create it naming us (AlreadyExists: someone won)
    held by another, record changed
      less than leaseDuration ago         -> follower (the time is *our* clock's, from when we
                                             last saw the record change: no clock skew matters)
    free (no holder), expired, or ours    -> update at the read resourceVersion; 409 Conflict:
                                             another replica won the race, so we are not leader

The leader counts its leadership from the moment it *sent* its last successful renew: it is
leader only until that moment + ``renew_deadline`` (checked on every :attr:`is_leader`, so a
stuck loop or API server cannot extend it). Others wait ``leaseDuration`` from when they *saw*
that renew, later still; as ``renew_deadline < lease_duration`` the old leader stops acting
before anybody else can start. :meth:`LeaderElector.release` (clean shutdown) clears the holder,
so a standby replica takes over at its next step instead of after ``leaseDuration``.

:class:`ElectedLeases` adapts an elector to the services' per-object lease seam
(``sandpod_service.leases.LeaseKeeper``): a replica "holds" every object iff it is the leader.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import json
import random
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from sandpod_contract.errors import (
    ResourceConflict,
    ResourceExists,
    ResourceNotFound,
    StoreError,
)
from sandpod_contract.times import to_rfc3339
from sandpod_kube.config import KubeSettings, LeaderSettings
from sandpod_kube.errors import from_api_error

__all__ = ["ElectedLeases", "LeaderElector", "LeaderSettings", "lease_name"]

log = structlog.get_logger("sandpod.kube.leader")

KIND = "Lease"
_JITTER = 1.2  # followers retry after retry_period * [1, 1.2): two standbys rarely collide
_SERVICE_ACCOUNT_NS = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def lease_name(prefix: str, service: str) -> str:
    """The Lease of ``service`` in the installation with subject ``prefix``: a DNS-1123 name,
    ``sandpod-lifecycle`` for the default prefix."""
    base = re.sub(r"[^a-z0-9-]+", "-", f"{prefix}-{service}".lower()).strip("-")
    return base[:63].rstrip("-") or service


def _micro(ts: float) -> str:
    """A ``MicroTime`` as the API server writes it."""
    return to_rfc3339(ts, micro=True)


@dataclasses.dataclass(frozen=True, slots=True)
class _Observed:
    """The Lease as last read, and when (our monotonic clock) its record last changed."""

    resource_version: str
    spec: Mapping[str, Any]
    seen_at: float

    @property
    def holder(self) -> str:
        return str(self.spec.get("holderIdentity") or "")

    @property
    def duration(self) -> float:
        return float(self.spec.get("leaseDurationSeconds") or 0)


class LeaderElector:
    """One replica's side of the election for Lease ``namespace/name``.

    Run :meth:`run` as a supervised task; read :attr:`is_leader` before acting; call
    :meth:`release` then :meth:`close` at shutdown. ``on_change(leading)`` is called when
    leadership is won (by the loop) or lost (by the loop, or by a timer at the renew deadline,
    however stuck the loop is): a cheap, non-blocking callback (set an event).
    """

    def __init__(
        self,
        kube: KubeSettings,
        settings: LeaderSettings,
        *,
        name: str,
        identity: str,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.name = name
        self.namespace = settings.namespace or _default_namespace(kube)
        self.identity = identity
        self.settings = settings
        self._on_change = on_change
        self._client = kube.api_client()
        self._api = client.CoordinationV1Api(self._client)
        # Lease calls are serial; a second worker lets release() pass a call still in flight.
        self._pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="sandpod-lease")
        self._timeout = max(min(kube.request_timeout, settings.renew_deadline / 2), 0.5)
        self._observed: _Observed | None = None
        self._leading_until = 0.0  # monotonic; leader while now < this
        self._reported = False  # what on_change last said
        self._deadline: asyncio.TimerHandle | None = None  # reports the loss if no renew came

    @property
    def is_leader(self) -> bool:
        """Leader now: the last renew, counted from when it was sent, is within renew_deadline."""
        return time.monotonic() < self._leading_until

    @property
    def holder(self) -> str:
        """The holder as last read ('' when free or never read)."""
        return self._observed.holder if self._observed is not None else ""

    async def run(self) -> None:
        """Try to acquire, then renew, every retry period, until cancelled. Never raises for
        API trouble: a failed step is a follower step, logged."""
        try:
            while True:
                await self.step()
                period = self.settings.retry_period
                if not self.is_leader:
                    period *= random.uniform(1.0, _JITTER)  # noqa: S311  # jitter, not crypto
                await asyncio.sleep(period)
        finally:
            self._report()

    async def step(self) -> bool:
        """One acquire-or-renew attempt; whether we are leader after it."""
        sent = time.monotonic()
        try:
            won = await self._try_acquire_or_renew(sent)
        except StoreError as exc:
            log.warning("leader_step_failed", lease=self.name, error=exc.message, code=exc.code)
            won = False
        if won:
            self._leading_until = sent + self.settings.renew_deadline
            # Report the loss at the deadline even if this loop is stuck in a call by then.
            if self._deadline is not None:
                self._deadline.cancel()
            delay = max(self._leading_until - time.monotonic(), 0.0) + 0.001
            self._deadline = asyncio.get_running_loop().call_later(delay, self._report)
        self._report()
        return self.is_leader

    async def release(self) -> None:
        """Give the Lease up (clean shutdown, after :meth:`run` is stopped) if we hold it:
        holder cleared, so a standby takes over at its next step. Best effort: on failure the
        Lease simply expires."""
        self._leading_until = 0.0
        self._report()
        for _ in range(3):
            try:
                current = await self._get()
                if current is None or current.holder != self.identity:
                    return
                spec = {
                    **current.spec,
                    "holderIdentity": None,
                    "leaseDurationSeconds": 1,
                    "renewTime": _micro(time.time()),
                }
                await self._put(spec, current.resource_version)
                log.info("leader_released", lease=self.name, identity=self.identity)
                return
            except ResourceConflict:
                continue  # a renew landed after our read: read again
            except StoreError as exc:
                log.warning("leader_release_failed", lease=self.name, error=exc.message)
                return

    async def close(self) -> None:
        """Wait for in-flight calls and close connections (idempotent)."""
        if self._deadline is not None:
            self._deadline.cancel()
        await asyncio.to_thread(self._pool.shutdown, wait=True)
        self._client.close()  # type: ignore[no-untyped-call]  # the client leaves close untyped

    # -- the protocol ---------------------------------------------------------------------------

    async def _try_acquire_or_renew(self, now_mono: float) -> bool:
        now = _micro(time.time())
        mine = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.settings.lease_duration,
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": 0,
        }
        current = await self._get()
        if current is None:
            try:
                await self._create(mine)
            except ResourceExists:
                return False  # another replica created it first
            log.info("leader_acquired", lease=self.name, identity=self.identity, transitions=0)
            return True
        holder = current.holder
        expires = current.seen_at + current.duration
        if holder and holder != self.identity and now_mono < expires:
            return False
        transitions = int(current.spec.get("leaseTransitions") or 0)
        if holder == self.identity:
            spec = {
                **mine,
                "acquireTime": current.spec.get("acquireTime") or now,
                "leaseTransitions": transitions,
            }
        else:
            spec = {**mine, "leaseTransitions": transitions + 1}
        try:
            await self._put(spec, current.resource_version)
        except ResourceConflict:
            return False  # someone else updated it since our read: they won this round
        if holder != self.identity:
            log.info(
                "leader_acquired",
                lease=self.name,
                identity=self.identity,
                previous=holder or None,
                transitions=spec["leaseTransitions"],
            )
        return True

    def _report(self) -> None:
        leading = self.is_leader
        if leading == self._reported:
            return
        self._reported = leading
        if not leading:
            log.warning("leader_lost", lease=self.name, identity=self.identity)
        if self._on_change is not None:
            self._on_change(leading)

    def _remember(self, raw: Mapping[str, Any]) -> _Observed:
        meta, spec = raw.get("metadata") or {}, raw.get("spec") or {}
        rv = str(meta.get("resourceVersion") or "")
        old = self._observed
        # The clock starts when the *record* changes, not at every read (client-go's
        # observedTime): a dead holder's record stops changing and then expires for us.
        same = old is not None and dict(old.spec) == dict(spec)
        seen_at = old.seen_at if old is not None and same else time.monotonic()
        self._observed = _Observed(rv, dict(spec), seen_at)
        return self._observed

    async def _get(self) -> _Observed | None:
        try:
            raw = await self._call(
                "get", self._api.read_namespaced_lease, self.name, self.namespace
            )
        except ResourceNotFound:
            self._observed = None
            return None
        return self._remember(raw)

    async def _create(self, spec: Mapping[str, Any]) -> None:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": KIND,
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "labels": {"app.kubernetes.io/managed-by": "sandpod"},
            },
            "spec": dict(spec),
        }
        raw = await self._call("create", self._api.create_namespaced_lease, self.namespace, body)
        self._remember(raw)

    async def _put(self, spec: Mapping[str, Any], resource_version: str) -> None:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": KIND,
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "resourceVersion": resource_version,
            },
            "spec": dict(spec),
        }
        raw = await self._call(
            "update", self._api.replace_namespaced_lease, self.name, self.namespace, body
        )
        self._remember(raw)

    async def _call(self, verb: str, fn: Callable[..., Any], *args: Any) -> dict[str, Any]:
        """One blocking call on the pool; its JSON answer, or a typed StoreError."""
        what = f"{verb} Lease {self.namespace}/{self.name}"
        call = functools.partial(fn, *args, _request_timeout=self._timeout, _preload_content=False)
        try:
            response = await asyncio.get_running_loop().run_in_executor(self._pool, call)
            raw = json.loads(response.data or b"{}")
        except ApiException as exc:
            raise from_api_error(exc.status, exc.body, what, KIND, self.name) from exc
        except (HTTPError, OSError) as exc:
            raise StoreError(f"{what}: API server unreachable: {exc}", kind=KIND) from exc
        if not isinstance(raw, dict):
            raise StoreError(f"{what}: the API server answered {type(raw).__name__}")
        return raw


def _default_namespace(kube: KubeSettings) -> str:
    """Where the Lease lives when not configured: the watched namespace, else the pod's own
    (the mounted ServiceAccount's), else ``default``."""
    if kube.namespace:
        return kube.namespace
    try:
        return _SERVICE_ACCOUNT_NS.read_text().strip() or "default"
    except OSError:
        return "default"


class ElectedLeases:
    """The per-object lease seam over an elector: every object is "held" iff we lead.

    Renewal is the elector's own loop (``renew_all`` does nothing); releasing one object keeps
    the leadership; ``release_all`` (shutdown) gives the Lease up.
    """

    def __init__(self, elector: LeaderElector) -> None:
        self.elector = elector

    async def acquire(self, key: str) -> bool:
        return self.elector.is_leader

    def holds(self, key: str) -> bool:
        return self.elector.is_leader

    def active(self) -> bool:
        return self.elector.is_leader

    async def renew_all(self) -> None:
        return None

    async def release(self, key: str) -> None:
        return None

    async def release_all(self) -> None:
        await self.elector.release()
