"""Warm-pool claims: latency from the SDK call to a usable sandbox, and a burst.

1. Claim latency, pool of 20: ``AsyncSandbox.claim(pool)`` then the first ``exec(["true"])``
   succeeds, one claim at a time (the pool is full before each). The floor, measured in the same
   run, is what a usable sandbox costs at least: one exec round trip on a sandbox that is
   already held (NATS round trip + spawn). Targets (issue): claim p50 <= 10 ms, p99 <= 50 ms.
2. Burst: 200 concurrent claims against a pool of 50: warm binds, cold fallbacks by reason,
   failures (target 0), double assignments (must be 0), and the time until the pool is full
   again after the burst.

    sudo .venv/bin/python bench/claim_latency.py [--runtime local|process] [--claims 100]
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
from collections.abc import Callable
from typing import Any

from _platform import NATS_BIN, _wait_port, default_rootfs, free_port, pct, summary
from sandpod import AsyncPools, AsyncSandbox
from sandpod.errors import SandpodError
from sandpod_bus import Bus, BusSettings

# The smoke run's tiny sizes (tests/integration/test_bench_smoke.py): it works, nothing timed
SMOKE_ARGS = ["--claims", "3", "--burst", "4", "--burst-pool", "2"]


def log_file(directory: str | None, name: str) -> Any:
    """Where a service's stderr goes: ``<directory>/<name>.log``, or nowhere."""
    if directory is None:
        return subprocess.DEVNULL
    return open(f"{directory}/{name}.log", "wb")


async def answering(call: Callable[[], object]) -> None:
    while True:
        try:
            await call()  # type: ignore[misc]
            return
        except SandpodError:
            await asyncio.sleep(0.05)


