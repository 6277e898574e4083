"""How many idle local-runtime jails fit, and what each costs (needs root).

Creates N jails one after another with the local runtime driver and prints: create latency
(p50/p99), per-sandbox memory three ways (the sandbox's cgroup charge: its processes, kernel
objects and page cache; the PSS of its holder processes; the host's MemAvailable drop / N),
then destroy latency. ``--compare-disk-quota`` also creates as many jails without a disk quota,
interleaved with the others in the same run, and prints the create p50 the quota costs (the
issue's target: at most +20 ms). With ``--execd``, one execd serves all N sandboxes (one jail
file each) and its RSS share is added; the exec round trip with all N alive is printed next to
the same exec on a process-runtime execd measured in the same run (the floor).

    sudo .venv/bin/python bench/sandbox_density.py [--count 50|200] [--execd] [--calls 200]
        [--compare-disk-quota]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

from _platform import pct, platform, summary
from sandpod import AsyncSandbox
from sandpod_lifecycle.runtime.base import InstanceSpec, InstanceStatus, Resources
from sandpod_lifecycle.runtime.local import LocalRuntime, LocalRuntimeConfig

# The smoke run's tiny sizes (tests/integration/test_bench_smoke.py): it works, nothing timed;
# every optional part on, so none of them rots
SMOKE_ARGS = ["--count", "2", "--calls", "10", "--execd", "--compare-disk-quota"]

MiB = 1024 * 1024
PARENT = f"sandpod-bench-{uuid.uuid4().hex[:6]}"


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable")


def holder_pss(status: InstanceStatus) -> int:
    """PSS of every process in the sandbox's cgroups (unshare, holder sh, its sleep)."""
    pids = set()
    for d in status.cgroups:
        for procs in Path(d).rglob("cgroup.procs"):
            pids |= {int(p) for p in procs.read_text().split()}
    total = 0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            total += psutil.Process(pid).memory_full_info().pss
    return total


def cgroup_charge(status: InstanceStatus) -> int:
    for d in status.cgroups:
        for name in ("memory.usage_in_bytes", "memory.current"):
            f = Path(d, name)
            if f.exists():
                return int(f.read_text())
    return 0


async def exec_samples(url: str, sandbox_id: str, calls: int) -> list[float]:
    async with await AsyncSandbox.connect(sandbox_id, nats_url=url) as sbx:
        for _ in range(20):
            await sbx.exec(["true"])
        samples = []
        for _ in range(calls):
            t0 = time.perf_counter()
            await sbx.exec(["true"])
            samples.append(time.perf_counter() - t0)
        return samples


def mb(n: float) -> str:
    return f"{n / MiB:8.2f} MiB"


def report_memory(statuses: list[InstanceStatus], creates: list[float], avail_drop: int) -> float:
    """Print create latency and memory; return the mean cgroup charge per sandbox."""
    charge = [cgroup_charge(s) for s in statuses]
    pss = [holder_pss(s) for s in statuses]
    n = len(statuses)
    print(f"{n} idle jails on {os.cpu_count()} CPUs")
    print(summary("create (holder ready)", creates))
    print(
        f"{'cgroup charge per sandbox':38} mean {mb(statistics.fmean(charge))}  "
        f"p99 {mb(pct(charge, 99))}  total {mb(sum(charge))}"
    )
    print(
        f"{'holder processes PSS per sandbox':38} mean {mb(statistics.fmean(pss))}  "
        f"total {mb(sum(pss))}"
    )
    print(
        f"{'host MemAvailable drop per sandbox':38} {mb(avail_drop / n)}  "
        f"(noisy: the host is shared)"
    )
    return statistics.fmean(charge)


