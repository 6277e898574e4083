"""Snapshots, forks and hibernation of local sandboxes, through a real lifecycle and the SDK.

Printed, each next to its floor or target measured in the same run:

- the first snapshot of a workspace of ``--mib`` MiB (one large file and many small ones) in
  MB/s, next to ``tar | zstd`` of the same tree on the host (the floor: a capture must at least
  read and pack every byte);
- an incremental snapshot after changing one file (target: at most 100 ms);
- forks of that snapshot: per-fork create latency p50/p99 for n = 1, 10, 100 at once, next to
  a plain create (no snapshot) and to forks of an empty snapshot -- a fork costs the same
  whatever the workspace holds (id-mapped read-only layers, no copy);
- hibernate -> first exec after the wake, p50/p99 (files only: processes do not survive on
  this host), the memory the sandbox used before and after;
- density: the host memory and disk each hibernated sandbox keeps.

    .venv/bin/python bench/snapshots.py [--mib 1024] [--forks 1,10,100] [--rounds 10]
        [--density 20]

Needs root (the local runtime). The capture is frozen: the sandbox's processes stop for the
duration of the first snapshot's copy.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

from _platform import lifecycle
from sandpod import AsyncSandbox

SMOKE_ARGS = ["--mib", "4", "--forks", "1,2", "--rounds", "1", "--density", "1"]

MiB = 1024 * 1024


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(values: list[float]) -> str:
    return f"p50 {statistics.median(values) * 1e3:7.1f} ms  p99 {pct(values, 0.99) * 1e3:7.1f} ms"


def workspace_of(state: Path, sandbox: str) -> Path:
    """The host directory of a local sandbox's workspace (with or without a disk quota)."""
    jail = state / "jails" / sandbox
    for candidate in (jail / "disk" / "workspace", jail / "workspace"):
        if candidate.is_dir():
            return candidate
    raise SystemExit(f"no workspace directory under {jail}")


async def timed(coro: object) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = await coro  # type: ignore[misc]
    return time.perf_counter() - t0, out


