"""Warm-pool claims in Kubernetes mode: the store is a real kube-apiserver + etcd.

``claim_latency.py`` measures claims on the embedded KV store; this is the same question with
the CRDs as the store, the case agent-sandbox publishes numbers for (warm claim p50 ~92 ms at
45 claims/s). Everything is started here, on loopback:

    etcd + kube-apiserver (tests/k8s/envtest.py: the binaries deploy/envtest/build.sh builds;
        etcd runs with --unsafe-no-fsync, as in the tests -- a real etcd's fsync adds to writes)
    nats-server, the lifecycle and pool services with SANDPOD_STORE=kube
    runtime ``process``: each sandbox is one execd process on this host. A warm claim starts
        no instance, so the claim path is the store's writes (SandboxClaim create, the member's
        bind, statuses) and NATS; the process runtime keeps the pool's refill from competing
        with the measured claims for the 2 cores the way Pods + a fake kubelet would. Refill
        still starts one Python execd per claimed member (~1 s of CPU here, on other nodes in
        a cluster), so the pool's refill delay is raised (``--refill-delay``, 8 s): refill runs
        between measured batches, not during them.

1. Floors, measured in this run: one API-server write round trip (create of a small object
   through KubeStore), one bare NATS request/reply, one exec round trip on a held sandbox.
2. Latency: a pool of ``--pool`` (50); ``--claims`` claims one at a time, in batches of
   ``--batch`` with the pool full before each batch: SDK call until bound and ready, and until
   the first exec succeeds. p50/p99 and the ratio to the floors.
3. Throughput: at each concurrency in ``--concurrency`` (1,4,8,16), ``--per-level`` claims
   (fewer than the pool, so all can be warm) by that many concurrent clients, each claim
   followed by its first exec: claims/s, latency p50/p99, warm/cold split. The pool is full
   again before each level.

    .venv/bin/python bench/kube_claims.py [--claims 50] [--concurrency 1,4,8,16]

With ``--real-node`` the same questions are asked of real Pods: the whole node of
tests/k8s/realnode.py (kubelet, containerd, runc, CNI; ``make cluster-images`` first), runtime
``kubernetes``, every pool member a Pod running execd in the project's images. It adds two
measurements: cold ``Sandbox -> Pod Running -> first exec`` (``--cold``, one at a time, next to
the floor of a bare pause Pod reaching Running in the same run) and the memory of the idle pool
(the Pods' cgroups: sandboxes per node is that divided into this machine's memory).

    .venv/bin/python bench/kube_claims.py --real-node [--pool 50] [--cold 10]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


from _platform import NATS_BIN, _wait_port, free_port, nats_rtt, pct, summary
from claim_latency import answering, gone
from k8s.cluster import cluster_setup
from k8s.envtest import REPO, ControlPlane, crd_manifests, missing_binaries
from k8s.realnode import RealNode, image
from sandpod import AsyncPools, AsyncSandbox
from sandpod_bus import Bus, BusSettings
from sandpod_contract.pooling import POOL_LABEL
from sandpod_kube import KubeStore, apply_crds
from sandpod_pool.members import MemberState, member_state
from sandpod_store import ObjectMeta, Resource

# The smoke run's tiny sizes (tests/integration/test_bench_smoke.py): it works, nothing timed
SMOKE_ARGS = [
    "--pool",
    "3",
    "--claims",
    "3",
    "--per-level",
    "3",
    "--batch",
    "2",
    "--refill-delay",
    "0.5",
    "--concurrency",
    "1,2",
]

AGENT_SANDBOX_P50 = 0.092  # seconds, agent-sandbox's published warm claim p50
AGENT_SANDBOX_RATE = 45.0  # claims/s it was measured at
NS = "default"


async def until_warm(store: KubeStore, n: int, timeout: float = 600) -> float:
    """Seconds until pool ``kc`` has ``n`` claimable members, counted from the Sandboxes
    themselves (the pool's status lags: it is written by the refill pass, delayed here)."""
    t0 = time.perf_counter()
    while True:
        items, _ = await store.list("Sandbox", NS, f"{POOL_LABEL}=kc")
        if sum(member_state(o) is MemberState.READY for o in items) >= n:
            return time.perf_counter() - t0
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError(f"pool kc: not {n} warm members after {timeout}s")
        await asyncio.sleep(0.05)


def start_plane(workdir: Path) -> ControlPlane:
    if problem := missing_binaries():
        raise SystemExit(problem)
    plane = ControlPlane(workdir, (free_port(), free_port(), free_port()))
    plane.start()
    apply_crds(plane.settings, crd_manifests())
    return plane


async def real_node_cold(plane: ControlPlane, url: str, n: int) -> None:
    """Cold creates on the real node: a bare pause Pod to Running (the kubelet + containerd
    floor), then Sandbox -> Pod Running -> first exec, one at a time."""
    from kubernetes import client

    floor: list[float] = []
    with plane.settings.api_client() as api:
        core = client.CoreV1Api(api)
        for i in range(n):
            name = f"floor-pause-{i}"
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name},
                "spec": {"containers": [{"name": "p", "image": image("sandpod-pause")}]},
            }
            t0 = time.perf_counter()
            await asyncio.to_thread(core.create_namespaced_pod, NS, pod)  # type: ignore[arg-type]
            while True:
                raw = await asyncio.to_thread(core.read_namespaced_pod, name, NS)
                if raw.to_dict()["status"]["phase"] == "Running":
                    break
                await asyncio.sleep(0.02)
            floor.append(time.perf_counter() - t0)
            await asyncio.to_thread(core.delete_namespaced_pod, name, NS, grace_period_seconds=0)
    cold: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        sbx = await AsyncSandbox.create(wait=300, nats_url=url)
        await sbx.exec("true")
        cold.append(time.perf_counter() - t0)
        await sbx.kill()
        await sbx.close()
    print(summary("floor: a bare pause Pod -> Running", floor))
    print(summary("cold: Sandbox -> Pod Running -> first exec", cold))
    print(f"  -> cold p50 = {pct(cold, 50) / pct(floor, 50):.2f}x the bare Pod\n")


