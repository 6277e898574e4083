"""Warm pools and claims: real pool-service and lifecycle processes, a real nats-server, real
sandboxes (the process runtime, and the local jail where a test says so)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import NatsServer
from sandpod import AsyncPools, AsyncSandbox
from sandpod.control import api_call
from sandpod.errors import ClaimTimeout, PoolNotFound, ResourceInvalid, SandboxError
from sandpod_bus import Bus, BusSettings
from sandpod_contract.messages.sandboxes import ObjectReply, ObjectRequest
from sandpod_contract.pooling import CLAIM_LABEL, HASH_LABEL, POOL_LABEL
from sandpod_store import KvStore, ObjectMeta, Resource
from svcprocs import ServiceProc, kill_instances

POOL_ENV = {"SANDPOD_POOL_RESYNC": "0.3", "SANDPOD_CLAIM_RECOVER_AFTER": "3"}
LIFECYCLE_ENV = {"SANDPOD_RESYNC": "0.5"}


class Platform:
    """Lifecycle and pool replicas on a private prefix, plus clients of the store and API."""

    def __init__(self, nats: NatsServer, state: Path) -> None:
        self.nats, self.state = nats, state
        self.prefix = f"t{uuid.uuid4().hex[:8]}"
        self.procs: list[ServiceProc] = []
        self.store: KvStore
        self.pools: AsyncPools
        self._bus: Bus | None = None

    def service(self, module: str, **extra: str) -> ServiceProc:
        replica = f"{module.removeprefix('sandpod_')}{len(self.procs)}"
        proc = ServiceProc(module, self.nats, self.state, self.prefix, replica, wrap=(), **extra)
        self.procs.append(proc)
        return proc

    async def open(self) -> None:
        self._bus = await Bus.connect(BusSettings(url=self.nats.url))
        self.store = await KvStore.open(self._bus, bucket=f"{self.prefix}-resources")
        self.pools = await AsyncPools.connect(nats_url=self.nats.url, prefix=self.prefix)

    async def close(self) -> None:
        await self.pools.close()
        if self._bus is not None:
            await self._bus.close()
        for proc in self.procs:
            proc.stop()
        kill_instances(self.state)

    async def answering(self) -> None:
        """Until the lifecycle and pool services answer their APIs (they start concurrently)."""
        async with asyncio.timeout(30):
            for call in (
                self.pools.list,
                lambda: AsyncSandbox.list(nats_url=self.nats.url, prefix=self.prefix),
            ):
                while True:
                    try:
                        await call()
                        break
                    except SandboxError:  # no responders yet: answered at once, so retry
                        await asyncio.sleep(0.05)

    async def claim(self, pool: str | None = "py", **kw: Any) -> AsyncSandbox:
        return await AsyncSandbox.claim(pool, nats_url=self.nats.url, prefix=self.prefix, **kw)

    async def until(
        self, kind: str, name: str, done: Callable[[Resource | None], bool], timeout: float = 30
    ) -> Resource | None:
        """Watch ``kind/name`` until ``done(obj)`` (None: absent); fail after ``timeout``."""
        items, revision = await self.store.list(kind, "default")
        current = next((o for o in items if o.metadata.name == name), None)
        if done(current):
            return current
        try:
            async with asyncio.timeout(timeout):
                async for event in self.store.watch(kind, "default", revision):
                    if event.name == name and done(event.resource):
                        return event.resource
        except TimeoutError:
            pass
        logs = "\n".join(f"--- {p.replica}\n{p.tail(15)}" for p in self.procs)
        pytest.fail(f"{kind} {name} never reached the state waited for; last: {current}\n{logs}")

    async def until_free_ready(self, pool: str, n: int, timeout: float = 30) -> None:
        """Watch sandboxes until ``pool`` has exactly ``n`` free, ready members in the store
        (the pool's status may lag a moment behind a claim)."""
        items, revision = await self.store.list("Sandbox", "default")
        objs = {o.metadata.name: o for o in items}

        def count() -> int:
            return sum(
                1
                for o in objs.values()
                if o.metadata.labels.get(POOL_LABEL) == pool
                and _free(o)
                and o.status.get("phase") == "Running"
            )

        if count() == n:
            return
        async with asyncio.timeout(timeout):
            async for event in self.store.watch("Sandbox", "default", revision):
                if event.resource is None:
                    objs.pop(event.name, None)
                else:
                    objs[event.name] = event.resource
                if count() == n:
                    return

    async def members(self, pool: str) -> list[Resource]:
        items, _ = await self.store.list("Sandbox", "default", f"{POOL_LABEL}={pool}")
        return items

    async def free_members(self, pool: str) -> list[Resource]:
        return [m for m in await self.members(pool) if _free(m)]


def _free(m: Resource) -> bool:
    deleting = m.metadata.annotations.get("sandpod.dev/delete-requested") == "true"
    return CLAIM_LABEL not in m.metadata.labels and not deleting


def _free_of_delete(m: Resource) -> bool:
    return m.metadata.annotations.get("sandpod.dev/delete-requested") != "true"


def available(n: int) -> Callable[[Resource | None], bool]:
    return lambda o: o is not None and o.status.get("availableReplicas") == n


@pytest.fixture
async def platform(nats: NatsServer, tmp_path: Path) -> AsyncIterator[Platform]:
    p = Platform(nats, tmp_path)
    await p.open()
    yield p
    await p.close()


@pytest.fixture
async def warm(platform: Platform) -> Platform:
    """Lifecycle (process runtime) and one pool service, with pool ``py`` of 3 ready."""
    platform.service("sandpod_lifecycle", **LIFECYCLE_ENV)
    platform.service("sandpod_pool", **POOL_ENV)
    await platform.answering()
    await platform.pools.create("py", replicas=3)
    await platform.until("SandboxWarmPool", "py", available(3))
    return platform


async def test_a_claim_binds_a_warm_sandbox_with_its_env_and_the_pool_refills(
    warm: Platform,
) -> None:
    """A claim takes a ready member (WarmPoolBind), its commands see the claim's env and
    labels, and the pool makes a new member so 3 are free again."""
    sbx = await warm.claim(env={"AGENT": "a-17"}, labels={"team": "x"}, timeout=600)
    try:
        assert sbx.claim_info is not None and sbx.claim_info.warm
        assert sbx.claim_info.bound_reason == "WarmPoolBind"
        r = await sbx.exec("echo $AGENT")
        assert r.stdout == "a-17\n"
        info = await sbx.describe()
        assert info.labels["team"] == "x" and info.labels[CLAIM_LABEL] == sbx.claim_info.name
        assert info.object["spec"]["idleTimeoutSeconds"] == 900  # the template's, not 0
        await warm.until_free_ready("py", 3)
        assert len(await warm.free_members("py")) == 3
        assert sbx.id not in {m.metadata.name for m in await warm.free_members("py")}
    finally:
        await sbx.release()
        await sbx.close()


async def test_an_exhausted_pool_falls_back_to_a_cold_create_and_says_so(
    warm: Platform,
) -> None:
    """More claims than free members: the rest are cold creates with reason PoolExhausted,
    every one usable, none shared."""
    claims = await asyncio.gather(*(warm.claim(timeout=600) for _ in range(5)))
    try:
        reasons = sorted(c.claim_info.bound_reason for c in claims if c.claim_info)
        assert reasons.count("WarmPoolBind") <= 3
        assert reasons.count("PoolExhausted") >= 2
        assert set(reasons) <= {"WarmPoolBind", "PoolExhausted"}
        assert len({c.id for c in claims}) == 5
        results = await asyncio.gather(*(c.exec(["echo", c.id]) for c in claims))
        assert [r.stdout for r in results] == [f"{c.id}\n" for c in claims]
    finally:
        for c in claims:
            await c.release()
            await c.close()


CLAIMER = """
import json, sys
from concurrent.futures import ThreadPoolExecutor
from sandpod import Sandbox
def one(_):
    s = Sandbox.claim("py", nats_url=sys.argv[1], prefix=sys.argv[2], timeout=600)
    return [s.id, s.claim_info.bound_reason, s.exec(["true"]).exit_code]
with ThreadPoolExecutor(4) as ex:
    print(json.dumps(list(ex.map(one, range(4)))))
"""


async def test_concurrent_claims_from_processes_and_replicas_never_share_a_sandbox(
    platform: Platform,
) -> None:
    """3 client processes x 4 concurrent claims against 2 pool-service replicas and a pool of
    6: 12 distinct sandboxes, every one usable, each claim names exactly one."""
    platform.service("sandpod_lifecycle", **LIFECYCLE_ENV)
    platform.service("sandpod_pool", **POOL_ENV)
    platform.service("sandpod_pool", **POOL_ENV)
    await platform.answering()
    await platform.pools.create("py", replicas=6)
    await platform.until("SandboxWarmPool", "py", available(6))
    clients = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CLAIMER,
            platform.nats.url,
            platform.prefix,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for _ in range(3)
    ]
    outs = await asyncio.gather(*(c.communicate() for c in clients))

    got = []
    for (out, err), client in zip(outs, clients, strict=True):
        assert client.returncode == 0, err.decode()
        got.extend(json.loads(out))
    ids = [g[0] for g in got]
    assert len(ids) == 12 and len(set(ids)) == 12
    assert all(code == 0 for _, _, code in got)
    assert sum(reason == "WarmPoolBind" for _, reason, _ in got) <= 6
    claims = await platform.pools.claims()
    bound = [c.sandbox for c in claims]
    assert sorted(bound, key=str) == sorted(ids)  # one claim per sandbox, one sandbox per claim
    for sandbox_id in ids:  # the store agrees: each sandbox carries exactly its claim's label
        obj = await platform.store.get("Sandbox", "default", sandbox_id)
        owner = next(c for c in claims if c.sandbox == sandbox_id)
        assert obj.metadata.labels[CLAIM_LABEL] == owner.name