async def fill(sbx: AsyncSandbox, mib: int) -> None:
    big = max(mib // 2, 1)
    small = max((mib - big) * 4, 1)  # 256 KiB each
    await sbx.exec(
        f"head -c {big * MiB} /dev/urandom > big && mkdir -p src && "
        f"for i in $(seq {small}); do head -c 262144 /dev/urandom > src/f$i; done",
        check=True,
        timeout=3600,
    )


async def snapshots(url: str, state: Path, mib: int) -> tuple[AsyncSandbox, str, str]:
    src = await AsyncSandbox.create(nats_url=url, permanent=True, wait=120)
    await fill(src, mib)
    ws = workspace_of(state, src.id)
    size = sum(p.stat().st_size for p in ws.rglob("*") if p.is_file())
    t0 = time.perf_counter()
    subprocess.run(f"tar -C {ws} -cf - . | zstd -3 -T0 -q -c > /dev/null", shell=True, check=True)
    floor = time.perf_counter() - t0
    took, first = await timed(src.snapshot())
    await src.exec("date > src/f1", check=True)
    inc, second = await timed(src.snapshot())
    print(f"workspace: {size / MiB:.0f} MiB ({mib // 2} MiB file + 256 KiB files)")
    print(f"  tar | zstd -3 on the host     {size / floor / 1e6:8.0f} MB/s  (floor)")
    print(
        f"  first snapshot                {size / took / 1e6:8.0f} MB/s  ratio "
        f"{floor / took:.2f}x  ({first.size_bytes / MiB:.0f} MiB stored)"  # type: ignore[attr-defined]
    )
    print(
        f"  snapshot after one change     {inc * 1e3:8.1f} ms    target <= 100 ms  "
        f"({second.size_bytes} bytes stored)"  # type: ignore[attr-defined]
    )
    empty_src = await AsyncSandbox.create(nats_url=url, permanent=True, wait=120)
    empty = await empty_src.snapshot()
    await empty_src.kill()
    await empty_src.close()
    return src, second.name, empty.name  # type: ignore[attr-defined]


async def forks(url: str, snap: str, empty: str, counts: list[int]) -> None:
    async def make(snapshot: str | None) -> float:
        t0 = time.perf_counter()
        sbx = await AsyncSandbox.create(nats_url=url, snapshot=snapshot, wait=600)
        took = time.perf_counter() - t0
        made.append(sbx)
        return took

    print("forks (per-fork create latency, all n at once):")
    for n in counts:
        for label, snapshot in (("plain create", None), ("fork, empty", empty), ("fork", snap)):
            made: list[AsyncSandbox] = []
            times = await asyncio.gather(*(make(snapshot) for _ in range(n)))
            print(f"  n={n:<4} {label:14} {ms(list(times))}")
            await asyncio.gather(*(s.kill() for s in made))
            await asyncio.gather(*(s.close() for s in made))


async def hibernated(sbx: AsyncSandbox) -> None:
    """Return once ``sbx`` is Hibernated (its ``hibernated`` event, or already so)."""

    async def event() -> None:
        async for e in sbx.events():
            if e.type == "hibernated":
                return

    waiting = asyncio.ensure_future(event())
    try:
        # the event, or a look every 5 s (one that fired before the subscription is missed)
        while (await sbx.describe()).phase != "Hibernated":
            done, _ = await asyncio.wait({waiting}, timeout=5)
            if done:
                return
    finally:
        waiting.cancel()


async def hibernation(url: str, rounds: int) -> None:
    sbx = await AsyncSandbox.create(nats_url=url, idle_timeout=1, idle_policy="Hibernate")
    await sbx.exec("head -c 50000000 /dev/zero > /dev/shm/m; echo x > f", check=True)
    before = (await sbx.metrics()).memory_rss
    wakes: list[float] = []
    for _ in range(rounds):
        await hibernated(sbx)
        t0 = time.perf_counter()
        await sbx.exec("cat f", check=True)
        wakes.append(time.perf_counter() - t0)
    after = (await sbx.metrics()).memory_rss
    print("hibernate -> first exec (files only; processes do not survive here):")
    print(f"  wake + exec                   {ms(wakes)}  ({rounds} rounds)")
    print(
        f"  memory before hibernating {before / MiB:.1f} MiB (50 MB in /dev/shm); while "
        f"hibernated 0 (no instance); after the wake {after / MiB:.1f} MiB"
    )
    await sbx.kill()
    await sbx.close()


async def density(url: str, state: Path, n: int) -> None:
    used0 = psutil.virtual_memory().used
    disk0 = _du(state / "snapshots") + _du(state / "jetstream")
    made = [
        await AsyncSandbox.create(nats_url=url, idle_timeout=1, idle_policy="Hibernate")
        for _ in range(n)
    ]
    for s in made:  # content of its own: identical layers would be stored once
        await s.exec(f"echo {s.id} > f && head -c 65536 /dev/urandom > r", check=True)
    await asyncio.gather(*(hibernated(s) for s in made))
    mem = (psutil.virtual_memory().used - used0) / n
    disk = (_du(state / "snapshots") + _du(state / "jetstream") - disk0) / n
    free = os.statvfs(state).f_bavail * os.statvfs(state).f_frsize
    print(f"density ({n} hibernated sandboxes):")
    print(f"  host memory per hibernated sandbox  {mem / MiB:8.2f} MiB (host-wide delta: noisy)")
    print(f"  jail holders left                   {sum(_holders(s.id) for s in made)}")
    print(f"  disk per hibernated sandbox         {disk / 1024:8.1f} KiB (64 KiB of its own)")
    print(f"  -> {free / max(disk, 1):,.0f} fit in this disk's free space (bounded by disk)")
    for s in made:
        await s.kill()
        await s.close()


def _holders(sandbox_id: str) -> int:
    return sum(
        1
        for p in psutil.process_iter(["cmdline"])
        if "sandpod-holder" in (p.info["cmdline"] or []) and sandbox_id in p.info["cmdline"]
    )


def _du(root: Path) -> int:
    """Bytes allocated below ``root`` (entries removed meanwhile are skipped)."""
    total = 0
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        state = Path(tmp)
        async with lifecycle(state) as url:
            src, snap, empty = await snapshots(url, state, args.mib)
            await forks(url, snap, empty, [int(x) for x in args.forks.split(",")])
            await src.kill()
            await src.close()
            await hibernation(url, args.rounds)
            await density(url, state, args.density)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--forks", default="1,10,100")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--density", type=int, default=20)
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