async def small_template(store: KubeStore, args: argparse.Namespace) -> str:
    """The pool's template on a real node: the default one asks for half a core, so 4 Pods."""
    await store.create(
        Resource(
            api_version="sandpod.dev/v1alpha1",
            kind="SandboxTemplate",
            metadata=ObjectMeta(name="kc-small", namespace=NS),
            spec={"resources": {"cpu": args.pod_cpu, "memory": args.pod_memory}},
        )
    )
    print(f"pool members: template kc-small, {args.pod_cpu} CPU, {args.pod_memory} each")
    return "kc-small"


def idle_memory(node: RealNode, pods: int) -> str:
    """The idle pool's memory: what its Pods' cgroups hold (cgroup v1 memory controller)."""
    root = Path("/sys/fs/cgroup/memory") / node.cgroup_root.lstrip("/") / "kubepods"
    used = sum(
        int((d / "memory.usage_in_bytes").read_text())
        for d in root.rglob("pod*")
        if d.is_dir() and d.name.startswith("pod") and (d / "memory.usage_in_bytes").exists()
    )
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    each = used / max(pods, 1)
    return (
        f"idle pool: {pods} Pods hold {used / 2**20:.0f} MiB ({each / 2**20:.1f} MiB each, page "
        f"cache included): {total / each:.0f} such sandboxes would fit in this machine's "
        f"{total / 2**30:.0f} GiB by memory alone\n"
    )


async def write_floor(plane: ControlPlane, n: int) -> list[float]:
    """Round trips of one write to the API server: create a small SandboxTemplate."""
    store = await KubeStore.connect(plane.settings)
    samples = []
    try:
        for i in range(n + 10):
            obj = Resource(
                api_version="sandpod.dev/v1alpha1",
                kind="SandboxTemplate",
                metadata=ObjectMeta(name=f"floor-{i}", namespace=NS),
                spec={"image": "python:3.12-slim"},
            )
            t0 = time.perf_counter()
            await store.create(obj)
            if i >= 10:
                samples.append(time.perf_counter() - t0)
        for i in range(n + 10):
            await store.delete("SandboxTemplate", NS, f"floor-{i}")
    finally:
        await store.close()
    return samples