async def test_refill_never_overshoots_replicas(warm: Platform) -> None:
    """Watching every store change while claims drain the pool: free members never exceed
    replicas, and the pool is full again afterwards."""
    items, revision = await warm.store.list("Sandbox", "default", f"{POOL_LABEL}=py")
    free = {m.metadata.name for m in items if _free(m)}
    peak = len(free)

    async def follow() -> None:
        nonlocal peak
        async for event in warm.store.watch("Sandbox", "default", revision):
            obj = event.resource
            if obj is None or not _free(obj) or obj.metadata.labels.get(POOL_LABEL) != "py":
                free.discard(event.name)
            else:
                free.add(event.name)
            peak = max(peak, len(free))

    watcher = asyncio.create_task(follow())
    try:
        claims = [await warm.claim(timeout=600) for _ in range(4)]
        await warm.until_free_ready("py", 3)
    finally:
        watcher.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watcher
    assert peak <= 3
    for c in claims:
        await c.release()
        await c.close()


async def test_claim_lifetime_and_release_delete_everything(warm: Platform) -> None:
    """A claim's sandbox and the claim itself go when its lifetime ends; release() does the
    same at once; the pool stays full."""
    short = await warm.claim(timeout=2)
    other = await warm.claim(timeout=600)
    assert short.claim_info is not None and other.claim_info is not None
    await warm.until("Sandbox", short.id, lambda o: o is None)
    await warm.until("SandboxClaim", short.claim_info.name, lambda o: o is None)
    await other.release()
    await warm.until("Sandbox", other.id, lambda o: o is None)
    await warm.until("SandboxClaim", other.claim_info.name, lambda o: o is None)
    await warm.until_free_ready("py", 3)
    for sbx in (short, other):
        await sbx.close()