async def report_exec(state: Path, ids: list[str], charge: float, calls: int) -> None:
    """One execd serving every jail: its share, and exec round trips next to the floor."""
    with platform(sandbox="floor") as (url, _):
        floor = await exec_samples(url, "floor", calls)
    jail_files = str(state / "{sandbox_id}" / "jail.json")
    env = {"SANDPOD_SANDBOX_ID": ",".join(ids), "SANDPOD_EXECD_JAIL": jail_files}
    with platform(sandbox=ids[0], **env) as (url, execd):
        jailed = await exec_samples(url, ids[-1], calls)
        rss = psutil.Process(execd.pid).memory_info().rss
    n = len(ids)
    print(f"{'execd RSS (serving all)':38} {mb(rss)}  share {mb(rss / n)}")
    print(f"{'per sandbox incl. execd share':38} {mb(charge + rss / n)}")
    print(summary("exec floor: process runtime", floor))
    print(summary(f"exec in a jail, {n} alive", jailed))
    print(f"{'ratio to floor (p50)':38} {pct(jailed, 50) / pct(floor, 50):8.2f}x")


async def cleanup(
    rt: LocalRuntime, statuses: list[InstanceStatus], state: Path, *, quiet: bool = False
) -> None:
    destroys = []
    for s in statuses:
        t0 = time.perf_counter()
        await rt.destroy(s.sandbox_id)
        destroys.append(time.perf_counter() - t0)
    for sid in await rt.list():
        await rt.destroy(sid)
    if destroys and not quiet:
        print(summary("destroy", destroys))
    plan = rt._cgroup_plan(await rt.capabilities())
    for h in {h for h in (plan.core, *plan.limits.values()) if h is not None}:
        with contextlib.suppress(FileNotFoundError):
            (h.mount / plan.parent).rmdir()
    shutil.rmtree(state, ignore_errors=True)


def baseline(state: Path) -> LocalRuntime:
    """A runtime that gives no disk quota (as on a host without loop devices)."""
    bare = LocalRuntime(LocalRuntimeConfig(state_dir=state, cgroup_parent=f"{PARENT}-b"))
    bare._disk_quota = "disabled: benchmark baseline"
    return bare


def report_disk_quota(creates: list[float], plain: list[float]) -> None:
    print(summary("create without a disk quota", plain))
    delta = (pct(creates, 50) - pct(plain, 50)) * 1000
    verdict = "OK" if delta <= 20 else "ABOVE TARGET"
    print(f"{'disk quota cost, create p50':38} {delta:+8.2f} ms  (target <= +20 ms: {verdict})")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=50)
    ap.add_argument("--execd", action="store_true", help="serve all jails from one execd")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument(
        "--compare-disk-quota",
        action="store_true",
        help="also create jails without disk quota, print the difference",
    )
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("the local runtime needs root")
    state = Path(tempfile.mkdtemp(prefix="sandpod-density-", dir="/var/tmp"))
    rt = LocalRuntime(LocalRuntimeConfig(state_dir=state, cgroup_parent=PARENT))
    caps = await rt.capabilities()
    if caps.problems:
        sys.exit(f"this host cannot jail: {caps.problems}")
    ids = [f"d-{i:04d}" for i in range(args.count)]
    statuses: list[InstanceStatus] = []
    creates: list[float] = []
    bare = baseline(state / "bare") if args.compare_disk_quota else None
    bare_statuses: list[InstanceStatus] = []
    plain: list[float] = []
    avail_before = mem_available()
    try:
        for sid in ids:
            spec = InstanceSpec(sandbox_id=sid, resources=Resources(memory_bytes=256 * MiB))
            t0 = time.perf_counter()
            statuses.append(await rt.create(spec))
            creates.append(time.perf_counter() - t0)
            if bare is not None:  # interleaved: both see the same host load
                spec = dataclasses.replace(spec, sandbox_id=f"b{sid}")
                t0 = time.perf_counter()
                bare_statuses.append(await bare.create(spec))
                plain.append(time.perf_counter() - t0)
        if bare is not None:
            await cleanup(bare, bare_statuses, state / "bare", quiet=True)
        charge = report_memory(statuses, creates, avail_before - mem_available())
        if bare is not None:
            report_disk_quota(creates, plain)
        if args.execd:
            await report_exec(state, ids, charge, args.calls)
    finally:
        await cleanup(rt, statuses, state)


if __name__ == "__main__":
    asyncio.run(main())
