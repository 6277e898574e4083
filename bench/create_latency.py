"""Local sandbox create and fork latency, n at once, next to the floor measured in the same run.

Issue 16: on the local runtime a fork (a create from a snapshot: id-mapped read-only layers plus
a fresh writable layer) costs what a plain create costs whatever the workspace holds, and the
target is p50 <= 50 ms per fork. This bench times ``AsyncSandbox.create`` (request -> Ready
reply: the instance is up and its execd answers) for ``n`` creates started at once, for plain
creates and forks of a snapshot, ``--rounds`` times each (n < 10: as often as makes 10 samples a
round), interleaved so load hits both alike.

The floor, also n at once, is what any namespace jail costs on this host: ``unshare`` (mount,
pid, ipc, uts, net namespaces) mounting an overlay of the same base with a fresh writable layer,
then exiting. The ratio is p50 / the floor's p50 at the same n.

    .venv/bin/python bench/create_latency.py [--counts 1,10,100] [--rounds 3]

Needs root (the local runtime). Prints the load average next to the numbers: the machine may be
shared.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

from _platform import default_rootfs, lifecycle, pct
from sandpod import AsyncSandbox

SMOKE_ARGS = ["--counts", "1,2", "--rounds", "1"]


def line(label: str, n: int, samples: list[float], floor: list[float] | None) -> str:
    p50, p99 = pct(samples, 50), pct(samples, 99)
    ratio = f"  {p50 / pct(floor, 50):6.1f}x floor" if floor else ""
    return f"  n={n:<4} {label:14} p50 {p50 * 1e3:8.1f} ms  p99 {p99 * 1e3:8.1f} ms{ratio}"


async def floor_one(base: Path, scratch: Path, i: int) -> float:
    """One bare jail: unshare + an overlay mount of ``base`` with a fresh writable layer."""
    d = scratch / str(i)
    for sub in ("upper", "work", "root"):
        (d / sub).mkdir(parents=True)
    script = (
        f"mount -t overlay overlay -o lowerdir={base},upperdir={d}/upper,workdir={d}/work "
        f"{d}/root && test -d {d}/root/etc"
    )
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        "unshare", "--mount", "--pid", "--ipc", "--uts", "--net", "--fork", "sh", "-c", script
    )
    if await proc.wait() != 0:
        raise SystemExit(f"the floor's unshare + mount failed (exit {proc.returncode})")
    took = time.perf_counter() - t0
    shutil.rmtree(d)
    return took


async def floor_samples(base: Path, n: int) -> list[float]:
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        return list(await asyncio.gather(*(floor_one(base, Path(tmp), i) for i in range(n))))


async def creates(url: str, n: int, snapshot: str | None) -> list[float]:
    made: list[AsyncSandbox] = []

    async def one() -> float:
        t0 = time.perf_counter()
        sbx = await AsyncSandbox.create(nats_url=url, snapshot=snapshot, wait=600)
        took = time.perf_counter() - t0
        made.append(sbx)
        return took

    try:
        return list(await asyncio.gather(*(one() for _ in range(n))))
    finally:
        await asyncio.gather(*(s.kill() for s in made))
        await asyncio.gather(*(s.close() for s in made))


async def source_snapshot(url: str) -> str:
    """A snapshot of a sandbox with a small workspace (a fork's cost does not depend on it)."""
    src = await AsyncSandbox.create(nats_url=url, permanent=True, wait=120)
    try:
        await src.exec("mkdir -p src && for i in $(seq 20); do date > src/f$i; done", check=True)
        return (await src.snapshot()).name
    finally:
        await src.kill()
        await src.close()


async def main_async(counts: list[int], rounds: int) -> None:
    base = default_rootfs()
    results: dict[tuple[str, int], list[float]] = {}
    loads: list[float] = []
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        async with lifecycle(Path(tmp)) as url:
            snap = await source_snapshot(url)
            await creates(url, 1, None)  # warm-up: first-use probes, caches
            for _ in range(rounds):
                for n in counts:
                    for _ in range(max(1, 10 // n)):  # at least 10 samples per round
                        loads.append(os.getloadavg()[0])
                        floor = await floor_samples(base, n)
                        results.setdefault(("floor", n), []).extend(floor)
                        created = await creates(url, n, None)
                        results.setdefault(("create", n), []).extend(created)
                        forked = await creates(url, n, snap)
                        results.setdefault(("fork", n), []).extend(forked)
    print(f"local create -> Ready, n at once, {rounds} round(s); target: fork p50 <= 50 ms")
    print(f"load average (1 min) during the runs: {min(loads):.2f} .. {max(loads):.2f}")
    for n in counts:
        floor = results[("floor", n)]
        print(line("floor", n, floor, None) + "  (unshare + overlay mount)")
        print(line("plain create", n, results[("create", n)], floor))
        fork = results[("fork", n)]
        verdict = "OK" if pct(fork, 50) <= 0.05 else "ABOVE TARGET"
        print(line("fork", n, fork, floor) + f"  {verdict}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--counts", default="1,10,100")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    asyncio.run(main_async([int(x) for x in args.counts.split(",")], args.rounds))


if __name__ == "__main__":
    main()