async def test_a_claim_restarts_the_idle_clock_of_a_member_idle_in_the_pool(
    warm: Platform,
) -> None:
    """A member idle in the pool for longer than the claim's idle timeout is not expired by the
    claim (the bind is activity, though no env reaches execd); idle from then on, it expires."""
    members = await warm.free_members("py")
    probes = [
        await AsyncSandbox.connect(m.metadata.name, nats_url=warm.nats.url, prefix=warm.prefix)
        for m in members
    ]
    deadline = time.monotonic() + 30
    while min([(await p.activity()).idle for p in probes]) < 2.5:  # members older than 2 s
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    for p in probes:
        await p.close()
    t0 = time.monotonic()
    sbx = await warm.claim(idle_timeout=2, timeout=600)
    assert (await sbx.exec("true")).exit_code == 0
    await warm.until("Sandbox", sbx.id, lambda o: o is None, timeout=30)
    assert time.monotonic() - t0 >= 1.9, "expired before its idle timeout from the claim"
    await sbx.close()


async def test_deleting_a_pool_deletes_its_free_members_but_not_claimed_ones(
    warm: Platform,
) -> None:
    """pool delete: free members are deleted; a claimed member keeps working for its claim."""
    sbx = await warm.claim(timeout=600)
    await warm.pools.delete("py")
    for m in await warm.members("py"):
        if m.metadata.name != sbx.id:
            await warm.until("Sandbox", m.metadata.name, lambda o: o is None)
    assert [m.metadata.name for m in await warm.members("py")] == [sbx.id]
    assert (await sbx.exec("true")).exit_code == 0
    await sbx.release()
    await sbx.close()