async def latency(
    bus: Bus, store: KubeStore, size: int, claims: int, batch: int
) -> dict[str, list[float]]:
    held = await AsyncSandbox.claim("kc", bus=bus, timeout=3600)
    floor = []
    for i in range(claims + 20):
        t0 = time.perf_counter()
        await held.exec(["true"])
        if i >= 20:
            floor.append(time.perf_counter() - t0)
    bind, usable = [], []
    for start in range(0, claims, batch):
        # A batch of claims one at a time, the pool full before it; refill (a new execd per
        # claimed member) waits for the refill delay, so it does not overlap the batch.
        await until_warm(store, size - 1)  # one member is `held`
        taken = []
        for _ in range(min(batch, claims - start)):
            t0 = time.perf_counter()
            sbx = await AsyncSandbox.claim("kc", bus=bus, timeout=3600)
            t1 = time.perf_counter()
            r = await sbx.exec(["true"])
            t2 = time.perf_counter()
            assert r.exit_code == 0 and sbx.claim_info is not None and sbx.claim_info.warm
            bind.append(t1 - t0)
            usable.append(t2 - t0)
            taken.append(sbx)
        await asyncio.gather(*(s.release() for s in taken))
        await asyncio.gather(*(gone(s, 600) for s in taken))
    await held.release()
    return {"exec": floor, "bind": bind, "usable": usable}


async def level(bus: Bus, store: KubeStore, size: int, concurrency: int, count: int) -> str:
    await until_warm(store, size)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(count):
        queue.put_nowait(i)
    held: list[AsyncSandbox] = []
    samples: list[float] = []
    failures: list[str] = []

    async def client() -> None:
        while True:
            try:
                queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            t0 = time.perf_counter()
            try:
                sbx = await AsyncSandbox.claim("kc", bus=bus, timeout=3600, wait=120)
                await sbx.exec(["true"])
            except Exception as exc:  # counted and shown, the run goes on
                failures.append(str(exc)[:100])
                continue
            samples.append(time.perf_counter() - t0)
            held.append(sbx)

    t0 = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for _ in range(concurrency):
            tg.create_task(client())
    took = time.perf_counter() - t0
    reasons = collections.Counter(s.claim_info.bound_reason for s in held if s.claim_info)
    await asyncio.gather(*(s.release() for s in held), return_exceptions=True)
    await asyncio.gather(*(gone(s, 600) for s in held))  # no teardown overlaps the next level
    line = (
        f"concurrency {concurrency:3}: {len(samples) / took:6.1f} claims/s  "
        f"p50 {pct(samples, 50) * 1000:7.1f} ms  p99 {pct(samples, 99) * 1000:7.1f} ms  "
        f"({len(samples)} in {took:.2f} s; {dict(reasons)}; failures {len(failures)})"
    )
    if failures:
        line += f" {failures[:2]}"
    return line