async def gone(sbx: AsyncSandbox, timeout: float = 60) -> None:
    """Until the released sandbox's object is deleted (its instance torn down)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        try:
            await sbx.describe()
        except SandpodError:
            return
        await asyncio.sleep(0.02)
    raise TimeoutError(f"sandbox {sbx.id} still exists {timeout}s after its release")


async def until_available(pools: AsyncPools, name: str, n: int, timeout: float = 300) -> float:
    """Seconds until pool ``name`` has ``n`` available members."""
    t0 = time.perf_counter()
    while (await pools.get(name)).available < n:
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError(f"pool {name} not full after {timeout}s")
        await asyncio.sleep(0.02)
    return time.perf_counter() - t0


async def latency(url: str, bus: Bus, pools: AsyncPools, claims: int) -> None:
    await pools.create("lat", replicas=20)
    fill = await until_available(pools, "lat", 20)
    print(f"pool of 20 filled in {fill:.2f} s (from empty)")
    held = await AsyncSandbox.claim("lat", bus=bus, timeout=3600)
    floor = []
    for i in range(claims + 20):
        t0 = time.perf_counter()
        await held.exec(["true"])
        if i >= 20:
            floor.append(time.perf_counter() - t0)
    total, bind, first, second = [], [], [], []
    for _ in range(claims):
        await until_available(pools, "lat", 20)
        t0 = time.perf_counter()
        sbx = await AsyncSandbox.claim("lat", bus=bus, timeout=3600)
        t1 = time.perf_counter()
        r = await sbx.exec(["true"])
        t2 = time.perf_counter()
        await sbx.exec(["true"])
        second.append(time.perf_counter() - t2)
        assert r.exit_code == 0 and sbx.claim_info is not None and sbx.claim_info.warm
        total.append(t2 - t0)
        bind.append(t1 - t0)
        first.append(t2 - t1)
        await sbx.release()
        await gone(sbx)  # its teardown must not overlap the next measurement
    await held.release()
    await pools.delete("lat")
    print(summary("floor: exec round trip (held sandbox)", floor))
    print(summary("claim (bound and ready)", bind))
    print(summary("first exec after the claim", first))
    print(summary("second exec", second))
    print(summary("claim + first exec (usable)", total))
    p50, p99 = pct(total, 50), pct(total, 99)
    print(
        f"  -> p50 {p50 / pct(floor, 50):.2f}x the floor; targets p50 <= 10 ms: "
        f"{'OK' if p50 <= 0.010 else 'ABOVE'}, p99 <= 50 ms: {'OK' if p99 <= 0.050 else 'ABOVE'}"
    )


async def burst(bus: Bus, pools: AsyncPools, count: int, size: int) -> None:
    await pools.create("burst", replicas=size)
    await until_available(pools, "burst", size)
    print(f"\nburst: {count} concurrent claims against a pool of {size}")
    t0 = time.perf_counter()

    async def one() -> AsyncSandbox:
        sbx = await AsyncSandbox.claim("burst", bus=bus, timeout=3600, wait=300)
        await sbx.exec(["true"])
        return sbx

    results = await asyncio.gather(*(one() for _ in range(count)), return_exceptions=True)
    took = time.perf_counter() - t0
    ok = [r for r in results if isinstance(r, AsyncSandbox)]
    failed = [r for r in results if not isinstance(r, AsyncSandbox)]
    reasons = collections.Counter(s.claim_info.bound_reason for s in ok if s.claim_info)
    doubles = len(ok) - len({s.id for s in ok})
    refill = await until_available(pools, "burst", size)
    print(f"  all {count} answered in {took:.2f} s")
    print(
        f"  warm binds: {reasons.pop('WarmPoolBind', 0)}; cold fallbacks: "
        f"{sum(reasons.values())} {dict(reasons)}"
    )
    print(f"  failures: {len(failed)} (target 0) {[str(f)[:120] for f in failed[:3]]}")
    print(f"  double assignments: {doubles} (must be 0)")
    print(
        f"  pool full again {refill:.2f} s after the last claim answered "
        f"({took + refill:.2f} s after the burst began)"
    )
    await asyncio.gather(*(s.release() for s in ok), return_exceptions=True)
    await pools.delete("burst")


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        port = free_port()
        url = f"nats://127.0.0.1:{port}"
        nats = subprocess.Popen(
            [str(NATS_BIN), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", tmp],
            stderr=subprocess.DEVNULL,
        )
        _wait_port(port)
        env = {
            **os.environ,
            "SANDPOD_NATS_URL": url,
            "SANDPOD_STATE_DIR": tmp,
            "SANDPOD_LOG_LEVEL": "warning",
            "SANDPOD_RUNTIME": args.runtime,
            "SANDPOD_DESTROY_ON_EXIT": "true",
        }
        if args.runtime == "local":  # templates without rootfs run on the default base
            env["SANDPOD_DEFAULT_ROOTFS"] = str(default_rootfs())
        if args.logs:  # the services' info logs (claim_bound has per-step timings)
            env["SANDPOD_LOG_LEVEL"] = "info"
        procs = [
            subprocess.Popen([sys.executable, "-m", m], env=env, stderr=log_file(args.logs, m))
            for m in ("sandpod_lifecycle", "sandpod_pool")
        ]
        bus = await Bus.connect(BusSettings(url=url))
        pools = await AsyncPools.connect(bus=bus)
        try:
            await answering(pools.list)
            await answering(lambda: AsyncSandbox.list(nats_url=url))
            print(f"runtime: {args.runtime}\n")
            await latency(url, bus, pools, args.claims)
            if not args.no_burst:
                await burst(bus, pools, args.burst, args.burst_pool)
        finally:
            await bus.close()
            for p in reversed(procs):
                p.terminate()
                p.wait(60)
            nats.terminate()
            nats.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--runtime",
        choices=["local", "process"],
        default="local" if os.geteuid() == 0 else "process",
    )
    parser.add_argument("--claims", type=int, default=100)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--burst-pool", type=int, default=50)
    parser.add_argument("--no-burst", action="store_true")
    parser.add_argument("--logs", help="write the services' logs (info) into this directory")
    asyncio.run(main(parser.parse_args()))