async def test_a_template_change_rolls_the_pool(platform: Platform) -> None:
    """Changing the pool's template replaces its free members (RollingUpdate): a claim then
    gets the new template's environment."""
    platform.service("sandpod_lifecycle", **LIFECYCLE_ENV)
    platform.service("sandpod_pool", **POOL_ENV)
    await platform.answering()
    sbx = await AsyncSandbox.connect("default", nats_url=platform.nats.url, prefix=platform.prefix)

    async def template(value: str) -> None:
        obj = {
            "kind": "SandboxTemplate",
            "metadata": {"name": "py"},
            "spec": {"env": [{"name": "VERSION", "value": value}]},
        }
        await api_call(
            sbx.bus, sbx.subjects, "templates", "apply", ObjectRequest(object=obj), ObjectReply
        )

    await template("1")
    await platform.pools.create("py", template="py", replicas=2)
    first = await platform.until("SandboxWarmPool", "py", available(2))
    assert first is not None
    await template("2")
    rolled = await platform.until(
        "SandboxWarmPool",
        "py",
        lambda o: (
            o is not None
            and o.status.get("templateHash") != first.status["templateHash"]
            and o.status.get("availableReplicas") == 2
        ),
    )
    assert rolled is not None
    hashes = {m.metadata.labels[HASH_LABEL] for m in await platform.free_members("py")}
    assert hashes == {rolled.status["templateHash"]}
    claimed = await platform.claim(timeout=600)
    assert (await claimed.exec("echo $VERSION")).stdout == "2\n"
    await claimed.release()
    await claimed.close()
    await sbx.close()


async def test_unknown_pools_and_bad_specs_are_typed_errors(warm: Platform) -> None:
    """A claim on a missing pool is PoolNotFound; bad pool and claim specs are ResourceInvalid
    naming the field; nothing is created by them."""
    with pytest.raises(PoolNotFound):
        await warm.claim("nope")
    with pytest.raises(ResourceInvalid, match="replicas"):
        await warm.pools.create("bad", replicas=-1)
    with pytest.raises(ResourceInvalid, match="lifetimeSeconds"):
        await warm.claim(timeout=-5)
    with pytest.raises(ResourceInvalid, match="template"):
        await warm.claim(None, template="no-such-template")
    assert [c.name for c in await warm.pools.claims()] == []


async def test_a_dead_claim_handler_is_finished_and_orphans_are_removed(warm: Platform) -> None:
    """A claim written but never bound (its handler died) is bound by the reconciler; a
    sandbox labelled for a claim that does not exist is deleted."""
    meta = ObjectMeta(name="lost-claim", namespace="default")
    await warm.store.create(
        Resource(
            api_version="sandpod.dev/v1alpha1",
            kind="SandboxClaim",
            metadata=meta,
            spec={"poolRef": {"name": "py"}},
        )
    )
    claim = await warm.until(
        "SandboxClaim",
        "lost-claim",
        lambda o: (
            o is not None
            and o.status.get("phase") == "Bound"
            and any(c["type"] == "Ready" and c["status"] == "True" for c in o.status["conditions"])
        ),
    )
    assert claim is not None
    orphan = Resource(
        api_version="sandpod.dev/v1alpha1",
        kind="Sandbox",
        metadata=ObjectMeta(name="orphan-sbx", labels={CLAIM_LABEL: "ghost"}),
        spec={"permanent": False, "shutdownTime": "2099-01-01T00:00:00Z"},
    )
    await warm.store.create(orphan)
    await warm.until("Sandbox", "orphan-sbx", lambda o: o is None)
    await warm.pools.release("lost-claim")
    await warm.until("Sandbox", claim.status["sandbox"], lambda o: o is None)


async def test_pool_service_killed_mid_burst_converges(warm: Platform) -> None:
    """SIGKILL the only pool service once claims of a burst are being written, restart it:
    every claim that exists ends bound to its own sandbox, no sandbox is labelled for a missing
    claim, and the pool has exactly its 3 free members again."""
    pool_proc = next(p for p in warm.procs if p.module == "sandpod_pool")
    _, revision = await warm.store.list("SandboxClaim", "default")
    burst = [asyncio.create_task(warm.claim(timeout=600, wait=5)) for _ in range(6)]
    async with asyncio.timeout(30):
        async for _ in warm.store.watch("SandboxClaim", "default", revision):
            break  # the first claim is written: the handlers are mid-claim
    pool_proc.kill()
    pool_proc.restart()
    for r in await asyncio.gather(*burst, return_exceptions=True):
        if isinstance(r, AsyncSandbox):
            await r.close()
    await warm.answering()

    async def settled() -> bool:
        claims = await warm.pools.claims()
        sandboxes, _ = await warm.store.list("Sandbox", "default", CLAIM_LABEL)
        live = {
            s.metadata.labels[CLAIM_LABEL]: s.metadata.name for s in sandboxes if _free_of_delete(s)
        }
        bound = {c.name: c.sandbox for c in claims}
        free = await warm.free_members("py")
        return all(c.phase == "Bound" for c in claims) and live == bound and len(free) == 3

    async with asyncio.timeout(90):
        while not await settled():  # converging is many writes; each pass re-reads the store
            await asyncio.sleep(0.2)
    claims = await warm.pools.claims()
    assert len({c.sandbox for c in claims}) == len(claims)


