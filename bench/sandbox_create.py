"""Cold create -> first exec completed, through the lifecycle service (process runtime).

The floor, measured in the same run, is starting an execd process until it answers a ping (what a
cold sandbox costs when each gets its own daemon). The local runtime's node execd serves new
sandboxes without a new process, so it should sit well under it. Target (issue): p50 <= 300 ms.

    .venv/bin/python bench/sandbox_create.py [--count 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time

from _platform import NATS_BIN, _wait_port, free_port, pct, summary
from sandpod import AsyncSandbox
from sandpod.errors import SandpodError

# The smoke run's tiny sizes (tests/integration/test_bench_smoke.py): it works, nothing timed
SMOKE_ARGS = ["--count", "2"]


async def _answers(url: str, sandbox: str) -> None:
    while True:
        try:
            async with await AsyncSandbox.connect(sandbox, nats_url=url) as sbx:
                await sbx.ping(timeout=0.5)
                return
        except SandpodError:
            await asyncio.sleep(0.005)


async def floor_samples(url: str, state: str, count: int) -> list[float]:
    samples = []
    for i in range(count):
        env = {
            **os.environ,
            "SANDPOD_NATS_URL": url,
            "SANDPOD_SANDBOX_ID": f"floor-{i}",
            "SANDPOD_STATE_DIR": state,
            "SANDPOD_LOG_LEVEL": "warning",
        }
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "sandpod_execd"], env=env, stderr=subprocess.DEVNULL
        )
        await _answers(url, f"floor-{i}")
        samples.append(time.perf_counter() - t0)
        proc.terminate()
        proc.wait()
    return samples


async def create_samples(url: str, count: int) -> list[float]:
    samples = []
    for _ in range(count):
        t0 = time.perf_counter()
        sbx = await AsyncSandbox.create(nats_url=url)
        async with sbx:
            r = await sbx.exec(["true"])
            samples.append(time.perf_counter() - t0)
            assert r.exit_code == 0
            await sbx.kill()
    return samples


async def main(count: int, runtime: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
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
            "SANDPOD_RUNTIME": runtime,
            "SANDPOD_DESTROY_ON_EXIT": "true",
        }
        lc = subprocess.Popen(
            [sys.executable, "-m", "sandpod_lifecycle"], env=env, stderr=subprocess.DEVNULL
        )
        try:
            while True:
                try:
                    await AsyncSandbox.list(nats_url=url)
                    break
                except SandpodError:
                    await asyncio.sleep(0.05)
            floor = await floor_samples(url, tmp, count)
            created = await create_samples(url, count)
        finally:
            lc.terminate()
            lc.wait()
            nats.terminate()
            nats.wait()
    print(f"cold create -> first exec, {count} sandboxes one after another ({runtime} runtime)\n")
    print(summary("floor: start execd until it answers", floor))
    print(summary("sandpod create + first exec", created))
    ratio = pct(created, 50) / pct(floor, 50)
    verdict = "OK" if pct(created, 50) <= 0.3 else "ABOVE TARGET"
    print(f"  -> p50 {ratio:.2f}x the floor; target p50 <= 300 ms: {verdict}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--runtime", choices=["local", "process"], default="local")
    args = parser.parse_args()
    asyncio.run(main(args.count, args.runtime))