async def run(
    args: argparse.Namespace, plane: ControlPlane, tmp: str, node: RealNode | None = None
) -> None:
    port = free_port()
    host = node.net.host_ip if node is not None and node.net is not None else "127.0.0.1"
    url = f"nats://{host}:{port}"
    nats = subprocess.Popen(
        [str(NATS_BIN), "-a", host, "-p", str(port), "-js", "-sd", tmp],
        stderr=subprocess.DEVNULL,
    )
    _wait_port(port, host)
    cert, key = plane.admin_cert
    env = {
        **os.environ,
        "SANDPOD_NATS_URL": url,
        "SANDPOD_STATE_DIR": tmp,
        "SANDPOD_LOG_LEVEL": "warning",
        "SANDPOD_RUNTIME": "process",
        "SANDPOD_DESTROY_ON_EXIT": "true",
        "SANDPOD_STORE": "kube",
        "SANDPOD_KUBE_SERVER": plane.url,
        "SANDPOD_KUBE_CA_FILE": str(plane.ca_file),
        "SANDPOD_KUBE_CLIENT_CERT": str(cert),
        "SANDPOD_KUBE_CLIENT_KEY": str(key),
        "SANDPOD_KUBE_NAMESPACE": NS,
        # refill after a batch, not during it (see the module docstring)
        "SANDPOD_POOL_REFILL_DELAY": str(args.refill_delay),
        "SANDPOD_POOL_RESYNC": "60",
    }
    if node is not None:  # real Pods (see the module docstring)
        await asyncio.to_thread(cluster_setup, plane.settings, url)
        env |= {
            "SANDPOD_RUNTIME": "kubernetes",
            "SANDPOD_POD_EXECD_IMAGE": image("sandpod-execd"),
            "SANDPOD_POD_DEFAULT_IMAGE": image("sandpod-base"),
            "SANDPOD_READY_TIMEOUT": "300",
        }
    procs = [
        subprocess.Popen([sys.executable, "-m", m], env=env, stderr=subprocess.DEVNULL)
        for m in ("sandpod_lifecycle", "sandpod_pool")
    ]
    bus = await Bus.connect(BusSettings(url=url))
    pools = await AsyncPools.connect(bus=bus)
    store = await KubeStore.connect(plane.settings)
    try:
        await answering(pools.list)
        await answering(lambda: AsyncSandbox.list(nats_url=url))
        runtime = (
            "kubernetes on a real node (kubelet + containerd + runc: every member a Pod)"
            if node is not None
            else "process (warm claims start no instance: the claim path is store writes + NATS)"
        )
        print(
            "store: kube (real kube-apiserver + etcd, --unsafe-no-fsync); runtime: "
            f"{runtime}; pool refill delay {args.refill_delay:g} s (no refill during a batch)"
        )
        if node is not None:
            await real_node_cold(plane, url, args.cold)
        writes = await write_floor(plane, 100)
        rtt = await nats_rtt(url, 500)
        template = await small_template(store, args) if node is not None else None
        await pools.create("kc", template=template, replicas=args.pool)
        fill = await until_warm(store, args.pool)
        print(f"pool of {args.pool} filled in {fill:.2f} s (from empty)\n")
        if node is not None:
            print(idle_memory(node, args.pool))
        lat = await latency(bus, store, args.pool, args.claims, args.batch)
        print(summary("floor: API-server write (create)", writes))
        print(summary("floor: bare NATS request/reply", rtt))
        print(summary("floor: exec round trip (held sandbox)", lat["exec"]))
        print(summary("claim (bound and ready)", lat["bind"]))
        print(summary("claim + first exec (usable)", lat["usable"]))
        p50 = pct(lat["usable"], 50)
        print(
            f"  -> usable p50 = {p50 / pct(writes, 50):.1f}x one API write, "
            f"{p50 / pct(lat['exec'], 50):.1f}x one exec; agent-sandbox's published warm "
            f"claim p50 {AGENT_SANDBOX_P50 * 1000:.0f} ms is {AGENT_SANDBOX_P50 / p50:.1f}x "
            f"this\n"
        )
        print(
            f"throughput: {args.per_level} claims (+ first exec) per level, pool of "
            f"{args.pool}; agent-sandbox: {AGENT_SANDBOX_RATE:.0f} claims/s at "
            f"p50 {AGENT_SANDBOX_P50 * 1000:.0f} ms"
        )
        for c in args.concurrency:
            print(await level(bus, store, args.pool, c, args.per_level))
        await pools.delete("kc")
    finally:
        await store.close()
        await bus.close()
        for p in reversed(procs):
            p.terminate()
            p.wait(120)
        nats.terminate()
        nats.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pool", type=int, default=50)
    parser.add_argument("--claims", type=int, default=50)
    parser.add_argument("--per-level", type=int, default=45)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--refill-delay", type=float, default=8.0)
    parser.add_argument(
        "--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 8, 16]
    )
    parser.add_argument("--real-node", action="store_true", help="real Pods (module docstring)")
    parser.add_argument("--cold", type=int, default=10, help="--real-node: cold creates")
    parser.add_argument("--pod-cpu", default="90m", help="--real-node: each member's CPU")
    parser.add_argument("--pod-memory", default="128Mi", help="--real-node: each member's memory")
    args = parser.parse_args()
    print(f"load before: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} cores")
    if args.real_node:
        from k8s.realnode import RealNode as Node
        from k8s.realnode import missing_parts

        images = REPO / "build" / "images"
        if problem := missing_parts(images):
            raise SystemExit(problem)
        with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
            node = Node(Path(tmp) / "node", images)
            (Path(tmp) / "node").mkdir()
            node.start(progress=True)
            try:
                assert node.plane is not None
                apply_crds(node.settings, crd_manifests())
                asyncio.run(run(args, node.plane, tmp, node))
            finally:
                node.stop()
        return
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        (Path(tmp) / "kube").mkdir()
        plane = start_plane(Path(tmp) / "kube")
        try:
            asyncio.run(run(args, plane, tmp))
        finally:
            plane.stop()


if __name__ == "__main__":
    main()
