"""Watch latency: from a file write in the sandbox's workspace to the event at the client.

The client has a long poll (``watch.poll`` with ``wait``) parked in execd; the benchmark writes a
new file on the workspace's host path and times until the poll returns with its event. Floor =
a bare NATS request/reply round trip (to a responder in another process, as execd is) measured in
the same run + the coalescing window (execd holds events that long to merge bursts). Run with the
default window (50 ms) and with coalescing off (0).

    .venv/bin/python bench/watch_latency.py [--count 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from _platform import nats_rtt, pct, platform, summary
from sandpod import AsyncSandbox

# The smoke run's tiny sizes (tests/integration/test_bench_smoke.py): it works, nothing timed
SMOKE_ARGS = ["--count", "5"]


async def latencies(sbx: AsyncSandbox, root: Path, window: float, count: int) -> list[float]:
    area = root / f"bench-{int(window * 1000)}ms"
    area.mkdir()
    samples = []
    async with sbx.watch(str(area), coalesce=window) as w:
        for i in range(count + 10):
            poll = asyncio.create_task(w.poll(wait=10))
            await sbx.ping()  # answered after execd took the poll in: it is parked now
            t0 = time.perf_counter()
            fd = os.open(area / f"f{i}", os.O_CREAT | os.O_WRONLY, 0o644)
            os.close(fd)
            batch = await poll
            elapsed = time.perf_counter() - t0
            assert batch.events and batch.events[0].path.endswith(f"/f{i}"), batch
            if i >= 10:  # warm-up done
                samples.append(elapsed)
    return samples


async def main(count: int) -> None:
    # the workspace's host path, chosen here: replies name it /workspace (no host path leaves execd)
    with tempfile.TemporaryDirectory() as ws, platform("bench", SANDPOD_WORKSPACE=ws) as (url, _):
        rtt = await nats_rtt(url, 1000)
        async with await AsyncSandbox.connect("bench", nats_url=url) as sbx:
            root = Path(ws)
            results = {w: await latencies(sbx, root, w, count) for w in (0.05, 0.0)}
    rtt50 = pct(rtt, 50)
    print(summary("NATS request/reply RTT (floor part)", rtt))
    for window, samples in results.items():
        floor = rtt50 + window
        print(summary(f"write -> event, coalesce {window * 1000:.0f} ms", samples))
        print(
            f"{'':38} floor {floor * 1000:.3f} ms (RTT p50 + window)  "
            f"ratio p50 {pct(samples, 50) / floor:.2f}x  "
            f"over floor p50 {(pct(samples, 50) - floor) * 1000:.3f} ms  "
            f"stdev {statistics.pstdev(samples) * 1000:.3f} ms"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200)
    asyncio.run(main(parser.parse_args().count))
