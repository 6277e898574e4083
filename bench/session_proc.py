"""Sessions and background processes next to their floors, measured in the same run.

- ``session.run`` of ``/bin/true`` vs one-shot ``exec(["true"])`` (NATS round trip + spawn);
- 8 sessions in parallel vs one session doing the same work in series;
- a background process's output drained with nobody reading vs a local pipe;
- ``proc.logs`` reading the kept log back, and ``follow()`` of a live producer.

    .venv/bin/python bench/session_proc.py [--calls 300]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import time
from collections.abc import Awaitable, Callable

from _platform import pct, platform, summary
from sandpod import AsyncSandbox

# The smoke run's tiny sizes (tests/integration/test_bench_smoke.py): it works, nothing timed
SMOKE_ARGS = ["--calls", "10"]

MiB = 2**20


async def timed(call: Callable[[], Awaitable[object]], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - t0)
    return samples


async def latency(sbx: AsyncSandbox, calls: int) -> None:
    await timed(lambda: sbx.exec(["true"]), 50)
    floor = await timed(lambda: sbx.exec(["true"]), calls)
    sh = await sbx.sessions.create("bench")
    await timed(lambda: sh.run("/bin/true"), 50)
    spawn = await timed(lambda: sh.run("/bin/true"), calls)
    builtin = await timed(lambda: sh.run("true"), calls)
    print(summary("floor: exec(['true'])", floor))
    print(summary("session.run('/bin/true')", spawn))
    print(summary("session.run('true')  (bash builtin)", builtin))
    print(f"  -> session/exec p50 {pct(spawn, 50) / pct(floor, 50):.2f}x\n")
    shells = [await sbx.sessions.create(f"par-{i}") for i in range(8)]
    t0 = time.perf_counter()
    await asyncio.gather(*(s.run("for i in $(seq 50); do /bin/true; done") for s in shells))
    parallel = time.perf_counter() - t0
    t0 = time.perf_counter()
    await shells[0].run("for i in $(seq 400); do /bin/true; done")
    serial = time.perf_counter() - t0
    print(
        f"8 sessions x 50 spawns in parallel {parallel * 1000:.0f} ms; "
        f"one session x 400 spawns {serial * 1000:.0f} ms\n"
    )
    for s in [sh, *shells]:
        await s.delete()


async def throughput(sbx: AsyncSandbox) -> None:
    size = 256 * MiB
    t0 = time.perf_counter()
    subprocess.run(["sh", "-c", f"head -c {size} /dev/zero | cat > /dev/null"], check=True)
    local = size / (time.perf_counter() - t0) / MiB
    proc = await sbx.proc.start(f"head -c {size} /dev/zero", proc_id="tp", log_limit=64 * MiB)
    t0 = time.perf_counter()
    info = await proc.wait(120)
    drain = size / (time.perf_counter() - t0) / MiB
    print(f"floor: local pipe                        {local:6.0f} MiB/s")
    print(f"background output drained, no reader     {drain:6.0f} MiB/s ({drain / local:.2f}x)")
    got, cursor, t0 = 0, info.log_start, time.perf_counter()
    while True:
        read = await proc.logs(cursor)
        got += sum(len(c.data) for c in read.chunks)
        cursor = read.next_cursor
        if read.eof:
            break
    print(
        f"proc.logs reading the kept {got // MiB} MiB       "
        f"{got / (time.perf_counter() - t0) / MiB:6.0f} MiB/s"
    )
    live = await sbx.proc.start(f"head -c {64 * MiB} /dev/zero", proc_id="tp2", log_limit=64 * MiB)
    got, t0 = 0, time.perf_counter()
    async for chunk in live.follow():
        got += len(chunk.data)
    rate = got / (time.perf_counter() - t0) / MiB
    print(f"follow() of a live 64 MiB producer       {rate:6.0f} MiB/s (missed {64 * MiB - got} B)")
    await proc.remove()
    await live.remove()


async def main(url: str, calls: int) -> None:
    async with await AsyncSandbox.connect("bench", nats_url=url) as sbx:
        await latency(sbx, calls)
        await throughput(sbx)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    with platform("bench") as (nats_url, _):
        asyncio.run(main(nats_url, parser.parse_args().calls))