async def test_lifecycle_killed_mid_claim_the_claim_completes(platform: Platform) -> None:
    """An empty pool makes a claim a cold create; SIGKILL the lifecycle service as the claim's
    sandbox is written, restart it: the claim still returns a ready sandbox that works."""
    lifecycle = platform.service("sandpod_lifecycle", **LIFECYCLE_ENV)
    platform.service("sandpod_pool", **POOL_ENV)
    await platform.answering()
    await platform.pools.create("py", replicas=0)
    _, revision = await platform.store.list("Sandbox", "default")
    claim = asyncio.create_task(platform.claim(timeout=600, wait=60))
    async with asyncio.timeout(30):
        async for event in platform.store.watch("Sandbox", "default", revision):
            if event.resource is not None and CLAIM_LABEL in event.resource.metadata.labels:
                break  # the cold sandbox is written; its instance is being made
    lifecycle.kill()
    lifecycle.restart()
    sbx = await claim
    try:
        assert sbx.claim_info is not None
        assert sbx.claim_info.bound_reason == "PoolExhausted"
        assert (await sbx.exec(["echo", "ok"])).stdout == "ok\n"
        sandboxes, _ = await platform.store.list("Sandbox", "default", CLAIM_LABEL)
        assert [s.metadata.name for s in sandboxes] == [sbx.id]  # nothing double-created
    finally:
        await sbx.release()
        await sbx.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="the local runtime needs root: run as root")
async def test_an_unschedulable_template_is_reported_without_churn(platform: Platform) -> None:
    """A template whose rootfs does not exist: the pool reports ReplicaFailure/MembersFailing
    with the reason; after the first 5 fail it backs off (one probe member at a time, 2 s then
    4 s apart) instead of a create/delete storm; a claim on it times out naming the reason."""
    platform.service("sandpod_lifecycle", SANDPOD_RUNTIME="local", **LIFECYCLE_ENV)
    platform.service("sandpod_pool", **POOL_ENV)
    await platform.answering()
    sbx = await AsyncSandbox.connect("default", nats_url=platform.nats.url, prefix=platform.prefix)
    obj = {
        "kind": "SandboxTemplate",
        "metadata": {"name": "broken"},
        "spec": {"rootfs": "/nonexistent/rootfs"},
    }
    await api_call(
        sbx.bus, sbx.subjects, "templates", "apply", ObjectRequest(object=obj), ObjectReply
    )
    await sbx.close()
    _, revision = await platform.store.list("Sandbox", "default")
    created: dict[str, float] = {}
    third = asyncio.Event()

    async def count() -> None:
        async for event in platform.store.watch("Sandbox", "default", revision):
            res = event.resource
            if res is not None and res.metadata.labels.get(POOL_LABEL) == "bad":
                created.setdefault(event.name, time.monotonic())
                if len(created) >= 7:
                    third.set()

    watcher = asyncio.create_task(count())
    try:
        await platform.pools.create("bad", template="broken", replicas=5)
        failing = await platform.until(
            "SandboxWarmPool",
            "bad",
            lambda o: (
                o is not None
                and any(
                    c["type"] == "ReplicaFailure" and c["status"] == "True"
                    for c in o.status.get("conditions", ())
                )
            ),
        )
        assert failing is not None
        assert len(created) <= 5  # the first fill, nothing more yet
        cond = next(c for c in failing.status["conditions"] if c["type"] == "ReplicaFailure")
        assert cond["reason"] == "MembersFailing" and "rootfs" in cond["message"]
        ready = next(c for c in failing.status["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "False"
        async with asyncio.timeout(60):
            await third.wait()
    finally:
        watcher.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watcher
    times = sorted(created.values())
    assert times[6] - times[4] >= 5.0  # probes 2 s then 4 s after failures (slowness only adds)
    with pytest.raises(ClaimTimeout, match="rootfs"):
        await platform.claim("bad", wait=3)
